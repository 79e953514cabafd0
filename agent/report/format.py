"""Figures and results as text: number formats, the evaluation's table and its lines.

Used by the commands (cli/), the outside agents' tools (outside/) and the reports alike, so that one
figure reads the same wherever it is shown.
"""

from __future__ import annotations

import io
from typing import Optional

from rich.console import Console
from rich.table import Table

from optagent.profile_facts import ProfileStatus
from optagent.ranking import timings_rank
from optagent.text import plain
from optagent.schema import (CaseKind, CaseResult, Costs, Device, EvalResult, FloorKind, Isolation, Mechanism, Status,
                             TimerKind, Timing)

STATUS_STYLE = {Status.PASSED: "green", Status.INCORRECT: "red", Status.COMPILE_ERROR: "red",
                Status.RUNTIME_ERROR: "red", Status.TIMEOUT: "yellow", Status.REJECTED: "bold red",
                Status.UNSUPPORTED: "yellow", Status.SKIPPED: "dim"}


def keep_ids_whole(t: Table, column: int, con: Console) -> None:
    """Make a (filled) id column the last to give way: whole where the table still fits the width, else
    folded onto more lines, never cut (the id is what a user types next)."""
    c = t.columns[column]
    c.overflow = "fold"
    probe = Console(file=io.StringIO(), width=con.width, color_system=None)

    def fits(width: int) -> bool:  # a min_width the other columns cannot make room for overflows the line
        c.min_width = width
        with probe.capture() as cap:
            probe.print(t, crop=False)
        return max(map(len, cap.get().splitlines()), default=0) <= con.width

    lo, hi = 1, max((len(str(x)) for x in c.cells), default=1)
    while lo < hi:  # the widest min_width that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    c.min_width = lo


def fmt(x: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def ratio(x: Optional[float]) -> str:
    """A speedup: two decimals, or two significant digits when tiny (CPU-interpreter runs)."""
    if x is None:
        return "-"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.1e}x"


def _slow(t: Optional[Timing]) -> str:
    return "*" if t is not None and t.host_slow else ""


def floor_pct(c: CaseResult) -> str:
    """'43% mem', or '~43% est.' when the bytes are estimated (no bytes_moved hook)."""
    if c.floor_kind is FloorKind.ESTIMATE and c.pct_of_floor:
        return f"~{c.pct_of_floor:.0f}% est."
    return fmt(c.pct_of_floor, ".0f", f"% {c.bound[:3]}" if c.bound else "%")


def eval_table(result: EvalResult, title: Optional[str] = None) -> Table:
    unit = "us" if result.device is Device.CUDA else "us (CPU interp.)"
    t = Table(title=title, title_justify="left")
    for col in ("case", "sizes", "status", "rel_err", f"time {unit}", "gpu us", f"baseline {unit}", "speedup",
                "% floor", "load ms"):
        t.add_column(col, justify="left" if col in ("case", "sizes", "status") else "right")
    for c in result.cases:
        t.add_row(plain(c.case, markup=True), plain(c.sizes, markup=True), f"[{STATUS_STYLE[c.status]}]{c.status.value}[/]", fmt(c.rel_err, ".1e"),
                  fmt(c.time_us) + _slow(c.time), fmt(c.gpu_us), fmt(c.baseline_us) + _slow(c.baseline),
                  fmt(c.speedup, ".2f", "x"),
                  floor_pct(c), fmt(c.load_ms, ".0f"))
    return t


def isolation_line(iso: Isolation) -> str:
    """What the operating system kept from the candidate, and its limits; 'none' stands out."""
    limits = [f"{iso.memory_gib:g} GiB memory" if iso.memory_gib else "", f"{iso.tasks} tasks" if iso.tasks else "",
              f"{iso.output_mib} MiB output" if iso.output_mib else ""]
    tail = f"; limits {', '.join(x for x in limits if x)}" if any(limits) else ""
    if iso.mechanism is Mechanism.NONE:
        return f"[bold yellow]isolation: none[/] (the candidate ran as your user, with your files and network){tail}"
    kept = [name for name, on in (("user", iso.user_ns), ("pid", iso.pid_ns), ("net", iso.no_network)) if on]
    spaces = f"{'+'.join(kept)} namespaces" if kept else "no namespaces"
    if not iso.ro_fs:  # asked for by name (--isolation unshare): it stands out as none does
        return f"[bold yellow]isolation: {iso.mechanism.value}[/] ({spaces}, writable file system){tail}"
    return f"isolation: {iso.mechanism.value} ({spaces}, read-only file system){tail}"


def cost_line(costs: Costs, wall_s: float) -> str:
    """Where the evaluation's seconds went, the parts that took any."""
    parts = [f"{name.replace('_', ' ')} {getattr(costs, name):.1f}" for name in type(costs).model_fields
             if getattr(costs, name) >= 0.05]
    return f"cost {wall_s:.1f} s: " + ", ".join(parts)


def timer_line(timer: TimerKind) -> str:
    """What took the timings; the Python timer stands out (evaluation/native_build.py)."""
    if timer is TimerKind.NATIVE:
        return "timer: native"
    return "[bold yellow]timer: python[/] (in-process; a candidate can rewrite it)"


def profile_lines(result: EvalResult) -> list[str]:
    """--profile's reading, one short line per shown case; one line for all when none was profiled alike."""
    shown = [c for c in result.cases if c.kind is not CaseKind.HIDDEN and c.profile is not None]
    out = []
    for c in shown:
        p = c.profile
        assert p is not None
        if p.status is not ProfileStatus.PROFILED:
            out.append(f"ncu case {c.case}: {p.status.value}: {p.reason}")
            continue
        floor = f", {p.floor_pct:.0f}% of floor ({c.bound})" if p.floor_pct is not None and c.bound else ""
        stalls = ", ".join(f"{s.reason} {s.share:.0%}" for s in p.stalls)
        names = ", ".join(f"{k.name} {fmt(k.duration_us)} us" for k in p.kernels[:2])
        launches = f"{p.kernel_count} launch{'es' if p.kernel_count != 1 else ''}: {names}"
        out.append(f"ncu case {c.case}: {p.bound.value + '-bound: ' if p.bound else ''}DRAM {fmt(p.dram_pct, '.0f')}% "
                   f"SM {fmt(p.sm_pct, '.0f')}% of peak{floor}; occupancy {fmt(p.occupancy_pct, '.0f')}%"
                   + (f"; stalls {stalls}" if stalls else "") + f"; {launches}")
    if len(out) > 1 and all(c.profile.status is not ProfileStatus.PROFILED for c in shown) \
            and len({(c.profile.status, c.profile.reason) for c in shown}) == 1:
        p = shown[0].profile
        return [f"ncu: {p.status.value}: {p.reason}"]
    return out


def print_eval(con: Console, result: EvalResult) -> None:
    from optagent.llm.feedback import kernel_lines

    if result.cases:
        con.print(eval_table(result))
    for line in kernel_lines(result):
        con.print(f"compiler: {plain(line, markup=False)}", markup=False, soft_wrap=True)
    for line in profile_lines(result):
        con.print(plain(line, markup=False), markup=False, soft_wrap=True)
    style = STATUS_STYLE[result.status]
    line = f"[{style}]{result.status.value}[/]"
    if result.reason:  # the candidate's own text, often: never read as markup (text.plain)
        line += f": {plain(result.reason, markup=True)}"
    gm = result.geomean_speedup
    if gm and timings_rank(results=[result]):
        line += f"  geomean speedup {gm:.2f}x"
    elif result.status.ok:  # an interpreter's speedup ranks nothing: say what the run established
        line += "  (correct on the cases run; CPU interpreter times rank nothing: `optagent retime` on a GPU ranks)"
    if result.baseline_label:
        line += f"  (baseline: {plain(result.baseline_label, markup=True)})"
    con.print(line, soft_wrap=True)
    con.print(isolation_line(result.isolation), soft_wrap=True)
    if result.costs:
        con.print(cost_line(result.costs, result.wall_s), soft_wrap=True, markup=False)
    con.print(timer_line(result.timer), soft_wrap=True)
    if any(_slow(c.time) or _slow(c.baseline) for c in result.cases):
        con.print("* eager time taken while the host ran slower than usual for most calls (see host_speed.py)")
    if result.status is not Status.PASSED and result.log_tail:
        con.print("[dim]candidate log tail:[/]")
        con.print(plain(result.log_tail, markup=False), markup=False)
