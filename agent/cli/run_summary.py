"""A run as a reader sees it: its live status and whether any of its files is damaged.

A run's state.json says RUNNING from its first step until it stops; when the
process driving it is killed (kill -9, a lost machine) nothing rewrites it. The
driver holds an flock on ``runs/<id>/lock`` that the kernel drops with the
process, so a RUNNING state with a free lock is a run that was interrupted.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from optagent.schema import RunConfig, RunState, RunStatus
from optagent.ranking import timings_rank
from optagent.runs.store import RunStore
from optagent.runs.files import RunError
from optagent.report.format import fmt

DAMAGED = "DAMAGED"  # shown in place of a status: the run cannot be read whole
NEW = "NEW"  # created, never driven


class RunSummary(BaseModel):
    run_id: str  # the run's directory name (its id, also when config.json is damaged)
    path: str
    config: Optional[RunConfig] = None
    state: Optional[RunState] = None
    status: Optional[RunStatus] = None  # live: RUNNING only while a process drives it; None: never started
    driven: bool = False  # a live process holds the run's lock now
    resumable: bool = False  # stopped before its limits: `optagent resume` carries on
    error: Optional[str] = None  # the first damaged file and what is wrong with it, one line
    damaged_files: int = 0

    @property
    def shown(self) -> str:
        if self.error:
            return DAMAGED
        return self.status.value if self.status else NEW

    def note(self, handle: Optional[str] = None) -> Optional[str]:
        """One line for a listing, or None when the status says it all."""
        if self.error:
            n = self.damaged_files - 1
            more = f" (and {n} more damaged file{'s' if n > 1 else ''})" if n else ""
            return f"{self.error}{more}"
        if self.resumable:
            return f"resumable: optagent resume {handle or self.run_id}"
        return None


def live_status(store: RunStore, state: Optional[RunState]) -> tuple[Optional[RunStatus], bool]:
    """(status, driven): a run whose driver is gone is INTERRUPTED, whatever its state last said."""
    if store.driven():
        return RunStatus.RUNNING, True
    if state is None:
        # killed before its first step was recorded; with no lock file it was never started
        return (RunStatus.INTERRUPTED if store.ever_driven() else None), False
    if state.status is RunStatus.RUNNING:
        return RunStatus.INTERRUPTED, False
    return state.status, False


def summarize(store: RunStore) -> RunSummary:
    """Never raises for a damaged run: the damage is in ``error``, so a listing goes on past it."""
    out = RunSummary(run_id=store.path.name, path=str(store.path))
    damage = store.damage()
    if damage:
        out.error, out.damaged_files = str(damage[0]), len(damage)
    try:
        out.config = store.config
    except RunError:
        pass
    try:
        out.state = store.state()
    except RunError:
        return out
    out.status, out.driven = live_status(store, out.state)
    out.resumable = not damage and out.status is RunStatus.INTERRUPTED
    return out


def status_text(store: RunStore, status: Optional[RunStatus], driven: bool, handle: str) -> str:
    """The status for ``show``: how to carry on an interrupted run, who drives a running one."""
    if status is RunStatus.INTERRUPTED:
        return f"{status.value} (resumable: optagent resume {handle})"
    pid = store.driver_pid() if driven else None
    return (status.value if status else NEW) + (f" (pid {pid})" if pid else "")


def print_runs(con: Console, runs: list[RunSummary], title: str, by_path: bool = False) -> None:
    cells = []
    for r in runs:
        cfg, st = r.config, r.state
        cells.append([r.run_id, cfg.task_name if cfg else "?",
                      (cfg.planner.value + (f"/{cfg.model}" if cfg.model else "")) if cfg else "?",
                      cfg.language.value if cfg else "?", cfg.device.value if cfg else "?", r.shown,
                      str(st.steps if st else 0),
                      # a CPU run's speedup is the interpreter's: it ranks nothing (retime ranks on a GPU)
                      ("correctness only" if st and st.best_step is not None else "-")
                      if cfg and not timings_rank(cfg.device) else fmt(st.best_geomean_speedup if st else None, ".2f", "x")])
    t = Table(title=title, title_justify="left")
    for col in ("run", "task", "planner", "lang", "device", "status", "steps", "best"):
        t.add_column(col, no_wrap=col in ("run", "status"))
    for row in cells:
        t.add_row(*row)
    # The id is what a user types into show, resume and report: a table too wide for the terminal
    # would cut or fold it, so a narrow terminal gets each run on two plain lines instead.
    if Measurement.get(con, con.options.update(max_width=1 << 16), t).maximum <= con.width:
        con.print(t)
    else:
        con.print(title, markup=False, soft_wrap=True)
        for row in cells:
            con.print(f"{row[0]}  {row[5]}", markup=False, soft_wrap=True)
            con.print(f"  {row[1]}, {row[2]}, {row[3]} on {row[4]}, {row[6]} steps, best {row[7]}", markup=False)
    for r in runs:
        note = r.note(r.path if by_path else None)
        if note:
            con.print(f"{r.run_id}: {r.shown}: {note}", markup=False, soft_wrap=True)
