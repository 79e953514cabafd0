"""The leaderboard as one self-contained HTML page: per task, the GPU runs' best kernels ranked,
a bar chart of their speedups and each one's diff against the starter; CPU runs in sections of
their own, listed without rank or chart (their times are the interpreter's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from markupsafe import Markup

from optagent.ranking import timings_rank
from optagent.report.run_page import jinja_env, when
from optagent.report.charts import HBarChart, speedup_bars
from optagent.report.code import diff_lines, highlight_css, shorten
from optagent.schema import Device
from optagent.runs.files import atomic_write, unified_diff


@dataclass
class BoardEntry:
    rank: Optional[int]  # None in a CPU section: not ranked by speed
    entry: object
    planner: str
    floor_pct: Optional[float]
    date: str
    diff: list[tuple[str, str]]
    anchor: str


@dataclass
class BoardGroup:
    task: str
    device: Device
    device_name: str
    cpu: bool
    rows: list[BoardEntry]
    chart: Optional[HBarChart]


def leaderboard_page(entries: Sequence) -> list[BoardGroup]:
    """Groups per task and device kind, GPU groups first; entries in leaderboard.gather()'s order."""
    groups: dict[tuple[bool, str], list] = {}
    for e in entries:
        cpu = not timings_rank(e.config.device, [e.result])
        groups.setdefault((cpu, e.config.task_name), []).append(e)
    out = []
    for (cpu, task), es in sorted(groups.items(), key=lambda kv: kv[0]):
        rows = []
        for i, e in enumerate(es if cpu else sorted(es, key=lambda e: -e.speedup), 1):
            planner = e.config.planner.value + (f"/{e.config.model}" if e.config.model else "")
            x = e.config.language.ext
            rows.append(BoardEntry(None if cpu else i, e, planner, e.floor_pct, when(e.config.created_at),
                                   diff_lines(unified_diff(e.starter, e.source, f"starter{x}", f"best{x}")),
                                   re.sub(r"[^A-Za-z0-9_-]", "-", e.config.run_id)))
        chart = None if cpu else speedup_bars([
            (f"#{r.rank} {shorten(r.entry.config.run_id, 46)}", r.entry.speedup,
             f"{r.entry.config.run_id}\n{r.planner}, {r.entry.config.language.value}\n"
             f"{r.entry.speedup:.2f}x geomean speedup") for r in rows])
        name = "CPU" if cpu else next((e.result.device_name for e in es if e.result.device_name), None) or "GPU"
        out.append(BoardGroup(task, Device.CPU if cpu else Device.CUDA, name, cpu, rows, chart))
    return out


def render_leaderboard(entries: Sequence) -> str:
    """The leaderboard (leaderboard.gather()'s entries) as a self-contained HTML page."""
    return jinja_env().get_template("leaderboard.html.j2").render(
        groups=leaderboard_page(entries), highlight_css=Markup(highlight_css()),  # noqa: S704
        generated=when(datetime.now(timezone.utc)), total=len(entries))


def write_leaderboard_html(entries: Sequence, path: Path) -> Path:
    path = Path(path)
    atomic_write(path, render_leaderboard(entries))
    return path
