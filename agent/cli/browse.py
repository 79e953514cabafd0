"""The commands that read recorded runs: runs, show, leaderboard, ledger."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.table import Table

from optagent.text import plain
from optagent.cli.options import add_runs_dir
from optagent.cli.views import console, human_console, print_json
from optagent.report.format import fmt, keep_ids_whole, print_eval
from optagent.runs.tree import best_step, lineage_text, parents
from optagent.ranking import timings_rank
from optagent.runs.store import RunStore, list_runs, runs_dir
from optagent.runs.files import RunError


def cmd_runs(a) -> int:
    from optagent.cli.run_summary import print_runs, summarize

    root = runs_dir(a.runs_dir)
    runs = [summarize(store) for store in list_runs(root)]
    if a.json:
        print_json([r.model_dump(mode="json") for r in runs])
        return 0
    # with --runs-dir, the hint to resume names the run's path, which works from anywhere
    print_runs(console(), runs, f"runs in {root}", by_path=bool(a.runs_dir))
    return 0


def cmd_show(a) -> int:
    from optagent.cli.run_summary import live_status, status_text

    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    con = console()
    cfg, st, steps = store.config, store.state(), store.steps()  # all read before anything is printed
    status, driven = live_status(store, st)
    if a.json:
        steps = [s for s in steps if a.step is None or s.index == a.step]
        print_json({"config": cfg.model_dump(mode="json"), "state": st.model_dump(mode="json") if st else None,
                    "status": status.value if status else None, "driven": driven,
                    "steps": [s.model_dump(mode="json") for s in steps]})
        return 0
    if a.step is not None:
        step = next((s for s in steps if s.index == a.step), None)
        if step is None:
            raise RunError(f"{store.path}: no finished step {a.step}")
        con.print(plain(f"step {step.index}: {step.outcome.value} - {step.idea}", markup=False), markup=False)
        if step.retime_note:
            con.print(step.retime_note, markup=False)
        if step.result:
            print_eval(con, step.result)
        elif step.error:
            con.print(plain(step.error, markup=False), markup=False)
        return 0
    best = store.best()
    shown = status_text(store, status, driven, a.run_id if os.sep in a.run_id else cfg.run_id)
    con.print(f"run {cfg.run_id}: task {cfg.task_name} ({cfg.task_dir}), {cfg.language.value} on {cfg.device.value}, "
              f"planner {cfg.planner.value}{'/' + cfg.model if cfg.model else ''}; status {shown}"
              + (f" ({plain(st.reason, markup=False)})" if st and st.reason else ""),
              markup=False, soft_wrap=True)
    t = Table(title_justify="left")
    tokens = any(s.usage.prompt_tokens or s.usage.completion_tokens for s in steps)
    up = parents(steps)
    # a CPU run's times are the interpreter's: they rank nothing, so show leaves them out (retime ranks on a GPU)
    timed = timings_rank(cfg.device, [s.result for s in steps])
    figures = ("geomean", "geomean us") if timed else ()
    for col in ("step", "from", "outcome", "status") + figures + (("tokens in/out",) if tokens else ()) + ("idea",):
        t.add_column(col)
    for s in steps:
        t.add_row(str(s.index), fmt(up.get(s.index), "d"), s.outcome.value, s.result.status.value if s.result else "-",
                  *((fmt(s.result.geomean_speedup if s.result else None, ".2f", "x"),
                     fmt(s.result.geomean_time_us if s.result else None, ".1f")) if timed else ()),
                  *((token_text(s.usage),) if tokens else ()), plain(s.idea[:80], markup=True))
    con.print(t)
    if best:
        con.print(f"lineage of the best (step {best_step(steps)}): {lineage_text(steps, best_step(steps), ideas=True)}",
                  markup=False, soft_wrap=True)
        print_eval(con, best[1])
    for e in store.damage():  # files this view does not read, but resume or report would
        console(stderr=True).print(f"optagent: warning: {e}", markup=False, soft_wrap=True)
    return 0


def token_text(usage) -> str:
    """A step's tokens per request: prompt/completion, and how many requests when more than one."""
    if not (usage.prompt_tokens or usage.completion_tokens):
        return "-"
    n = max(1, usage.requests)
    text = f"{usage.prompt_tokens // n}/{usage.completion_tokens // n}"
    return text + (f" (x{n} requests)" if n > 1 else "")


def cmd_leaderboard(a) -> int:
    from optagent.report.leaderboard import Damaged, as_json, export, gather, print_board

    damaged: list[Damaged] = []
    entries = gather(runs_dir(a.runs_dir), a.task, damaged)
    con = human_console(a)
    err = console(stderr=True)
    for d in damaged:
        err.print(f"optagent: warning: skipped damaged run {d.path.name}: {d.error}", markup=False, soft_wrap=True)
    if a.json:
        print_json(as_json(entries, damaged))
    else:
        print_board(con, entries, diff=a.diff)
    if a.html:
        from optagent.report.board_page import write_leaderboard_html

        con.print(f"wrote {write_leaderboard_html(entries, Path(a.html))}", markup=False)
    if a.export:
        for path in export(entries, Path(a.export)):
            con.print(f"exported {path}", markup=False)
    return 0


def cmd_ledger(a) -> int:
    from optagent.runs.ledger import Ledger, ledger_files

    root = runs_dir(a.runs_dir)
    if Path(a.task).is_dir():  # a package: its ledger (this digest); a name: every digest's
        from optagent.task import load_task

        task = load_task(a.task)
        paths = [p for p in ledger_files(root, task.name) if p.name.endswith(f"-{task.digest()[:12]}.jsonl")]
    else:
        paths = ledger_files(root, a.task)
    if not paths:
        raise RunError(f"{root / 'ledger'}: no ledger for task {a.task}")
    entries = [e for p in paths for e in Ledger(p).entries()]
    if a.json:
        print_json([e.model_dump(mode="json") for e in entries])
        return 0
    t = Table(title=f"{len(entries)} steps in {', '.join(str(p) for p in paths)}", title_justify="left")
    for col in ("run", "step", "device", "outcome", "status", "geomean us", "speedup", "gain", "idea"):
        t.add_column(col, justify="right" if col in ("step", "geomean us", "speedup", "gain") else "left")
    for e in entries:
        t.add_row(e.run_id, str(e.step), e.device_name or e.device.value, e.outcome.value,
                  e.status.value if e.status else "-", fmt(e.geomean_time_us), fmt(e.speedup, ".3g", "x"),
                  fmt(e.gain * 100 if e.gain is not None else None, "+.1f", "%"), e.idea)
    con = console()
    keep_ids_whole(t, 0, con)
    con.print(t)
    return 0


def add_browse_commands(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("runs", help="list runs")
    ls.add_argument("--json", action="store_true", help="print the runs as JSON")
    add_runs_dir(ls)
    ls.set_defaults(fn=cmd_runs)

    sh = sub.add_parser("show", help="show one run, or one step of it")
    sh.add_argument("run_id", help="run id, a unique prefix of it, or a run directory's path")
    sh.add_argument("--step", type=int)
    sh.add_argument("--json", action="store_true", help="print the run (or the step) as JSON")
    add_runs_dir(sh)
    sh.set_defaults(fn=cmd_show)

    lb = sub.add_parser("leaderboard", help="best kernel of every run: GPU runs ranked per task, CPU runs apart")
    lb.add_argument("--task", help="only this task")
    lb.add_argument("--json", action="store_true", help="print the ranking as JSON")
    lb.add_argument("--diff", action="store_true", help="print each best kernel as a diff against its starter")
    lb.add_argument("--html", metavar="FILE", help="write the leaderboard as a self-contained HTML page")
    lb.add_argument("--export", metavar="DIR", help="write the best kernel per task in the contest's submit form")
    add_runs_dir(lb)
    lb.set_defaults(fn=cmd_leaderboard)

    ld = sub.add_parser("ledger", help="every step of every run on a task (memory across runs)")
    ld.add_argument("task", help="task package directory (its ledger) or task name (the ledgers of every version)")
    ld.add_argument("--json", action="store_true", help="print the entries as JSON")
    add_runs_dir(ld)
    ld.set_defaults(fn=cmd_ledger)
