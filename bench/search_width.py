"""What a wider round buys: the same offline search run at width 1 and at width 4, side by side.

    python bench/search_width.py [--task DIR] [--widths 1,4] [--max-steps N] [--time-limit S] [-- RUN ARGS]

Each width is one ``optagent run TASK --planner offline --width W`` (its own runs directory under
--out); afterwards the run's files are read back and this prints, per width: candidates evaluated
per hour, the wall time until the run's final best kernel was first found, that kernel's geomean
time and speedup, and the mean cost split of one evaluation (EvalResult.costs: spawn, imports,
baseline, compile, correctness, lane wait, timing, judge). Meant for a GPU host (an H200); on a
CPU it runs too, under Triton's interpreter, where the times compare kernels only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from optagent.costs import Costs
from optagent.runs.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


def run_once(task: Path, width: int, runs: Path, extra: list[str]) -> tuple[str, float, int]:
    argv = [sys.executable, "-m", "optagent.cli.main", "run", str(task), "--planner", "offline",
            "--width", str(width), "--runs-dir", str(runs), "--json", *extra]
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    try:
        run_id = json.loads(done.stdout)["run_id"]
    except (ValueError, KeyError):
        sys.exit(f"width {width}: optagent run gave no run id (exit code {done.returncode}); see its stderr above")
    return run_id, wall, done.returncode


def summarise(runs: Path, run_id: str, wall: float) -> dict:
    store = RunStore.open(runs, run_id)
    steps = store.steps()
    evaluated = [s for s in steps if s.result is not None]
    state = store.state()
    best = store.best()
    found_s: Optional[float] = None
    if state and state.best_step is not None:
        step = next((s for s in steps if s.index == state.best_step), None)
        if step:
            found_s = (step.finished_at - store.config.created_at).total_seconds()
    costs = [s.result.costs for s in evaluated if s.result.costs]
    mean = Costs(**{name: sum(getattr(c, name) for c in costs) / len(costs) for name in Costs.model_fields}) \
        if costs else None
    walls = [s.result.wall_s for s in evaluated]
    return {"run_id": run_id, "wall_s": wall, "evaluated": len(evaluated), "per_hour": len(evaluated) / wall * 3600,
            "best_found_s": found_s, "best_us": best[1].geomean_time_us if best else None,
            "best_speedup": best[1].geomean_speedup if best else None, "mean_costs": mean,
            "mean_eval_s": sum(walls) / len(walls) if walls else None}


def _f(x: Optional[float], spec: str = ".1f") -> str:
    return "-" if x is None else f"{x:{spec}}"


def report(rows: dict[int, dict]) -> None:
    print(f"{'width':>5} {'evals':>6} {'wall s':>8} {'cand/h':>8} {'best found s':>13} {'best us':>10} "
          f"{'speedup':>8} {'eval s':>7}")
    for width, r in rows.items():
        print(f"{width:>5} {r['evaluated']:>6} {r['wall_s']:>8.0f} {r['per_hour']:>8.1f} {_f(r['best_found_s'], '.0f'):>13} "
              f"{_f(r['best_us']):>10} {_f(r['best_speedup'], '.2f'):>8} {_f(r['mean_eval_s']):>7}")
    names = list(Costs.model_fields)
    print("\nmean cost split of one evaluation (s):")
    print(f"{'width':>5} " + " ".join(f"{n.replace('_', ' '):>11}" for n in names) + f" {'sum':>8}")
    for width, r in rows.items():
        c = r["mean_costs"]
        cells = " ".join(f"{_f(getattr(c, n) if c else None, '.2f'):>11}" for n in names)
        print(f"{width:>5} {cells} {_f(c.total if c else None, '.2f'):>8}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", type=Path, default=ROOT / "tasks" / "flashattn_task_package")
    p.add_argument("--widths", default="1,4", help="comma-separated round widths (default 1,4)")
    p.add_argument("--max-steps", type=int, default=16)
    p.add_argument("--time-limit", type=float, help="seconds per run")
    p.add_argument("--out", type=Path, default=Path("bench-out") / "search_width")
    p.add_argument("rest", nargs="*", help="more `optagent run` options, after --")
    a = p.parse_args()
    extra = ["--max-steps", str(a.max_steps), *(["--time-limit", str(a.time_limit)] if a.time_limit else []), *a.rest]
    rows: dict[int, dict] = {}
    for width in (int(w) for w in a.widths.split(",") if w.strip()):
        runs = a.out / f"width-{width}"
        runs.mkdir(parents=True, exist_ok=True)
        run_id, wall, _ = run_once(a.task, width, runs, extra)
        rows[width] = summarise(runs, run_id, wall)
    report(rows)


if __name__ == "__main__":
    main()
