"""The best kernel of every run: GPU runs ranked per task by geomean speedup, CPU runs listed apart.

A run on the CPU (Triton's interpreter) shows that a kernel works; its "times"
are the interpreter's, tens of percent apart for the same kernel between two
runs, so CPU runs are never ranked by speed, never beside GPU runs, and never
exported where a GPU run of the same task exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.table import Table

from optagent.ranking import timings_rank
from optagent.schema import Device, EvalResult, RunConfig
from optagent.runs.store import RunStore, list_runs
from optagent.runs.files import RunError, unified_diff
from optagent.runs.tree import best_step, lineage
from optagent.report.format import fmt, keep_ids_whole


@dataclass
class Entry:
    config: RunConfig
    source: str
    starter: str
    result: EvalResult
    path: Path
    lineage: list[int] = field(default_factory=list)  # step indices from the starter to the best kernel

    @property
    def lineage_text(self) -> str:
        return ">".join(map(str, self.lineage)) or "-"

    @property
    def speedup(self) -> float:
        return self.result.geomean_speedup or 0.0

    @property
    def cpu(self) -> bool:
        """Run on the CPU: its figures say the kernel works, not how fast it is."""
        return not timings_rank(self.config.device, [self.result])

    @property
    def is_starter(self) -> bool:
        """The best kernel is the starter itself: nothing the run tried beat it."""
        return self.source.strip() == self.starter.strip()

    @property
    def kernel_note(self) -> str:
        return "starter" if self.is_starter else "changed"

    @property
    def floor_pct(self) -> Optional[float]:
        pcts = [c.pct_of_floor for c in self.result.timed if c.pct_of_floor]
        return sum(pcts) / len(pcts) if pcts else None


@dataclass
class Damaged:
    path: Path
    error: str  # one line, naming the damaged file


def gather(root: Path, task: Optional[str] = None, damaged: Optional[list[Damaged]] = None) -> list[Entry]:
    """Ranked entries; a run whose files are damaged is left out (and added to ``damaged``), not fatal."""
    entries = []
    for store in list_runs(root):
        try:
            cfg = store.config
            if task and cfg.task_name != task:
                continue
            best = store.best()
            if best is None or best[1].geomean_speedup is None:
                continue
            steps = store.steps()
            chain = [s.index for s in lineage(steps, best_step(steps))]
            entries.append(Entry(cfg, best[0], store.starter, best[1], store.path, chain))
        except RunError as e:
            if damaged is not None:
                damaged.append(Damaged(store.path, str(e)))
    # GPU runs by speed, per task; then CPU runs, per task, newest first and never by their "speed".
    gpu = sorted((e for e in entries if not e.cpu), key=lambda e: (e.config.task_name, -e.speedup))
    cpu = sorted((e for e in entries if e.cpu), key=lambda e: e.config.created_at, reverse=True)
    return gpu + sorted(cpu, key=lambda e: e.config.task_name)


def ranks(entries: list[Entry]) -> dict[str, Optional[int]]:
    """Run id -> rank among the GPU runs of its task (entries in gather's order); None for CPU runs."""
    out: dict[str, Optional[int]] = {}
    counts: dict[str, int] = {}
    for e in entries:
        if e.cpu:
            out[e.config.run_id] = None
            continue
        counts[e.config.task_name] = counts.get(e.config.task_name, 0) + 1
        out[e.config.run_id] = counts[e.config.task_name]
    return out


CPU_TITLE = "CPU interpreter (correctness only, not ranked by speed)"
CPU_NOTE = ("run on the CPU (Triton's interpreter): the kernel passed the checks; its times are the interpreter's, "
            "not GPU timings, so it was not ranked by speed")


def as_json(entries: list[Entry], damaged: Sequence[Damaged] = ()) -> list[dict]:
    """The ranked runs, then the damaged ones (every key present, null, with an error naming the file)."""
    rank = ranks(entries)
    rows = [{"run_id": e.config.run_id, "task": e.config.task_name, "device": e.config.device.value,
             "language": e.config.language.value, "planner": e.config.planner.value, "model": e.config.model,
             "rank": rank[e.config.run_id], "ranked_by_speed": not e.cpu, "best_is_starter": e.is_starter,
             "geomean_speedup": e.speedup, "mean_pct_of_floor": e.floor_pct, "lineage": e.lineage,
             "path": str(e.path), "error": None}
            for e in entries]
    blank = dict.fromkeys(("task", "device", "language", "planner", "model", "rank", "ranked_by_speed",
                           "best_is_starter", "geomean_speedup", "mean_pct_of_floor", "lineage"))
    return rows + [{"run_id": d.path.name, **blank, "path": str(d.path), "error": d.error} for d in damaged]


def _planner(e: Entry) -> str:
    return e.config.planner.value + (f"/{e.config.model}" if e.config.model else "")


def _passed(e: Entry) -> str:
    """The steps of a CPU run whose kernel passed (the starter as 0), which retime would rank."""
    try:
        steps = RunStore(e.path).steps()
    except RunError:
        return e.kernel_note
    return ", ".join(str(s.index) for s in steps if s.result is not None and s.result.status.ok) or "-"


def print_board(con: Console, entries: list[Entry], diff: bool = False) -> None:
    # No date column: the run id begins with its start time, and the id must stay whole.
    gpu, cpu, rank = [e for e in entries if not e.cpu], [e for e in entries if e.cpu], ranks(entries)
    if gpu or not cpu:
        t = Table(title="leaderboard (GPU runs, ranked per task)", title_justify="left")
        for col in ("rank", "task", "device", "geomean", "% floor", "kernel", "lineage", "planner", "lang", "run"):
            t.add_column(col, max_width=24 if col in ("planner", "lineage") else None)
        for e in gpu:
            t.add_row(str(rank[e.config.run_id]), e.config.task_name, e.result.device_name or e.config.device.value,
                      f"{e.speedup:.2f}x", fmt(e.floor_pct, ".0f", "%"), e.kernel_note, e.lineage_text, _planner(e),
                      e.config.language.value, e.config.run_id)
        keep_ids_whole(t, -1, con)
        con.print(t)
    if cpu:
        t = Table(title=CPU_TITLE, title_justify="left", caption="a CPU run shows which kernels work (passed: the "
                  "steps whose kernel passed its checks); its times are the interpreter's, not GPU timings: rank its "
                  "kernels with `optagent retime RUN` on a GPU; newest first", caption_justify="left")
        for col in ("task", "kernel", "passed", "lineage", "planner", "lang", "run"):
            t.add_column(col, max_width=24 if col in ("planner", "lineage", "passed") else None)
        for e in cpu:
            t.add_row(e.config.task_name, e.kernel_note, _passed(e), e.lineage_text, _planner(e), e.config.language.value,
                      e.config.run_id)
        keep_ids_whole(t, -1, con)
        con.print(t)
    if diff:
        for e in entries:
            con.rule(f"{e.config.run_id}  ({'CPU interpreter' if e.cpu else f'{e.speedup:.2f}x'})")
            x = e.config.language.ext
            con.print(unified_diff(e.starter, e.source, f"starter{x}", f"best{x}") or "(identical to the starter)",
                      markup=False, highlight=False)


def export(entries: list[Entry], out: Path) -> list[Path]:
    """One submit file per task, with its measurements: the fastest GPU run's best kernel, or, for a task
    with no GPU run, a CPU run's (a changed kernel before the starter, the newest first), marked as such."""
    chosen: dict[str, Entry] = {}
    for e in entries:  # gather's order: each task's GPU runs by speed, then its CPU runs
        best = chosen.get(e.config.task_name)
        if best is None or (best.cpu and e.cpu and best.is_starter and not e.is_starter):
            chosen[e.config.task_name] = e
    written = []
    for task, e in chosen.items():
        d = out / task / (Device.CPU if e.cpu else e.config.device).value
        d.mkdir(parents=True, exist_ok=True)
        kernel = d / f"submit{e.config.language.ext}"
        kernel.write_text(e.source, encoding="utf-8")
        note = {"note": CPU_NOTE} if e.cpu else {}
        (d / "result.json").write_text(json.dumps({"run_id": e.config.run_id, **note,
                                                   **e.result.model_dump(mode="json")}, indent=2))
        written.append(kernel)
    return written
