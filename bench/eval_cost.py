"""What one evaluation costs, package by package and language by language (issue 31).

    python bench/eval_cost.py [--packages decode,add_rmsnorm,silu_mul_fp8] [--langs triton,cuda]
                              [--budget S] [--widths 1,2,4] [--width-candidates N] [--json-out FILE]
                              [--combos PACKAGE:LANG[:WIDTH][@KERNEL_FILE],...]

Everything goes through the evaluation pool a run uses (evaluation/pool.py, the same sandboxed
candidate and judge processes, the lane's baselines timed once and reused), in this process, on
each package's starter kernels. Per package and language it measures, while time is left:

- two evaluations of the starter, one after the other (width 1): each one's wall time from the
  submission to its verdict and its cost split (EvalResult.costs), and the GPU-busy share of that
  wall time (nvidia-smi's utilisation, sampled every 100 ms: the share of time a kernel ran); each
  finds the spare processes the pool starts with itself and once a candidate's process has ended, as a
  run's evaluations do (one that finds none starts its process cold: a line after the row gives those apart);
- the repeatability of the two: the largest difference between their per-case medians (GPU time
  by graph replay where there is one, else the eager time), in % of the smaller;
- a re-time: the kernel and itself re-timed back to back on lane 0 (pool.retime), as a run does
  with a candidate and its incumbent;
- of the timing phase, the share the native timer's loops took by its own clock (their records' loop_s:
  warm-up and timed calls, redraws and flushes included), how many loops ran and how many were loops again
  after a slow stretch of the host: the rest of the phase is the harness's between loops (loading each
  case's module, capturing graphs, saving outputs);

A combo with @KERNEL_FILE measures that kernel instead of the starter: a run re-times a candidate against its
incumbent, which after its first gains are fast kernels, not the starter (whose own calls, 0.9 ms a decode case,
set its re-time's floor). Then, per package, candidates an hour at each width in --widths: --width-candidates
evaluations of the first language's starter submitted at once to a pool of that many jobs. Rows print as they
are measured; --budget (seconds) stops starting new work once spent (whatever runs finishes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

from optagent.app.build import build_evaluator
from optagent.costs import Costs
from optagent.evaluation import referee, verdict

try:  # a before/after call runs this bench on an older tree too (gpu_check.sh eval_cost_before)
    from optagent.evaluation.referee_loops import quantile
except ImportError:
    from optagent.evaluation.referee import quantile  # type: ignore[attr-defined, no-redef]
from optagent.evaluation.pool import LocalPool
from optagent.protocols import PoolJob
from optagent.schema import Device, EvalResult, Language
from optagent.task import load_task

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"decode": ROOT / "tasks" / "flashattn_task_package",
            "add_rmsnorm": ROOT / "tests" / "fixtures" / "packages" / "add_rmsnorm",
            "silu_mul_fp8": ROOT / "tests" / "fixtures" / "packages" / "silu_mul_fp8"}
PHASES = list(Costs.model_fields)


class GpuBusy:
    """nvidia-smi's utilisation every 100 ms, in the background; busy(t0, t1) is the mean over a window."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc: Optional[subprocess.Popen] = None
        smi = shutil.which("nvidia-smi")
        if smi:
            self.proc = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.split(",")[0])))
            except ValueError:
                continue

    def busy(self, t0: float, t1: float) -> Optional[float]:
        got = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(got) / len(got) if got else None

    def close(self) -> None:
        if self.proc:
            self.proc.terminate()


def distinct(source: str, lang: Language, k: int) -> str:
    """The source with a comment of its own at the end (a sha256 of its own; Triton compiles it afresh)."""
    return source + (f"\n// bench candidate {k}\n" if lang is Language.CUDA else f"\n# bench candidate {k}\n")


class TimerTap:
    """The native timer's loop records of the candidates' runs, as the parent checks them (verdict.py): what
    the timer's own clock says of the timing phase. A bench's tap on the parent's reading, no verdict's."""

    def __init__(self) -> None:
        self.loops: list = []
        real = verdict.parse_reports

        def tapped(lines, secret):
            records, foreign = real(lines, secret)
            self.loops += [r.record for r in records if getattr(r.record, "type", "") == "end"]
            return records, foreign
        verdict.parse_reports = tapped

    def mark(self) -> int:
        return len(self.loops)

    def since(self, mark: int) -> dict:
        ends = [e for e in self.loops[mark:] if e.kind.value != "baseline"]
        seen: dict[tuple, int] = {}
        for e in ends:
            seen[(e.case, e.kind)] = seen.get((e.case, e.kind), 0) + 1
        return {"loops_s": sum(e.loop_s for e in ends), "loops": len(ends), "calls": sum(e.calls for e in ends),
                "again": sum(n - 1 for n in seen.values())}


TAP = TimerTap()
WINDOWS: list = []  # every referee's loops as it finished, per process: (case, baseline loop?, calls us, between us)


def _tap_referees() -> None:
    real = referee.Referee.finish

    def finish(self, *a, **k):
        out = real(self, *a, **k)  # its threads joined: the log is whole
        WINDOWS.append([(lp.label, lp.baseline, [round(w, 1) for w in lp.calls_us], [round(w, 1) for w in lp.between_us])
                        for lp in self.loops])
        return out
    referee.Referee.finish = finish


def between_lines() -> list[str]:
    """Per case, the low decile of the time between timed calls by the referee's clock, in trusted (baseline) loops
    and in candidates' loops: what the moved-work check (referee.MOVED_SLACK) holds one against the other."""
    lows: dict[str, dict[bool, list[float]]] = {}
    for process in WINDOWS:
        for label, baseline, _, between in process:
            low = quantile(between, 0.1)
            if low is not None:
                lows.setdefault(label, {True: [], False: []})[baseline].append(low)
    out = []
    for label, kinds in sorted(lows.items()):
        base, cand = sorted(kinds[True]), sorted(kinds[False])
        ratio = f"{cand[0] / base[0]:.2f}-{cand[-1] / base[0]:.2f}x the least baseline's" if base and cand else ""
        out.append(f"case {label}: between calls, baselines {[round(b) for b in base]} us, candidates "
                   f"{[round(c) for c in cand]} us {ratio}")
    return out


_tap_referees()


def spares_taken(pool: LocalPool) -> int:
    """How many of the pool's spare candidate processes evaluations have taken so far (evaluation/warm_worker.py)."""
    return pool.evaluator.spares.taken if pool.evaluator.spares else 0


def case_medians(r: EvalResult) -> dict[str, float]:
    """The recorded time of each case (what the score is made of)."""
    return {c.case: c.time_us for c in r.cases if c.time_us}


def case_detail(r: EvalResult) -> list[dict]:
    """Per timed case, what its recorded time is made of: the timer's claim and band, calls left out on a slow host,
    the referee's figure, the baseline's (the JSON's record of where a repeat's spread came from)."""
    return [{"case": c.case, "time_us": c.time_us, "referee_us": c.referee_us, "baseline_us": c.baseline_us,
             **({"median_us": c.time.median_us, "p10_us": c.time.p10_us, "p90_us": c.time.p90_us,
                 "samples": c.time.samples, "slow_host_calls": c.time.slow_host_calls, "host_slow": c.time.host_slow}
                if c.time else {})} for c in r.cases if c.time_us]


def refereed(r: EvalResult) -> list[tuple]:
    """Per timed case: the timer's claim, the referee's own figure, the time recorded (evaluation/verdict.py) and
    the baseline's time (the referee's calibration: its windows less this are the harness's own share)."""
    return [(c.case, c.time.median_us, c.referee_us, c.time_us, c.baseline_us) for c in r.cases
            if c.time and c.referee_us is not None and c.time_us]


def referee_line(rows: list) -> str:
    ratios = sorted(claim / seen for _, claim, seen, *_ in rows if seen > 0)
    floored = sum(1 for _, claim, _, rec, _ in rows if rec > claim)
    return (f"claim / referee per case: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}), "
            f"{floored} of {len(rows)} recorded at the referee's floor; " + ", ".join(
                f"{c} {claim:.1f}/{seen:.1f}" for c, claim, seen, *_ in rows[:12]))


def spread_pct(a: EvalResult, b: EvalResult) -> Optional[float]:
    worst = worst_case(a, b)
    return worst[0] if worst else None


def worst_case(a: EvalResult, b: EvalResult) -> Optional[tuple[float, str, float, float]]:
    """The largest per-case difference of two evaluations' recorded times, in % of the smaller: (%, case, a, b)."""
    ma, mb = case_medians(a), case_medians(b)
    common = [k for k in ma if k in mb]
    if not common:
        return None
    return max((abs(ma[k] - mb[k]) / min(ma[k], mb[k]) * 100, k, ma[k], mb[k]) for k in common)


def spin() -> None:
    while True:  # pure Python: holds the interpreter's lock but for its switch interval
        sum(range(1000))


def stored(pool: LocalPool, source: str) -> dict:
    """The files and bytes the pool keeps of a passed source's own compiled kernels, per build folder."""
    entry = pool.evaluator.builds.root / hashlib.sha256(source.encode()).hexdigest()
    files = [f for f in entry.rglob("*") if f.is_file()] if entry.is_dir() else []
    return {d.name: [sum(1 for f in files if d in f.parents), sum(f.stat().st_size for f in files if d in f.parents)]
            for d in (entry.iterdir() if entry.is_dir() else [])}


def _f(x: Optional[float], spec: str = ".1f") -> str:
    return "-" if x is None else f"{x:{spec}}"


HEADER = (f"{'package':<13} {'lang':<6} {'status':<9} {'wall s':>7} " + " ".join(f"{p[:7]:>7}" for p in PHASES)
          + f" {'gpu%':>5} {'cand/h':>7} {'retime2':>8} {'rep%':>6}")


class Bench:
    def __init__(self, budget_s: float, device: Device, timeout_s: float):
        self.deadline = time.monotonic() + budget_s
        self.device = device
        self.timeout_s = timeout_s
        self.gpu = GpuBusy()
        self.rows: list[dict] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def pool(self, package: str, jobs: Optional[int]) -> LocalPool:
        task = load_task(PACKAGES[package])
        return LocalPool(build_evaluator(task, self.device, None, timeout_s=self.timeout_s), jobs=jobs)

    def timed(self, pool: LocalPool, jobs: list[PoolJob]) -> tuple[list[EvalResult], float, Optional[float]]:
        t0 = time.monotonic()
        results = [r for _, r in sorted(pool.evaluate(jobs), key=lambda jr: jr[0].key)]
        t1 = time.monotonic()
        return results, t1 - t0, self.gpu.busy(t0, t1)

    def language(self, package: str, lang: Language, evals: int = 2, retime: bool = True,
                 kernel: Optional[Path] = None) -> None:
        """A row: the package's starter in `lang`, or the kernel in the file `kernel` (a faster one, as a run
        re-times after its first gains)."""
        task = load_task(PACKAGES[package])
        source = kernel.read_text(encoding="utf-8") if kernel is not None else task.starter(lang).source
        # each evaluation a source of its own, as a run's candidates are: a source that passed before starts with
        # its own compiled kernels (evaluation/builds.py), which a new candidate never has; the re-time below is of
        # two evaluated ones, as a run's is
        sources = [distinct(source, lang, k) for k in range(evals)]
        # the run's default pool size: evaluations below go one at a time (width 1), and the re-time's two
        # kernels compile and check at once and are timed back to back, as in a run
        pool = self.pool(package, None)
        row: dict = {"package": package if kernel is None else f"{package}@{kernel.stem}", "lang": lang.value,
                     "evals": []}
        try:
            # the lane's baselines first, as a run has them by its first candidate: not a candidate's cost
            pool._baseline(pool.lane_list[0]).result()
            for k in range(evals):
                if self.left() <= 0:
                    break
                taken, mark = spares_taken(pool), TAP.mark()
                (r,), wall, busy = self.timed(pool, [PoolJob(k, sources[k], lang)])
                row["evals"].append({"wall_s": wall, "gpu_busy": busy, "status": r.status.value, "timer": TAP.since(mark),
                                     "in_spare": spares_taken(pool) > taken,
                                     "costs": r.costs.model_dump() if r.costs else None, "medians": case_medians(r),
                                     "referee": refereed(r), "cases": case_detail(r),
                                     "reason": r.reason})
                row.setdefault("results", []).append(r)
            row["stored"] = [stored(pool, src) for src in sources]  # what a re-time of them is lent (builds.py)
            if retime and row.get("results") and row["results"][0].status.ok and self.left() > 0:
                t0, mark, settled = time.monotonic(), TAP.mark(), pool.lane_list[0].settled_s
                again = pool.retime([PoolJob(k, src, lang) for k, src in enumerate(sources[:2] * 2)][:2])
                row["retime2_s"] = time.monotonic() - t0
                row["retime2"] = {"timer": TAP.since(mark), "costs": [r.costs.model_dump() if r.costs else None
                                                                       for r in again],
                                  "settle_s": pool.lane_list[0].settled_s - settled,
                                  # against the evaluations' own: a re-time's lighter loops must not read faster
                                  "geomean_us": [r.geomean_time_us for r in again],
                                  "judged_us": [r.geomean_time_us for r in row["results"][:2]]}
        finally:
            row["pool"] = {"baseline_runs": pool.baseline_runs, "spares_taken": spares_taken(pool),
                           "baseline_why": pool.baseline_why}
            pool.close()
        results = row.pop("results", [])
        row["repeat_pct"] = spread_pct(*results[-2:]) if len(results) >= 2 else None  # the last two: both in spares
        row["repeat_worst"] = worst_case(*results[-2:]) if len(results) >= 2 else None
        self.rows.append(row)
        print_row(row)

    def widths(self, package: str, lang: Language, widths: list[int], n: int, kernel: Optional[Path] = None) -> None:
        """n distinct copies of the starter (or of `kernel`: a strategy's, as the offline search proposes them) at
        each width: each copy compiles from nothing, as a new candidate does."""
        source = kernel.read_text() if kernel else load_task(PACKAGES[package]).starter(lang).source
        for w in widths:
            if self.left() <= 0:
                return
            pool = self.pool(package, w)
            try:
                pool._baseline(pool.lane_list[0]).result()
                results, wall, busy = self.timed(pool, [PoolJob(i, distinct(source, lang, i), lang) for i in range(n)])
            finally:
                runs, taken = pool.baseline_runs, spares_taken(pool)
                parked = getattr(pool.lane_list[0], "parking", None)  # (an older tree has none)
                stops = f"{parked.stops} stops of a neighbour, {parked.stopping_s * 1e3:.0f} ms" if parked else "-"
                print(f"    baseline jobs again: {pool.baseline_why}", flush=True)
                pool.close()
            ok = sum(r.status.ok for r in results)
            print(f"width {package + ('@' + kernel.stem if kernel else ''):<13} {lang.value:<6} w={w} {n} candidates ({ok} passed) in {wall:.1f} s: "
                  f"{n / wall * 3600:.0f} cand/h, gpu busy {_f(busy, '.0f')}% ({runs} baseline jobs, {taken} spares "
                  f"taken; {stops})", flush=True)
            failed = [f"{r.status.value}: {(r.reason or '')[:240]}" for r in results if not r.status.ok]
            for why in failed:
                print(f"    {why}", flush=True)
            self.rows.append({"package": package, "lang": lang.value, "width": w, "n": n, "wall_s": wall,
                              "gpu_busy": busy, "per_hour": n / wall * 3600, "failed": failed})


def print_row(row: dict) -> None:
    evals = row["evals"]
    if not evals:
        print(f"{row['package']:<13} {row['lang']:<6} (no time left)", flush=True)
        return
    wall = statistics.median(e["wall_s"] for e in evals)
    costs = [e["costs"] for e in evals if e["costs"]]
    phase = {p: statistics.median(c[p] for c in costs) if costs else None for p in PHASES}
    busy = [e["gpu_busy"] for e in evals if e["gpu_busy"] is not None]
    print(f"{row['package']:<13} {row['lang']:<6} {evals[-1]['status']:<9} {wall:>7.1f} "
          + " ".join(f"{_f(phase[p], '.2f'):>7}" for p in PHASES)
          + f" {_f(statistics.mean(busy) if busy else None, '.0f'):>5} {3600 / wall:>7.0f}"
          f" {_f(row.get('retime2_s')):>8} {_f(row.get('repeat_pct'), '.2f'):>6}"
          f"   (walls {', '.join(format(e['wall_s'], '.1f') for e in evals)}; {row.get('pool')})", flush=True)
    spared = [e for e in evals if e.get("in_spare")]
    if spared:  # a run's starter finds no spare; the candidates after it do (evaluation/warm_worker.py)
        costs = [e["costs"] for e in spared if e["costs"]]
        print(f"    in a spare: {statistics.median(e['wall_s'] for e in spared):.1f} s (median of {len(spared)}; "
              + ", ".join(f"{p} {statistics.median(c[p] for c in costs):.2f}" for p in PHASES if costs)
              + (f"); started cold: {', '.join(format(e['wall_s'], '.1f') for e in evals if not e.get('in_spare'))} s"
                 if len(spared) < len(evals) else ")"),
              flush=True)
    for e in evals:
        t = e.get("timer") or {}
        if t.get("loops"):
            print(f"    timer loops: {t['loops_s']:.2f} s of timing {(e['costs'] or {}).get('timing', 0):.2f} s "
                  f"({t['loops']} loops, {t['calls']} timed calls, {t['again']} again after a slow host)", flush=True)
    for e in evals:
        if e.get("referee"):
            print(f"    {referee_line(e['referee'])}", flush=True)
    again = row.get("retime2")
    if again:
        phases = [c for c in again["costs"] if c]
        print(f"    re-time of two: {row['retime2_s']:.1f} s; each " + "; ".join(
            ", ".join(f"{p} {c[p]:.2f}" for p in PHASES if c[p] >= 0.01) for c in phases)
            + f"; timer loops {again['timer']['loops_s']:.2f} s; the lane's wait for processes still starting "
            f"{again.get('settle_s', 0.0):.2f} s", flush=True)
        if again.get("geomean_us"):
            print("    re-time geomean us " + ", ".join(_f(g, '.1f') for g in again["geomean_us"]) + " against the "
                  "evaluations' " + ", ".join(_f(g, '.1f') for g in again["judged_us"]), flush=True)
    if row.get("stored"):
        print("    kept builds (files, bytes) per evaluated source: " + "; ".join(str(x) for x in row["stored"]),
              flush=True)
    if row.get("repeat_worst"):
        pct, case, a, b = row["repeat_worst"]
        print(f"    repeat: case {case} read {a:.1f} and {b:.1f} us ({pct:.1f}%)", flush=True)
    for e in evals:
        if e["status"] != "PASSED":
            print(f"    {e['status']}: {(e['reason'] or '')[:200]}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--packages", default=",".join(PACKAGES))
    p.add_argument("--langs", default="triton,cuda")
    p.add_argument("--combos", default="", help="PACKAGE:LANG[:WIDTH][@KERNEL_FILE],... in this order instead of "
                   "packages x langs (@: that kernel's row instead of the starter's)")
    p.add_argument("--evals", type=int, default=2, help="evaluations per package and language (default 2)")
    p.add_argument("--no-retime", action="store_true")
    p.add_argument("--budget", type=float, default=540.0, help="seconds; no new work starts after (default 540)")
    p.add_argument("--widths", default="", help="comma-separated pool widths for candidates/hour (default none)")
    p.add_argument("--width-candidates", type=int, default=8)
    p.add_argument("--width-packages", default="decode", help="packages the widths are measured on")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--windows", action="store_true", help="with --json-out: every referee window too (FILE.windows.json)")
    p.add_argument("--busy-parent", action="store_true", help="a Python thread spinning in this process (the pool's "
                   "parent, where the referees' threads run) throughout, as a planner's or another lane's work would")
    a = p.parse_args()
    if a.busy_parent:
        threading.Thread(target=spin, daemon=True, name="busy-parent").start()
    bench = Bench(a.budget, Device(a.device), a.timeout)
    langs = [Language(x) for x in a.langs.split(",") if x]
    print(HEADER + "\n(wall s, phases: medians of the evaluations at width 1; gpu%: nvidia-smi busy share of the "
          "evaluation; cand/h: 3600 / wall; retime2: two kernels re-timed back to back, s; rep%: max per-case "
          "median difference of the last two)", flush=True)
    try:
        combos = [c for c in a.combos.split(",") if c] or \
            [f"{pk}:{lang.value}" for pk in a.packages.split(",") if pk for lang in langs]
        for combo in combos:  # PACKAGE:LANG, or PACKAGE:LANG:WIDTH for candidates/hour at that width here
            head, _, name = combo.partition("@")
            part, kernel = head.split(":"), Path(name) if name else None
            if bench.left() > 0 and len(part) == 3:
                bench.widths(part[0], Language(part[1]), [int(part[2])], a.width_candidates, kernel)
            elif bench.left() > 0:
                bench.language(part[0], Language(part[1]), a.evals, not a.no_retime, kernel)
        widths = [int(w) for w in a.widths.split(",") if w]
        for package in (x for x in a.width_packages.split(",") if x and widths):
            bench.widths(package, langs[0], widths, a.width_candidates)
    finally:
        bench.gpu.close()
        for line in between_lines():
            print(f"  {line}", flush=True)
        if a.json_out:
            a.json_out.write_text(json.dumps(bench.rows, indent=1, default=str))
            if a.windows:
                a.json_out.with_suffix(".windows.json").write_text(json.dumps(WINDOWS))


if __name__ == "__main__":
    main()
