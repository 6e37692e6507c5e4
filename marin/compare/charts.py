"""Line charts as geometry for inline SVG: computed here in Python, drawn by the Jinja partial
`templates/_line_chart.html`, readable with no JavaScript (the dashboard and the static site of `marin
publish` render the same markup; `static/compare.js` only adds a hover read-out).

`line_chart(curve_set, log_x=, log_y=)` gives a `LineChart`: every curve of the set in one plot, so all runs
share one x range and one y range (the point of a comparison: two tabs that auto-scale make 4.38 and 4.57
look alike). Ticks are "nice" numbers (1, 2, 2.5, 5 x 10^k; powers of ten on a log axis); the y range is
widened to whole ticks. Non-positive values are left out of a log axis, and the chart says how many. The
notes under the chart state the smoothing and the downsampling.

Tables are plain HTML (templates/_compare_table.html); other plots (the ladder's fit plot) reuse `Axis`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from marin.compare.curves import AXIS_LABELS, CurveSet

COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#9a6700", "#e85aad")
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40


def fmt(v: float) -> str:
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.2e}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    return f"{v:.4g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not hi > lo:
        lo, hi = lo - 1, hi + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round((first + i) * step, 12) for i in range(int((hi - first * step) / step + 1e-9) + 1)]


@dataclass(frozen=True)
class Axis:
    """A data range mapped onto pixels [p0, p1]; `log`: log10 of the values is mapped."""

    lo: float  # in transformed units (log10 when log)
    hi: float
    p0: float
    p1: float
    log: bool = False

    @classmethod
    def fit(cls, values: Sequence[float], p0: float, p1: float, log: bool, widen: bool) -> Axis:
        t = [math.log10(v) for v in values] if log else list(values)
        lo, hi = (min(t), max(t)) if t else (0.0, 1.0)
        if hi == lo:
            lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)
        if widen and not log:
            ticks = nice_ticks(lo, hi)
            step = ticks[1] - ticks[0] if len(ticks) > 1 else 0
            if step > 0:
                lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
        if log:
            lo, hi = math.floor(lo), math.ceil(hi) if math.ceil(hi) > math.floor(lo) else math.floor(lo) + 1
        return cls(lo, hi, p0, p1, log)

    def px(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        return self.p0 + (t - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def ticks(self) -> list[tuple[float, str]]:
        """(pixel, label) of every tick inside the range."""
        if self.log:
            values = [10.0 ** e for e in range(int(self.lo), int(self.hi) + 1)]
        else:
            values = nice_ticks(self.lo, self.hi)
        return [(round(self.px(v), 1), fmt(v)) for v in values
                if min(self.p0, self.p1) - 1 <= self.px(v) <= max(self.p0, self.p1) + 1]


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    points: str  # "x,y x,y ..." in pixels, for <polyline points>
    final: float | None
    count: int  # points logged
    shown: int  # points drawn


@dataclass(frozen=True)
class LineChart:
    title: str
    x_label: str
    y_label: str
    width: int
    height: int
    plot: tuple[float, float, float, float]  # left, top, right, bottom
    x_ticks: tuple[tuple[float, str], ...]
    y_ticks: tuple[tuple[float, str], ...]
    x_domain: tuple[float, float]  # transformed units (log10 on a log axis), for the hover read-out
    y_domain: tuple[float, float]
    log_x: bool
    log_y: bool
    lines: tuple[Line, ...]
    notes: tuple[str, ...]


def _points(xs: Sequence[float], ys: Sequence[float], log_x: bool, log_y: bool) -> list[tuple[float, float]]:
    return [(x, y) for x, y in zip(xs, ys, strict=True) if (not log_x or x > 0) and (not log_y or y > 0)]


def _notes(cs: CurveSet, dropped: int) -> list[str]:
    notes = []
    if cs.ema:
        notes.append(f"smoothed: exponential moving average, weight {cs.ema:g} on the past (debiased); the "
                     "final values in the legend are the last logged values, unsmoothed")
    if cs.downsampled:
        notes.append(f"downsampled on the server: curves longer than {cs.max_points} points keep the lowest "
                     f"and highest point of each of {max(1, (cs.max_points - 1) // 2)} buckets, and the last")
    if dropped:
        notes.append(f"{dropped} non-positive value(s) left out of the log axis")
    notes.extend(f"no curve for {m}" for m in cs.missing)
    if cs.derived:
        notes.append(f"FLOPs of {', '.join(cs.derived)} derived from the run's train_config.json (recorded "
                     "before FLOPs were logged; the trainer's own count of its model and sequence length)")
    return notes


def line_chart(cs: CurveSet, *, log_x: bool = False, log_y: bool = False,
               title: str | None = None) -> LineChart:
    """Every curve of `cs` on one pair of axes (see the module docstring)."""
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    kept = [_points(c.xs, c.ys, log_x, log_y) for c in cs.curves]
    dropped = sum(len(c.xs) for c in cs.curves) - sum(len(k) for k in kept)
    xs = [p[0] for k in kept for p in k]
    ys = [p[1] for k in kept for p in k]
    ax = Axis.fit(xs, left, right, log_x, widen=False)
    ay = Axis.fit(ys, bottom, top, log_y, widen=True)
    lines = tuple(
        Line(c.label, COLORS[i % len(COLORS)],
             " ".join(f"{ax.px(x):.1f},{ay.px(y):.1f}" for x, y in k), c.final, c.points, len(k))
        for i, (c, k) in enumerate(zip(cs.curves, kept, strict=True)))
    return LineChart(
        title=title or cs.metric, x_label=AXIS_LABELS.get(cs.axis, cs.axis) + (" (log)" if log_x else ""),
        y_label=cs.metric + (" (log)" if log_y else ""), width=WIDTH, height=HEIGHT,
        plot=(left, top, right, bottom), x_ticks=tuple(ax.ticks()), y_ticks=tuple(ay.ticks()),
        x_domain=(ax.lo, ax.hi), y_domain=(ay.lo, ay.hi), log_x=log_x, log_y=log_y, lines=lines,
        notes=tuple(_notes(cs, dropped)))
