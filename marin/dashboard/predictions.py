"""The dashboard's view of pre-registered predictions: a step's band chart, and the calibration list.

Reads the records through :mod:`marin.tracking.predictions` (the engine's generic reader of
``prediction.json``, ``tracking.json`` and ``verdict.json``). For a step page, :func:`for_step` finds what
the step wrote: a tracked run (``tracking.json``: the live curve against the band, "on track / off track"
per landed evaluation), a verdict (``verdict.json``), or the prediction itself (``prediction.json``), and
lays the points out as a small inline SVG (server-side coordinates, so no script is needed); or a note on a
prediction (``note.json``: its title and text, no chart).
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from marin.tracking.predictions import (
    HASH_KEY,
    NOTE_FILE,
    PREDICTION_FILE,
    VERDICT_FILE,
    TrackPoint,
    read_json,
    track,
    track_points,
    verified,
)

WIDTH, HEIGHT, PAD = 560, 220, 44


@dataclasses.dataclass(frozen=True)
class BandChart:
    """The band, the predicted curve and the actual values in SVG coordinates."""

    band: str
    predicted: str
    actual: list[tuple[float, float, str]]
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT


def chart(points: list[TrackPoint]) -> BandChart:
    values = [v for p in points for v in (p.low, p.high, p.actual) if v is not None]
    lo, hi = min(values), max(values)
    span = (hi - lo) or max(abs(hi), 1.0) * 0.01
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    x_max = max(p.step for p in points)

    def x(step: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * step / x_max

    def y(v: float) -> float:
        return HEIGHT - PAD + (v - lo) / (hi - lo) * (2 * PAD - HEIGHT)

    upper = [f"{x(p.step):.1f},{y(p.high):.1f}" for p in points]
    lower = [f"{x(p.step):.1f},{y(p.low):.1f}" for p in reversed(points)]
    ticks = [lo + (hi - lo) * k / 4 for k in range(5)]
    return BandChart(
        band=" ".join(upper + lower),
        predicted=" ".join(f"{x(p.step):.1f},{y(p.point):.1f}" for p in points),
        actual=[(x(p.step), y(p.actual), p.state) for p in points if p.actual is not None],
        x_ticks=[(x(p.step), f"{p.label} ({p.step})") for p in points],
        y_ticks=[(y(v), f"{v:.3f}") for v in ticks],
    )


def for_step(prefix: str, step_path: str) -> dict[str, Any] | None:
    """What the step page shows about predictions for the step at ``step_path`` (None: nothing)."""
    root = step_path if "://" in step_path or step_path.startswith("/") else posixpath.join(prefix, step_path)
    root = root.rstrip("/")
    note = read_json(f"{root}/{NOTE_FILE}")
    if isinstance(note, dict):
        return _note(note)
    kind, found = "tracked run", track(root)
    if found is not None:
        record, points = found
    else:
        verdict = read_json(f"{root}/{VERDICT_FILE}")
        record = read_json(f"{root}/{PREDICTION_FILE}")
        if verified(verdict):
            kind = "verdict"
            record = {
                "points": verdict["points"],
                "metric": {"name": verdict["metric"]},
                HASH_KEY: verdict["prediction_sha256"],
                "target": {"name": verdict["target"]},
            }
            points = track_points(record, {int(p["step"]): float(p["actual"]) for p in verdict["points"]})
        elif isinstance(record, dict):
            if not verified(record):
                return {"kind": "prediction", "tampered": True, "sha256": record.get(HASH_KEY)}
            kind, points = "prediction", track_points(record, {})
        else:
            return None
    latest = [p for p in points if p.actual is not None]
    return {
        "kind": kind,
        "tampered": False,
        "sha256": record[HASH_KEY],
        "metric": record["metric"]["name"],
        "target": (record.get("target") or {}).get("name"),
        "points": points,
        "summary": latest[-1].describe() if latest else "no evaluation yet",
        "chart": chart(points),
    }


def _note(note: dict[str, Any]) -> dict[str, Any]:
    if not verified(note):
        return {"kind": "note", "tampered": True, "sha256": note.get(HASH_KEY), "file": NOTE_FILE}
    return {
        "kind": "note",
        "tampered": False,
        "sha256": note["prediction_sha256"],
        "metric": note.get("title", "note"),
        "target": note.get("target"),
        "points": [],
        "summary": note.get("text", ""),
        "chart": None,
    }
