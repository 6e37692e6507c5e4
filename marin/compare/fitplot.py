"""The scaling ladder's fit plot: loss against compute on log-log axes, with the rungs' runs, the fitted law,
the target's interval and point forecast, and the target's actual value once it landed. Geometry for the
partial templates/_fit_chart.html (inline SVG, readable without JavaScript).

Inputs are the records the ladder's steps write (docs/scaling-ladder.md): the fit step's `fit.json` (each
run's `compute_6nd` and end value, and per evaluation fraction the law `L = E + A * C^(-alpha)` in 6·N·D,
`fractions[i].fit.params`), and the prediction step's `prediction.json` (its last point: `compute_6nd`,
`point`, `low`, `high`). The law drawn is the end fraction's (the one the target's end forecast comes from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin.compare.charts import HEIGHT, LEFT, RIGHT, TOP, WIDTH, Axis
from marin.compare.source import number

BOTTOM = 40
AXES_NOTE = "log-log axes: compute (6·N·D) and the metric"


@dataclass(frozen=True)
class FitChart:
    width: int
    height: int
    plot: tuple[float, float, float, float]
    x_ticks: tuple[tuple[float, str], ...]
    y_ticks: tuple[tuple[float, str], ...]
    runs: tuple[tuple[float, float, str], ...]  # (x, y, title) of each rung run
    law: str  # polyline points
    law_text: str
    target: tuple[float, float, float, float, str] | None  # (x, y point, y low, y high, title)
    actual: tuple[float, float, str] | None
    notes: tuple[str, ...]


def _law(params: Any) -> tuple[float, float, float] | None:
    if not isinstance(params, dict):
        return None
    e, a, alpha = (number(params.get(k)) for k in ("E", "A", "alpha"))
    return None if e is None or a is None or alpha is None else (e, a, alpha)


def _end_fit(fit_doc: dict[str, Any]) -> tuple[float, tuple[float, float, float]] | None:
    fractions = [f for f in fit_doc.get("fractions") or [] if isinstance(f, dict)]
    if not fractions:
        return None
    end = max(fractions, key=lambda f: number(f.get("fraction")) or 0.0)
    law = _law((end.get("fit") or {}).get("params"))
    return (number(end.get("fraction")) or 1.0, law) if law else None


def _runs(fit_doc: dict[str, Any], fraction: float) -> list[tuple[float, float, str]]:
    out = []
    for r in fit_doc.get("runs") or []:
        if not isinstance(r, dict) or (number(r.get("lr_multiple")) or 1.0) != 1.0:
            continue
        c = number(r.get("compute_6nd"))
        v = number((r.get("values") or {}).get(f"{fraction:g}"))
        if c and v and c > 0 and v > 0:
            out.append((c, v, f"{r.get('rung')} seed {r.get('seed')}: {v:.4g} at {c:.3g}"))
    return out


def _target(prediction: dict[str, Any] | None) -> dict[str, float] | None:
    points = [p for p in (prediction or {}).get("points") or [] if isinstance(p, dict)]
    if not points:
        return None
    end = points[-1]
    found = {k: v for k in ("compute_6nd", "point", "low", "high") if (v := number(end.get(k))) and v > 0}
    return found if len(found) == 4 else None


def fit_chart(fit_doc: dict[str, Any], prediction: dict[str, Any] | None = None,
              actual: float | None = None) -> FitChart | None:
    """The fit plot, or None when fit.json holds no end law or no run."""
    found = _end_fit(fit_doc)
    if found is None:
        return None
    fraction, (e, a, alpha) = found
    runs = _runs(fit_doc, fraction)
    target = _target(prediction)
    if not runs:
        return None
    xs = [c for c, _, _ in runs] + ([target["compute_6nd"]] if target else [])
    lo_c, hi_c = min(xs) / 1.5, max(xs) * 1.5
    curve = [lo_c * (hi_c / lo_c) ** (k / 60) for k in range(61)]
    law_y = [e + a * c ** (-alpha) for c in curve]
    ys = [v for _, v, _ in runs] + [y for y in law_y if y > 0]
    if target:
        ys += [target["low"], target["high"]]
    if actual is not None and actual > 0:
        ys.append(actual)
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    ax = Axis.fit([lo_c, hi_c], left, right, log=True, widen=False)
    ay = Axis.fit(ys, bottom, top, log=True, widen=False)
    tgt = None
    if target:
        c = target["compute_6nd"]
        tgt = (ax.px(c), ay.px(target["point"]), ay.px(target["low"]), ay.px(target["high"]),
               f"forecast {target['point']:.4g} [{target['low']:.4g}, {target['high']:.4g}] at {c:.3g}")
    act = None
    if actual is not None and actual > 0 and target:
        act = (ax.px(target["compute_6nd"]), ay.px(actual), f"actual {actual:.4g}")
    law_text = f"L = {e:.4g} + {a:.4g} · C^(−{alpha:.4g}) (fraction {fraction:g}, C in 6·N·D)"
    return FitChart(
        WIDTH, HEIGHT, (left, top, right, bottom), tuple(ax.ticks()), tuple(ay.ticks()),
        tuple((ax.px(c), ay.px(v), t) for c, v, t in runs),
        " ".join(f"{ax.px(c):.1f},{ay.px(y):.1f}" for c, y in zip(curve, law_y, strict=True) if y > 0),
        law_text, tgt, act,
        (AXES_NOTE + "; the interval is the prediction's 90% band for one run",) if target else (AXES_NOTE,))

