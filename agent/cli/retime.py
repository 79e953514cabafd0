"""``optagent retime RUN``: every passing candidate of a run made elsewhere, evaluated and ranked here.

A run made on the CPU (or on another GPU) says which kernels work; their times say little about this
machine. Retime evaluates each of them again through the same sandboxed evaluator, on this machine's
device and cases, and ranks them by geomean speedup. The run itself is not changed.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from optagent.app.build import build_evaluator, profile_notice
from optagent.app.build import resolve_device
from optagent.cli.options import add_profile_option, add_runs_dir
from optagent.cli.views import human_console, print_json
from optagent.report.format import fmt
from optagent.runs.store import RunStore, runs_dir
from optagent.runs.files import RunError
from optagent.task import load_task


def cmd_retime(a) -> int:
    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    cfg = store.config
    task = load_task(a.task or cfg.task_dir)  # --task: the package where the run was moved from another machine
    if a.task and task.digest() != cfg.task_digest:
        raise RunError(f"{task.root}: not the task package run {cfg.run_id} was made with (its files differ)")
    device = resolve_device(a.device)
    evaluator = build_evaluator(task, device, a.cases, hidden=not a.no_hidden, timeout_s=a.timeout, profile=a.profile)
    passing = [s for s in store.steps() if s.result is not None and s.result.status.ok]
    if not passing:
        raise RunError(f"{store.path}: no candidate of run {cfg.run_id} passed; nothing to re-time")
    con = human_console(a)
    if a.profile:
        con.print(profile_notice(evaluator), markup=False, soft_wrap=True)
    rows = []
    for n, step in enumerate(passing, 1):
        source = store.step_source(step.index)
        if source is None:
            continue
        con.print(f"re-timing step {step.index} ({n} of {len(passing)}) on {device.value}", markup=False)
        result = evaluator.evaluate(source, cfg.language)
        rows.append({"step": step.index, "idea": step.idea, "status": result.status.value,
                     "geomean_speedup": result.geomean_speedup, "geomean_us": result.geomean_time_us,
                     "recorded_speedup": step.result.geomean_speedup, "reason": result.reason})
    rows.sort(key=lambda r: -(r["geomean_speedup"] or 0.0))
    if a.json:
        print_json({"run_id": cfg.run_id, "device": device.value, "ranked": rows})
    else:
        t = Table(title=f"run {cfg.run_id} re-timed on {device.value}", title_justify="left")
        for col in ("rank", "step", "status", "geomean", "geomean us", "recorded", "idea"):
            t.add_column(col)
        for rank, r in enumerate(rows, 1):
            t.add_row(str(rank), str(r["step"]), r["status"], fmt(r["geomean_speedup"], ".2f", "x"),
                      fmt(r["geomean_us"], ".1f"), fmt(r["recorded_speedup"], ".2f", "x"), r["idea"][:70])
        con.print(t)
    return 0 if any(r["status"] == "PASSED" for r in rows) else 1


def add_retime_command(sub: argparse._SubParsersAction) -> None:
    from optagent.evaluation.evaluator import TIMEOUT_S

    r = sub.add_parser("retime", help="evaluate every passing candidate of a run here and rank them")
    r.add_argument("run_id", help="run id, unique prefix or path")
    r.add_argument("--task", help="the task package's directory, where the run was made on another machine")
    r.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible, else cpu")
    r.add_argument("--cases", help="cases to run, e.g. 1,3-5 (default: all on GPU, smoke cases on CPU)")
    r.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds per candidate (default {TIMEOUT_S:g})")
    r.add_argument("--no-hidden", action="store_true", help="skip the manifest's hidden integrity cases")
    add_profile_option(r)
    r.add_argument("--json", action="store_true", help="the ranking as one JSON document on stdout")
    r.add_argument("--quiet", action="store_true", help="print nothing but --json")
    add_runs_dir(r)
    r.set_defaults(fn=cmd_retime)
