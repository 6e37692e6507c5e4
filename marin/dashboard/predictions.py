"""The dashboard's view of pre-registered predictions: a step's band chart, and the calibration list.

Reads the records through :mod:`marin.tracking.predictions` (the engine's typed, generic reading of
``prediction.json``, ``tracking.json`` and ``verdict.json``: :mod:`openlab_records`). For a step page,
:func:`for_step` finds what the step wrote: a tracked run (``tracking.json``: the live curve against the
band, "on track / off track" per landed evaluation), a verdict (``verdict.json``), or the prediction
itself (``prediction.json``), and lays the points out as a small inline SVG (server-side coordinates, so
no script is needed); or a note on a prediction (``note.json``: its title and text, no chart).
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from marin.tracking.predictions import TrackPoint, read_record, sealed_as, track, track_points
from openlab_records import HASH_KEY, NOTE_FILE, PREDICTION_FILE, VERDICT_FILE, Note, Prediction, Verdict

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


def _what_is_there(root: str) -> tuple[str, Prediction | Verdict, list[TrackPoint]] | dict[str, Any] | None:
    """(kind, record, points) for a tracked run, a verdict or a prediction; a dict for a tampered one."""
    found = track(root)
    if found is not None:
        return "tracked run", found[0], found[1]
    verdict = sealed_as(Verdict, read_record(f"{root}/{VERDICT_FILE}"), f"{root}/{VERDICT_FILE}")
    if verdict is not None:
        actual = {p.band.step: p.actual for p in verdict.points}
        return "verdict", verdict, track_points([p.band for p in verdict.points], actual)
    raw = read_record(f"{root}/{PREDICTION_FILE}")
    if not isinstance(raw, dict):
        return None
    record = sealed_as(Prediction, raw, f"{root}/{PREDICTION_FILE}")
    if record is None:
        return {"kind": "prediction", "tampered": True, "sha256": raw.get(HASH_KEY)}
    return "prediction", record, track_points(record.points, {})


def for_step(prefix: str, step_path: str) -> dict[str, Any] | None:
    """What the step page shows about predictions for the step at ``step_path`` (None: nothing)."""
    root = step_path if "://" in step_path or step_path.startswith("/") else posixpath.join(prefix, step_path)
    root = root.rstrip("/")
    note = read_record(f"{root}/{NOTE_FILE}")
    if isinstance(note, dict):
        return _note(note)
    found = _what_is_there(root)
    if found is None or isinstance(found, dict):
        return found
    kind, record, points = found
    latest = [p for p in points if p.actual is not None]
    sha = record.prediction_sha256 if isinstance(record, Verdict) else record.sha256
    return {
        "kind": kind,
        "tampered": False,
        "sha256": sha,
        "metric": record.metric,
        "target": record.target,
        "points": points,
        "summary": latest[-1].describe(record.metric) if latest else "no evaluation yet",
        "chart": chart(points),
    }


def _note(raw: dict[str, Any]) -> dict[str, Any]:
    note = sealed_as(Note, raw, NOTE_FILE)
    if note is None:
        return {"kind": "note", "tampered": True, "sha256": raw.get(HASH_KEY), "file": NOTE_FILE}
    return {
        "kind": "note",
        "tampered": False,
        "sha256": note.prediction_sha256,
        "metric": note.title,
        "target": note.details.get("target"),
        "points": [],
        "summary": note.text,
        "chart": None,
    }
