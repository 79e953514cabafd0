"""HTML reports: one self-contained file per run, and one for the leaderboard.

``optagent report RUN_ID -o report.html`` renders ``templates/run_report.html.j2``.
Everything is inline (CSS, SVG charts drawn here in Python, highlighted source),
so the file opens anywhere, offline, and fetches nothing.  The only script is a
few lines that mark the page once its charts are laid out, for the browser test.
"""

from __future__ import annotations

import argparse
import html
import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Optional, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from . import __version__
from .schema import CaseKind, EvalResult, Language, Status, Step, StepOutcome
from .store import RunStore, atomic_write, ext, unified_diff

TEMPLATES = Path(__file__).resolve().parent / "templates"

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


def marker_path(shape: str, x: float, y: float, r: float) -> str:
    """An SVG path for a marker centred on (x, y), about 2r across."""
    def pts(points: Iterable[tuple[float, float]]) -> str:
        return "M" + "L".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in points) + "Z"

    if shape in ("circle", "ring"):
        return f"M{x - r:.1f},{y:.1f}a{r:.1f},{r:.1f} 0 1,0 {2 * r:.1f},0a{r:.1f},{r:.1f} 0 1,0 {-2 * r:.1f},0Z"
    if shape == "diamond":
        s = r * 1.3
        return pts([(0, -s), (s, 0), (0, s), (-s, 0)])
    if shape == "square":
        s = r * 0.9
        return pts([(-s, -s), (s, -s), (s, s), (-s, s)])
    if shape == "triangle":
        s = r * 1.25
        return pts([(0, -s), (s, s * 0.8), (-s, s * 0.8)])
    if shape == "triangle_down":
        s = r * 1.25
        return pts([(0, s), (s, -s * 0.8), (-s, -s * 0.8)])
    if shape == "octagon":
        a, b = r * 0.45, r * 1.05
        return pts([(-a, -b), (a, -b), (b, -a), (b, a), (a, b), (-a, b), (-b, a), (-b, -a)])
    if shape in ("cross", "plus"):
        w, s = r * 0.38, r * 1.1
        arm = [(-w, -s), (w, -s), (w, -w), (s, -w), (s, w), (w, w), (w, s), (-w, s), (-w, w), (-s, w), (-s, -w),
               (-w, -w)]
        if shape == "cross":
            c, sn = math.cos(math.pi / 4), math.sin(math.pi / 4)
            arm = [(dx * c - dy * sn, dx * sn + dy * c) for dx, dy in arm]
        return pts(arm)
    raise ValueError(shape)


# ----------------------------------------------------------------------------
# Scales and ticks
# ----------------------------------------------------------------------------


@dataclass
class Scale:
    lo: float
    hi: float
    r0: float  # pixel of lo
    r1: float  # pixel of hi
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            t = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            t = (v - self.lo) / (self.hi - self.lo) if self.hi != self.lo else 0.0
        return self.r0 + t * (self.r1 - self.r0)

    def ticks(self) -> list[float]:
        return log_ticks(self.lo, self.hi) if self.log else linear_ticks(self.lo, self.hi)


def nice_step(span: float, count: int = 5) -> float:
    raw = span / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def linear_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    step = nice_step(hi - lo, count)
    first = math.ceil(lo / step - 1e-9) * step
    out, v = [], first
    while v <= hi + step * 1e-6:
        out.append(round(v, 10))
        v += step
    return out


def log_ticks(lo: float, hi: float) -> list[float]:
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                out.append(v)
    decades = math.log10(hi / lo)
    if decades > 4:  # too many labels: keep the powers of ten
        out = [v for v in out if abs(math.log10(v) - round(math.log10(v))) < 1e-9]
    return out


def log_floor(v: float) -> float:
    """The largest 1, 2 or 5 times a power of ten at least 1.5x below v: the bottom of a log axis."""
    target = v / 1.5
    e = math.floor(math.log10(target))
    return max(m * 10.0 ** e for m in (1, 2, 5) if m * 10.0 ** e <= target)


def tick_label(v: float, unit: str = "") -> str:
    if v == 0:
        return "0" + unit
    if abs(v) >= 1000:
        text = f"{v / 1000:g}k"
    elif abs(v) >= 1:
        text = f"{v:.10g}"
    else:
        text = f"{v:.3g}"
    return text + unit


def num(v: Optional[float], spec: str = ".2f", suffix: str = "") -> str:
    if v is None:
        return "–"
    return f"{v:{spec}}{suffix}"


def us(v: Optional[float]) -> str:
    """A time in microseconds with sensible precision."""
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.2g}"


def sci(v: Optional[float], digits: int = 1) -> str:
    """1.7e-3 rather than 1.7e-03."""
    if v is None:
        return "–"
    mant, _, exp = f"{v:.{digits}e}".partition("e")
    return f"{mant}e{int(exp)}"


# ----------------------------------------------------------------------------
# Charts: geometry computed here, drawn by templates/_charts.html.j2
# ----------------------------------------------------------------------------


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
    lo_v, hi_v = min(values), max(values)
    log = hi_v / lo_v > 30
    if log:
        ys = Scale(log_floor(lo_v), 10 ** math.ceil(math.log10(hi_v)), bottom, top, log=True)
    else:
        step = nice_step(hi_v * 1.08, 5)
        ys = Scale(0.0, math.ceil(hi_v * 1.08 / step) * step, bottom, top)
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
                     ys(1.0) if ys.lo <= 1.0 <= ys.hi else None, "".join(path), best_label, markers, legend, log,
                     "geomean speedup over the baseline" + (" (log scale)" if log else ""))


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
    values = [v for c in cases for v in (c.time_us, c.baseline_us, c.floor_us) if v]
    lo_v, hi_v = min(values), max(values)
    log = hi_v / lo_v > 20
    if log:
        ys = Scale(log_floor(lo_v), 10 ** math.ceil(math.log10(hi_v)), bottom, top, log=True)
    else:
        step = nice_step(hi_v * 1.05, 5)
        ys = Scale(0.0, math.ceil(hi_v * 1.05 / step) * step, bottom, top)
    unit = " µs (CPU interpreter)" if cpu else " µs"
    have_floor = any(c.floor_us for c in cases)
    series = SERIES if have_floor else SERIES[:2]
    bar_w = min(26.0, group_w * 0.8 / len(series))
    groups = []
    for i, c in enumerate(cases):
        cx = left + group_w * (i + 0.5)
        bars = []
        for j, ((name, color), v) in enumerate(zip(series, (c.time_us, c.baseline_us, c.floor_us))):
            if not v:
                continue
            x = cx + (j - len(series) / 2) * bar_w
            y = ys(v)
            what = {"best kernel": "best kernel", "baseline": f"baseline ({result.baseline_label or 'reference'})",
                    "hardware floor": "hardware floor (bytes / measured bandwidth)"}[name]
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
                    legend, log, "time" + unit + ", lower is better" + (" (log scale)" if log else ""),
                    round(size_font, 1))


def wrap_label(text: str, width: int, max_lines: int = 4) -> list[str]:
    """Words of a case's sizes on lines of at most width characters (a word longer than that stays whole)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: max(width - 1, 1)] + "…"
    return lines


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


# ----------------------------------------------------------------------------
# Source highlighting and diffs
# ----------------------------------------------------------------------------

PY_KEYWORDS = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def",
               "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is",
               "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"}
C_KEYWORDS = {"auto", "break", "case", "char", "const", "constexpr", "continue", "default", "do", "double", "else",
              "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "namespace", "return",
              "short", "signed", "sizeof", "static", "struct", "switch", "template", "typedef", "typename", "union",
              "unsigned", "using", "void", "volatile", "while", "bool", "true", "false", "nullptr", "__global__",
              "__device__", "__host__", "__shared__", "__restrict__", "__forceinline__", "__launch_bounds__",
              "half", "int64_t", "int32_t", "uint32_t", "size_t"}
_PY_TOKEN = re.compile(r'(?P<sd>"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\')|(?P<s>"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')'
                       r'|(?P<c1>#[^\n]*)|(?P<nd>@[\w.]+)|(?P<m>\b\d[\d_]*(?:\.\d*)?(?:e[+-]?\d+)?\b)|(?P<w>\b[A-Za-z_]\w*\b)')
_C_TOKEN = re.compile(r'(?P<cm>/\*[\s\S]*?\*/)|(?P<c1>//[^\n]*)|(?P<cp>^\s*#[^\n]*)|(?P<s>"(?:\\.|[^"\\\n])*")'
                      r'|(?P<m>\b\d[\d.]*[fFuUlL]*\b)|(?P<w>\b[A-Za-z_]\w*\b)', re.M)
FALLBACK_CSS = """.hl .k, .hl .kc { color: #7c3aed; font-weight: 600 }
.hl .s, .hl .sd { color: #047857 } .hl .sd { font-style: italic }
.hl .c1, .hl .cm { color: #6b7280; font-style: italic }
.hl .m { color: #b45309 } .hl .nd { color: #be185d } .hl .nf { color: #1d4ed8; font-weight: 600 }
.hl .cp { color: #9a3412 }"""


def _fallback_highlight(source: str, language: Language) -> str:
    """Keywords, strings, comments, numbers and decorators as spans closed at every line end."""
    cuda = language is Language.CUDA
    pattern, keywords = (_C_TOKEN, C_KEYWORDS) if cuda else (_PY_TOKEN, PY_KEYWORDS)
    out, pos, after_def = [], 0, False

    def span(cls: str, text: str) -> str:
        return "\n".join(f'<span class="{cls}">{html.escape(part)}</span>' if part else "" for part in text.split("\n"))

    for m in pattern.finditer(source):
        out.append(html.escape(source[pos:m.start()]))
        kind, text = m.lastgroup, m.group()
        if kind == "w":
            if text in keywords:
                out.append(span("kc" if text in ("True", "False", "None", "true", "false", "nullptr") else "k", text))
                after_def = text in ("def", "class")
                pos = m.end()
                continue
            out.append(span("nf", text) if after_def else html.escape(text))
            after_def = False
        else:
            out.append(span(kind, text))
        pos = m.end()
    out.append(html.escape(source[pos:]))
    return "".join(out)


def _pygments():
    try:
        import pygments  # noqa: F401
    except ImportError:
        return None
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import CudaLexer, PythonLexer

    return highlight, HtmlFormatter, {"cuda": CudaLexer, "python": PythonLexer}


USE_PYGMENTS = True  # tests turn it off to exercise the fallback


def highlight_css() -> str:
    lib = _pygments() if USE_PYGMENTS else None
    if lib is None:
        return FALLBACK_CSS
    rules = lib[1](style="default").get_style_defs(".hl").splitlines()
    return "\n".join(r for r in rules if r.startswith(".hl ") and not r.startswith(".hl .hll"))


def highlight_lines(source: str, language: Language) -> list[Markup]:
    """The source as highlighted HTML, one balanced fragment per line."""
    lib = _pygments() if USE_PYGMENTS else None
    if lib is None:
        text = _fallback_highlight(source, language)
    else:
        highlight, formatter, lexers = lib
        lexer = lexers["cuda" if language is Language.CUDA else "python"](stripnl=False, ensurenl=False)
        text = highlight(source, lexer, formatter(nowrap=True))
    lines = text.split("\n")
    if lines and lines[-1] == "" and source.endswith("\n"):
        lines.pop()
    return [Markup(line) for line in lines]  # noqa: S704 - escaped by the highlighter


def diff_lines(diff: str) -> list[tuple[str, str]]:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "meta"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


def error_summary(text: Optional[str], limit: int = 240) -> Optional[str]:
    """The first line of an error, and its last when there are several (a traceback's or compiler's verdict)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return None
    out = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return out if len(out) <= limit else out[: limit - 1] + "…"


def shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def first_line(text: Optional[str]) -> Optional[str]:
    if not text:
        return None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


# ----------------------------------------------------------------------------
# Page models
# ----------------------------------------------------------------------------


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(num=num, us=us, sci=sci, first_line=first_line)
    env.globals.update(version=__version__)
    return env


def _when(dt: Optional[datetime]) -> str:
    if dt is None:
        return "–"
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def _is_cpu(results: Iterable[Optional[EvalResult]]) -> bool:
    for r in results:
        if r is None:
            continue
        if r.device == "cpu" or any(c.timing_kind in ("cpu-interpreter", "cpu") for c in r.cases):
            return True
    return False


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


def run_page(store: RunStore) -> RunPage:
    cfg, state, steps = store.config, store.state(), store.steps()
    best = store.best()
    best_source, best_result = best if best else (None, None)
    best_step = state.best_step if state else None
    if best_step is None:
        best_step = next((s.index for s in reversed(steps) if s.outcome in (StepOutcome.ACCEPTED,
                                                                             StepOutcome.BASELINE)), None)
    results = [s.result for s in steps] + [best_result]
    cpu = cfg.device == "cpu" or _is_cpu(results)
    last = next((r for r in reversed(results) if r is not None), None)
    gpu = next((r.gpu for r in reversed(results) if r is not None and r.gpu), None)
    device_name = next((r.device_name for r in reversed(results) if r is not None and r.device_name), None)
    device_label = cfg.device + (f" ({device_name})" if device_name else "")
    if cpu:
        device_label += ", Triton CPU interpreter" if cfg.language is Language.TRITON else ", CPU"

    starter_times = {}
    if steps and steps[0].result:
        starter_times = {c.case: c.time_us for c in steps[0].result.cases}
    case_rows = []
    if best_result:
        for c in best_result.cases:
            case_rows.append(CaseRow(c.case, c.kind.value, c.sizes or "", c.status.value, c.time_us, c.gpu_us,
                                     c.baseline_us, c.speedup, c.floor_us, c.pct_of_floor,
                                     starter_times.get(c.case), c.rel_err, c.tolerance))
    pcts = [c.pct_of_floor for c in (best_result.timed if best_result else []) if c.pct_of_floor]

    ledger = []
    for s in steps:
        r = s.result
        note = s.retime_note
        detail_parts = []
        if s.error:
            note = (note + "; " if note else "") + (error_summary(s.error) or "")
            if "\n" in s.error.strip() or len(s.error) > 160:
                detail_parts.append(s.error.strip())
        if r and not r.status.ok and r.log_tail:
            detail_parts.append("candidate log tail:\n" + r.log_tail.strip())
        ledger.append(LedgerRow(
            s.index, s.started_at.astimezone(timezone.utc).strftime("%H:%M:%S"),
            _duration((s.finished_at - s.started_at).total_seconds()), s.idea, s.outcome.value,
            r.status.value if r else "NO_KERNEL", step_category(s), r.geomean_speedup if r else None,
            s.best_geomean_speedup, s.usage.prompt_tokens + s.usage.completion_tokens, s.usage.cost_usd, note,
            "\n\n".join(detail_parts) or None, s.index == best_step))
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
    x = ext(cfg.language)
    starter = store.starter
    if best_source is not None:
        patch = store.path / "best" / "diff.patch"
        diff = patch.read_text(encoding="utf-8") if patch.is_file() else unified_diff(
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
        title=f"{cfg.task_name}: optagent run {cfg.run_id}", config=cfg, state=state, created=_when(cfg.created_at),
        updated=_when(state.updated_at if state else None), wall=wall, device_label=device_label, gpu=gpu,
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
        generated=_when(datetime.now(timezone.utc)), limits=limits)


def render_run_report(store: RunStore) -> str:
    """One run as a self-contained HTML page."""
    page = run_page(store)
    return _env().get_template("run_report.html.j2").render(page=page, highlight_css=page.highlight_css,
                                                            generated=page.generated)


@dataclass
class BoardEntry:
    rank: int
    entry: object
    planner: str
    floor_pct: Optional[float]
    date: str
    diff: list[tuple[str, str]]
    anchor: str


@dataclass
class BoardGroup:
    task: str
    device: str
    device_name: str
    cpu: bool
    rows: list[BoardEntry]
    chart: HBarChart


def leaderboard_page(entries: Sequence) -> list[BoardGroup]:
    groups: dict[tuple[str, str], list] = {}
    for e in entries:
        groups.setdefault((e.config.task_name, e.config.device), []).append(e)
    out = []
    for (task, device), es in groups.items():
        es = sorted(es, key=lambda e: -e.speedup)
        rows = []
        for i, e in enumerate(es, 1):
            planner = e.config.planner + (f"/{e.config.model}" if e.config.model else "")
            x = ext(e.config.language)
            rows.append(BoardEntry(i, e, planner, e.floor_pct, _when(e.config.created_at),
                                   diff_lines(unified_diff(e.starter, e.source, f"starter{x}", f"best{x}")),
                                   re.sub(r"[^A-Za-z0-9_-]", "-", e.config.run_id)))
        chart = speedup_bars([(f"#{r.rank} {shorten(r.entry.config.run_id, 46)}", r.entry.speedup,
                               f"{r.entry.config.run_id}\n{r.planner}, {r.entry.config.language.value}\n"
                               f"{r.entry.speedup:.2f}x geomean speedup") for r in rows])
        name = next((e.result.device_name for e in es if e.result.device_name), None) or device
        out.append(BoardGroup(task, device, name, device == "cpu" or _is_cpu(e.result for e in es), rows, chart))
    return out


def render_leaderboard(entries: Sequence) -> str:
    """The leaderboard (leaderboard.gather()'s entries) as a self-contained HTML page."""
    return _env().get_template("leaderboard.html.j2").render(
        groups=leaderboard_page(entries), highlight_css=Markup(highlight_css()),  # noqa: S704
        generated=_when(datetime.now(timezone.utc)), total=len(entries))


def write_leaderboard_html(entries: Sequence, path: Path) -> Path:
    path = Path(path)
    atomic_write(path, render_leaderboard(entries))
    return path


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def cmd_report(a) -> int:
    from .store import runs_dir
    from .views import console

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
    p.add_argument("run_id", help="run id, or a unique part of it")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write (default: RUN_ID.html; - for stdout)")
    p.add_argument("--runs-dir", help="where runs live (default ./runs or OPTAGENT_RUNS_DIR)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(fn=cmd_report)
