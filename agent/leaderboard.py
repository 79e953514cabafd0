"""The best kernel of every run, ranked per task (and device) by geomean speedup."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.table import Table

from .schema import EvalResult, RunConfig
from .store import RunError, ext, list_runs, unified_diff
from .views import fmt


@dataclass
class Entry:
    config: RunConfig
    source: str
    starter: str
    result: EvalResult
    path: Path

    @property
    def speedup(self) -> float:
        return self.result.geomean_speedup or 0.0

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
            entries.append(Entry(cfg, best[0], store.starter, best[1], store.path))
        except RunError as e:
            if damaged is not None:
                damaged.append(Damaged(store.path, str(e)))
    # Figures from different devices are never ranked against each other.
    return sorted(entries, key=lambda e: (e.config.task_name, e.config.device, -e.speedup))


def json_rows(entries: list[Entry], damaged: list[Damaged]) -> list[dict]:
    rows = [{"run_id": e.config.run_id, "task": e.config.task_name, "device": e.config.device,
             "language": e.config.language.value, "planner": e.config.planner, "model": e.config.model,
             "geomean_speedup": e.speedup, "mean_pct_of_floor": e.floor_pct, "path": str(e.path), "error": None}
            for e in entries]
    blank = dict.fromkeys(("task", "device", "language", "planner", "model", "geomean_speedup", "mean_pct_of_floor"))
    return rows + [{"run_id": d.path.name, **blank, "path": str(d.path), "error": d.error} for d in damaged]


def print_board(con: Console, entries: list[Entry], diff: bool = False) -> None:
    t = Table(title="leaderboard", title_justify="left")
    for col in ("rank", "task", "device", "geomean speedup", "mean % floor", "planner", "lang", "date", "run"):
        # the run id is what a user types next (show, report): shrink the others, never it
        t.add_column(col, no_wrap=col in ("rank", "geomean speedup", "run"),
                     overflow="fold" if col == "planner" else "ellipsis")
    rank, last = 0, None
    for e in entries:
        key = (e.config.task_name, e.config.device)
        rank = 1 if key != last else rank + 1
        last = key
        t.add_row(str(rank), e.config.task_name, e.result.device_name or e.config.device, f"{e.speedup:.2f}x",
                  fmt(e.floor_pct, ".0f", "%"), e.config.planner + (f"/{e.config.model}" if e.config.model else ""),
                  e.config.language.value, e.config.created_at.strftime("%Y-%m-%d %H:%M"), e.config.run_id)
    con.print(t)
    if diff:
        for e in entries:
            con.rule(f"{e.config.run_id}  ({e.speedup:.2f}x)")
            x = ext(e.config.language)
            con.print(unified_diff(e.starter, e.source, f"starter{x}", f"best{x}") or "(identical to the starter)",
                      markup=False, highlight=False)


def export(entries: list[Entry], out: Path) -> list[Path]:
    """The best kernel per task and device as one submit file, with its measurements."""
    written, seen = [], set()
    for e in entries:
        key = (e.config.task_name, e.config.device)
        if key in seen:
            continue
        seen.add(key)
        d = out / e.config.task_name / e.config.device
        d.mkdir(parents=True, exist_ok=True)
        kernel = d / f"submit{ext(e.config.language)}"
        kernel.write_text(e.source, encoding="utf-8")
        (d / "result.json").write_text(json.dumps({"run_id": e.config.run_id, **e.result.model_dump(mode="json")},
                                                  indent=2))
        written.append(kernel)
    return written
