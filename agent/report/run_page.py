"""HTML reports: one self-contained file per run (the leaderboard's page is `report_board`).

``optagent report RUN_ID -o report.html`` renders ``templates/run_report.html.j2``.
Everything is inline (CSS, SVG charts drawn here in Python, highlighted source),
so the file opens anywhere, offline, and fetches nothing.  The only script is a
few lines that mark the page once its charts are laid out, for the browser test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from optagent.ranking import timings_rank
from optagent import __version__
from optagent.schema import Language
from optagent.runs.tree import lineage
from optagent.runs.store import RunStore
from optagent.runs.files import read_text, unified_diff

TEMPLATES = Path(__file__).resolve().parent / "templates"

from optagent.report.charts import (Category, CATEGORIES, step_category, StepChart, step_chart, BarChart, case_chart)
from optagent.report.svg import num, sci, us
from optagent.report.code import (highlight_css, highlight_lines, diff_lines, error_summary)
from optagent.text import first_line, plain

# ----------------------------------------------------------------------------
# Page models
# ----------------------------------------------------------------------------


def jinja_env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(num=num, us=us, sci=sci, first_line=first_line)
    env.globals.update(version=__version__)
    return env


def when(dt: Optional[datetime]) -> str:
    if dt is None:
        return "–"
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


@dataclass
class LedgerRow:
    index: int
    time: str
    duration: str
    idea: str
    outcome: str
    status: str
    category: Category
    speedup: Optional[float]
    best: Optional[float]
    tokens: int
    cost: float
    note: Optional[str]
    detail: Optional[str]
    is_best: bool


@dataclass
class CaseRow:
    case: str
    kind: str
    sizes: str
    status: str
    time_us: Optional[float]
    gpu_us: Optional[float]
    baseline_us: Optional[float]
    speedup: Optional[float]
    floor_us: Optional[float]
    pct_of_floor: Optional[float]
    starter_us: Optional[float]
    rel_err: Optional[float]
    tolerance: Optional[float]


@dataclass
class RunPage:
    title: str
    config: object
    state: object
    created: str
    updated: str
    wall: str
    device_label: str
    gpu: Optional[dict]
    baseline_label: Optional[str]
    cpu: bool
    steps: int
    best_step: Optional[int]
    best_speedup: Optional[float]
    best_floor_pct: Optional[float]
    tokens: int
    cost: float
    counts: list[tuple[Category, int]]
    step_chart: Optional[StepChart]
    case_chart: Optional[BarChart]
    case_rows: list[CaseRow]
    kernel_name: str
    kernel_lines: list[Markup]
    kernel_is_starter: bool
    diff: list[tuple[str, str]]
    ledger: list[LedgerRow]
    unfinished: Optional[str]
    highlight_css: Markup
    generated: str
    limits: list[tuple[str, str]] = field(default_factory=list)
    lineage: list[tuple[int, str]] = field(default_factory=list)  # (step, idea) from the starter to the best


def run_page(store: RunStore) -> RunPage:
    cfg, state, steps = store.config, store.state(), store.steps()
    best = store.best()
    best_source, best_result = best if best else (None, None)
    best_step = state.best_step if state else None
    if best_step is None:
        best_step = next((s.index for s in reversed(steps) if s.outcome.keeps_best), None)
    results = [s.result for s in steps] + [best_result]
    cpu = not timings_rank(cfg.device, results)
    last = next((r for r in reversed(results) if r is not None), None)
    gpu = next((r.gpu for r in reversed(results) if r is not None and r.gpu), None)
    device_name = next((r.device_name for r in reversed(results) if r is not None and r.device_name), None)
    device_label = cfg.device.value + (f" ({device_name})" if device_name else "")
    if cpu:
        device_label += ", Triton CPU interpreter" if cfg.language is Language.TRITON else ", CPU"

    starter_times = {}
    if steps and steps[0].result:
        starter_times = {c.case: c.time_us for c in steps[0].result.cases}
    case_rows = []
    if best_result:
        for c in best_result.cases:
            case_rows.append(CaseRow(c.case, c.kind.value, c.sizes or "", c.status.value, c.time_us, c.gpu_us,
                                     c.baseline_us, c.speedup, c.hw_floor_us, c.pct_of_floor,
                                     starter_times.get(c.case), c.rel_err, c.tolerance))
    pcts = [c.pct_of_floor for c in (best_result.timed if best_result else []) if c.pct_of_floor]

    ledger = []
    for s in steps:
        r = s.result
        note = s.retime_note
        detail_parts = []
        if s.error:
            note = (note + "; " if note else "") + plain(error_summary(s.error), markup=False)
            if "\n" in s.error.strip() or len(s.error) > 160:
                detail_parts.append(s.error.strip())
        if r and not r.status.ok and r.log_tail:
            detail_parts.append("candidate log tail:\n" + r.log_tail.strip())
        ledger.append(LedgerRow(
            s.index, s.started_at.astimezone(timezone.utc).strftime("%H:%M:%S"),
            _duration((s.finished_at - s.started_at).total_seconds()), s.idea, s.outcome.value,
            r.status.value if r else "NO_KERNEL", step_category(s), r.geomean_speedup if r else None,
            s.best_geomean_speedup, s.usage.prompt_tokens + s.usage.completion_tokens, s.usage.cost_usd, note,
            plain("\n\n".join(detail_parts), markup=False) or None, s.index == best_step))
    counts: dict[str, int] = {}
    for s in steps:
        key = step_category(s).key
        counts[key] = counts.get(key, 0) + 1

    tokens = sum(s.usage.prompt_tokens + s.usage.completion_tokens for s in steps)
    cost = sum(s.usage.cost_usd for s in steps)
    if state:
        tokens = state.usage.prompt_tokens + state.usage.completion_tokens
        cost = state.usage.cost_usd
    wall = _duration((steps[-1].finished_at - steps[0].started_at).total_seconds()) if steps else "–"
    x = cfg.language.ext
    starter = store.starter
    if best_source is not None:
        patch = store.path / "best" / "diff.patch"
        diff = read_text(patch) if patch.is_file() else unified_diff(
            starter, best_source, f"starter{x}", f"best{x}")
    else:
        diff = ""
    unfinished = store.unfinished()
    limits = [("min gain", f"{cfg.min_gain:.0%}"), ("patience", f"{cfg.patience} steps"),
              ("max steps", str(cfg.max_steps)), ("timeout", f"{cfg.timeout_s:.0f} s per candidate")]
    if cfg.time_limit_s:
        limits.append(("time limit", _duration(cfg.time_limit_s)))
    if cfg.budget_usd is not None:
        limits.append(("budget", f"${cfg.budget_usd:.2f}"))
    return RunPage(
        title=f"{cfg.task_name}: optagent run {cfg.run_id}", config=cfg, state=state, created=when(cfg.created_at),
        updated=when(state.updated_at if state else None), wall=wall, device_label=device_label, gpu=gpu,
        baseline_label=(best_result or last).baseline_label if (best_result or last) else None, cpu=cpu,
        steps=len(steps), best_step=best_step if best_result else None,
        best_speedup=best_result.geomean_speedup if best_result else None,
        best_floor_pct=sum(pcts) / len(pcts) if pcts else None, tokens=tokens, cost=cost,
        counts=[(c, counts[c.key]) for c in CATEGORIES if c.key in counts],
        step_chart=step_chart(steps), case_chart=case_chart(best_result, cpu) if best_result else None,
        case_rows=case_rows, kernel_name=f"best/kernel{x}" if best_source is not None else f"starter{x}",
        kernel_lines=highlight_lines(best_source if best_source is not None else starter, cfg.language),
        kernel_is_starter=best_source is None, diff=diff_lines(diff), ledger=ledger,
        unfinished=(f"step {unfinished[0]} was proposed ({unfinished[1].idea}) but its evaluation never finished"
                    if unfinished else None),
        highlight_css=Markup(highlight_css()),  # noqa: S704 - generated CSS, no user text
        generated=when(datetime.now(timezone.utc)), limits=limits,
        lineage=[(s.index, s.idea) for s in lineage(steps, best_step)] if best_result and best_step is not None else [])


def render_run_report(store: RunStore) -> str:
    """One run as a self-contained HTML page."""
    page = run_page(store)
    return jinja_env().get_template("run_report.html.j2").render(page=page, highlight_css=page.highlight_css,
                                                                 generated=page.generated)
