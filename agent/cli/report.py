"""The `report` command: one run's HTML page (report/run_page.py renders it) written to a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optagent.cli.views import console
from optagent.report.run_page import render_run_report
from optagent.runs.store import RunStore, runs_dir
from optagent.runs.files import atomic_write


def cmd_report(a) -> int:
    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    page = render_run_report(store)
    if a.output == "-":
        sys.stdout.write(page)
        return 0
    out = Path(a.output or f"{store.config.run_id}.html")
    if out.is_dir():
        out = out / f"{store.config.run_id}.html"
    atomic_write(out, page)
    console(quiet=a.quiet).print(f"wrote {out} ({len(page.encode()) // 1024} KiB): run {store.config.run_id}",
                                 markup=False, soft_wrap=True)
    return 0


def add_report_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write one run's report as a self-contained HTML file",
                       description="Render a run (task, planner, cost, step chart, per-case timings, best kernel, "
                                   "its diff, the ledger of ideas) as one HTML file that fetches nothing.")
    p.add_argument("run_id", help="run id, a unique prefix of it, or a run directory's path")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write (default: RUN_ID.html; - for stdout)")
    p.add_argument("--runs-dir", help="where runs live (default ./runs or OPTAGENT_RUNS_DIR)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(fn=cmd_report)
