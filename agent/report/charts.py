"""The report's SVG charts: step categories, scales, and chart geometry (drawn by templates)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence


from optagent.report.code import error_summary
from optagent.report.svg import Scale, marker_path, nice_step, tick_label, us, value_scale, wrap_label
from optagent.schema import CaseKind, EvalResult, Status, Step, StepOutcome

# ----------------------------------------------------------------------------
# Step categories: what a marker on the step chart, and a badge in the ledger, says.
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Category:
    key: str
    label: str
    color: str
    shape: str
    hollow: bool = False


CATEGORIES = [
    Category("baseline", "starter (step 0)", "#475569", "diamond"),
    Category("accepted", "passed, new best", "#15803d", "circle"),
    Category("passed", "passed, not better", "#15803d", "circle", hollow=True),
    Category("incorrect", "incorrect", "#dc2626", "cross"),
    Category("compile_error", "compile error", "#ea580c", "triangle"),
    Category("runtime_error", "runtime error", "#9333ea", "triangle_down"),
    Category("timeout", "timeout", "#b45309", "square"),
    Category("rejected", "rejected (integrity)", "#111827", "octagon"),
    Category("unsupported", "unsupported", "#0891b2", "plus"),
    Category("no_kernel", "no kernel in reply", "#6b7280", "ring", hollow=True),
]
CATEGORY = {c.key: c for c in CATEGORIES}
STATUS_CATEGORY = {Status.INCORRECT: "incorrect", Status.COMPILE_ERROR: "compile_error",
                   Status.RUNTIME_ERROR: "runtime_error", Status.TIMEOUT: "timeout", Status.REJECTED: "rejected",
                   Status.UNSUPPORTED: "unsupported", Status.SKIPPED: "runtime_error"}


def step_category(step: Step) -> Category:
    r = step.result
    if r is None:
        return CATEGORY["no_kernel"]
    if r.status.ok:
        if step.outcome is StepOutcome.BASELINE:
            return CATEGORY["baseline"]
        return CATEGORY["accepted" if step.outcome is StepOutcome.ACCEPTED else "passed"]
    return CATEGORY[STATUS_CATEGORY.get(r.status, "runtime_error")]


@dataclass
class Marker:
    d: str
    fill: str
    stroke: str
    category: str
    title: str
    step: int


@dataclass
class StepChart:
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    lane_y: float
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    ref_y: Optional[float]
    best_path: str
    best_label: Optional[tuple[float, float, str]]
    markers: list[Marker]
    legend: list[dict]
    log: bool
    y_label: str


def legend_rows(labels: Sequence[str], left: float, right: float, swatch: float = 18, gap: float = 18,
                char_w: float = 6.3) -> list[tuple[float, int]]:
    """(x, row) of each legend item, wrapping onto a new row at the right edge."""
    out, x, row = [], left, 0
    for label in labels:
        w = swatch + char_w * len(label)
        if x > left and x + w > right:
            x, row = left, row + 1
        out.append((x, row))
        x += w + gap
    return out


def step_chart(steps: Sequence[Step], width: int = 1000, height: int = 340) -> Optional[StepChart]:
    if not steps:
        return None
    left, right, top = 64, width - 90, 20
    present = {step_category(s).key for s in steps}
    shown = [c for c in CATEGORIES if c.key in present]
    places = legend_rows([c.label for c in shown], left, right)
    rows = (places[-1][1] + 1) if places else 0
    height += 22 * rows
    bottom = height - 66 - 22 * rows  # room for the failure lane, the x axis and the legend
    lane_y = bottom + 22
    n_max = max(s.index for s in steps)
    xs = Scale(-0.5, n_max + 0.5, left, right)
    gms = [s.result.geomean_speedup for s in steps if s.result and s.result.geomean_speedup]
    bests = [s.best_geomean_speedup for s in steps if s.best_geomean_speedup]
    values = gms + bests + [1.0]
    ys = value_scale(values, bottom, top, log_above=30, headroom=1.08)
    y_ticks = [(ys(v), tick_label(v, "x")) for v in ys.ticks()]
    every = max(1, math.ceil((n_max + 1) / 25))
    x_ticks = [(xs(i), str(i)) for i in range(0, n_max + 1, every)]

    # The best-so-far line: flat until the next improvement, then up.
    path, last = [], None
    for s in steps:
        b = s.best_geomean_speedup
        if b is None:
            continue
        x, y = xs(s.index), ys(b)
        if last is None:
            path.append(f"M{x:.1f},{y:.1f}")
        else:
            path.append(f"H{x:.1f}V{y:.1f}")
        last = (x, y, b)
    if last:
        path.append(f"H{right:.1f}")
    best_label = (right + 4, last[1], f"best {last[2]:.2f}x") if last else None

    r = max(3.5, min(7.0, (right - left) / (n_max + 1) / 3))
    markers = []
    for s in steps:
        cat = step_category(s)
        gm = s.result.geomean_speedup if s.result else None
        y = ys(gm) if gm else lane_y
        status = s.result.status.value if s.result else "NO_KERNEL"
        title = f"step {s.index}: {s.outcome.value}, {status}"
        if gm:
            title += f", {gm:.2f}x"
        title += f"\n{s.idea}"
        why = error_summary(s.error)
        if why and not gm:
            title += f"\n{why[:200]}"
        markers.append(Marker(marker_path(cat.shape, xs(s.index), y, r), "#ffffff" if cat.hollow else cat.color,
                              cat.color, cat.key, title, s.index))
    legend = []
    for c, (lx, row) in zip(shown, places):
        ly = lane_y + 50 + 22 * row
        legend.append(dict(d=marker_path(c.shape, lx + 6, ly, 5.5), fill="#ffffff" if c.hollow else c.color,
                           stroke=c.color, x=lx + 16, y=ly + 4, label=c.label))
    return StepChart(width, height, left, top, right, bottom, lane_y, x_ticks, y_ticks,
                     ys(1.0) if ys.lo <= 1.0 <= ys.hi else None, "".join(path), best_label, markers, legend, ys.log,
                     "geomean speedup over the baseline" + (" (log scale)" if ys.log else ""))


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    color: str
    series: str
    title: str


@dataclass
class BarGroup:
    case: str
    sizes: str
    cx: float
    bars: list[Bar]
    note: Optional[str]
    note_color: str
    note_y: float
    size_lines: list[str] = field(default_factory=list)


@dataclass
class BarChart:
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    y_ticks: list[tuple[float, str]]
    groups: list[BarGroup]
    legend: list[dict]
    log: bool
    y_label: str
    size_font: float


SERIES = [("best kernel", "#2563eb"), ("baseline", "#9ca3af"), ("hardware floor", "#f59e0b")]


def case_chart(result: EvalResult, cpu: bool, width: int = 1000, height: int = 380) -> Optional[BarChart]:
    cases = [c for c in result.cases if c.kind is not CaseKind.HIDDEN and c.time_us]
    if not cases:
        return None
    left, right, top = 64, width - 20, 34
    group_w = (right - left) / len(cases)
    # Sizes go under each group on up to four lines, in a font small enough for the longest word to fit.
    longest = max((len(w) for c in cases for w in (c.sizes or "").split()), default=1)
    size_font = max(7.5, min(10.5, (group_w - 6) / (0.62 * longest)))
    per_line = max(4, int((group_w - 6) / (0.62 * size_font)))
    wrapped = {c.case: wrap_label(c.sizes or "", per_line) for c in cases}
    n_lines = max(len(v) for v in wrapped.values())
    height += 13 * n_lines
    bottom = height - 34 - 13 * n_lines
    values = [v for c in cases for v in (c.time_us, c.baseline_us, c.hw_floor_us) if v]
    ys = value_scale(values, bottom, top, log_above=20, headroom=1.05)
    unit = " µs (CPU interpreter)" if cpu else " µs"
    have_floor = any(c.hw_floor_us for c in cases)
    series = SERIES if have_floor else SERIES[:2]
    bar_w = min(26.0, group_w * 0.8 / len(series))
    groups = []
    for i, c in enumerate(cases):
        cx = left + group_w * (i + 0.5)
        bars = []
        for j, ((name, color), v) in enumerate(zip(series, (c.time_us, c.baseline_us, c.hw_floor_us))):
            if not v:
                continue
            x = cx + (j - len(series) / 2) * bar_w
            y = ys(v)
            what = {"best kernel": "best kernel", "baseline": f"baseline ({result.baseline_label or 'reference'})",
                    "hardware floor": f"hardware floor ({c.bound}-bound: the larger of bytes / measured bandwidth "
                                      "and flops / measured matmul rate)"}[name]
            bars.append(Bar(x + 1, y, bar_w - 2, max(bottom - y, 0.5), color, name,
                            f"case {c.case} ({c.sizes or 'sizes unknown'})\n{what}: {us(v)}{unit}"))
        top_y = min((b.y for b in bars), default=bottom)
        note = f"{c.speedup:.2f}x" if c.speedup else None
        groups.append(BarGroup(c.case, c.sizes or "", cx, bars, note,
                               "#15803d" if (c.speedup or 0) >= 1 else "#b91c1c", top_y - 6, wrapped[c.case]))
    legend, lx = [], left
    for name, color in series:
        legend.append(dict(x=lx, y=12, color=color, label=name))
        lx += 30 + 7 * len(name)
    return BarChart(width, height, left, top, right, bottom, [(ys(v), tick_label(v)) for v in ys.ticks()], groups,
                    legend, ys.log, "time" + unit + ", lower is better" + (" (log scale)" if ys.log else ""),
                    round(size_font, 1))


@dataclass
class HBar:
    y: float
    w: float
    label: str
    value: str
    title: str
    color: str


@dataclass
class HBarChart:
    width: int
    height: int
    left: int
    right: int
    x_ticks: list[tuple[float, str]]
    ref_x: Optional[float]
    bars: list[HBar]
    bar_h: float
    axis_y: float


def speedup_bars(rows: list[tuple[str, float, str]], width: int = 1000) -> HBarChart:
    """Horizontal bars, one per (label, speedup, tooltip), for the leaderboard."""
    left, right, row_h = 330, width - 70, 26
    height = 30 + row_h * len(rows) + 10
    hi = max([v for _, v, _ in rows] + [1.0]) * 1.08
    step = nice_step(hi, 5)
    xs = Scale(0.0, math.ceil(hi / step) * step, left, right)
    bars = []
    for i, (label, v, title) in enumerate(rows):
        bars.append(HBar(10 + row_h * i, max(xs(v) - left, 1.0), label, f"{v:.2f}x", title,
                         "#2563eb" if v >= 1 else "#dc2626"))
    axis_y = 10 + row_h * len(rows) + 4
    return HBarChart(width, height, left, right, [(xs(v), tick_label(v, "x")) for v in xs.ticks()], xs(1.0), bars,
                     row_h - 8, axis_y)
