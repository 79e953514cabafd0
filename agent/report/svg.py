"""SVG geometry and number formatting for the report's charts: markers, scales, ticks, labels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional


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


def value_scale(values: list[float], bottom: float, top: float, log_above: float, headroom: float) -> "Scale":
    """A y scale for these values: logarithmic when they span more than log_above, else from 0 with headroom."""
    lo_v, hi_v = min(values), max(values)
    if hi_v / lo_v > log_above:
        return Scale(log_floor(lo_v), 10 ** math.ceil(math.log10(hi_v)), bottom, top, log=True)
    step = nice_step(hi_v * headroom, 5)
    return Scale(0.0, math.ceil(hi_v * headroom / step) * step, bottom, top)


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
# Labels
# ----------------------------------------------------------------------------


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
