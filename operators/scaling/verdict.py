"""The ``verdict`` step: the target's curve scored against its frozen prediction, sealed in ``verdict.json``.

At each point of the prediction: the target's actual value (the same eval step as every rung), the signed
error ``(predicted - actual) / actual`` in % (:func:`openlab_records.error_pct`, the one sign convention:
negative means the forecast was too low) and whether the actual is inside the interval. A prediction made
under the ``pre_decay_anchor`` endpoint rule kept the end law's own forecast beside the registered one: the
verdict scores it too (the endpoint's ``end_law``) and says how it did in its ``summary`` line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from datetime import UTC, datetime
from typing import Any

from openlab_records import (
    PREDICTION_FILE,
    VERDICT_FILE,
    Band,
    Prediction,
    Scored,
    Verdict,
    error_pct,
    error_words,
    read_json,
    read_sealed,
    write_sealed,
)
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fitstep import read_bytes


@dataclasses.dataclass(frozen=True)
class VerdictConfig:
    output_path: str
    """Where verdict.json is written."""
    prediction: str
    """The prediction step's output path."""
    target_curve: str
    """The target's eval step output path (curve.json)."""


def _score(band: Band, actual: float) -> Scored:
    details = {}
    if "end_law" in band.details:  # the pre_decay_anchor rule: the end law's own forecast, scored beside it
        law = Band(band.label, band.step, **{k: band.details["end_law"][k] for k in ("point", "low", "high")})
        details["end_law"] = {
            "point": law.point,
            "error_pct": error_pct(law.point, actual),
            "inside": law.inside(actual),
        }
    return Scored(band=dataclasses.replace(band, details={}), actual=actual, details=details)


def _summary(end: Scored) -> tuple[str, ...] | None:
    law = end.details.get("end_law")
    if law is None:
        return None
    return (
        f"The end law alone (not the registered endpoint) said {law['point']:.4f}, {law['error_pct']:+.2f}%.",
    )


def score_prediction(config: VerdictConfig) -> dict[str, Any]:
    """Score the frozen record against the target's curve; write the sealed verdict.json and return it."""
    record_path = f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}"
    record = Prediction.from_json(read_sealed(record_path), record_path)
    curve_path = f"{config.target_curve.rstrip('/')}/{CURVE_FILE}"
    curve = read_json(curve_path)
    if curve is None:
        raise FileNotFoundError(f"verdict: no {curve_path}: the target's eval step has not written its curve")
    actual_by_step = {int(p["step"]): float(p["value"]) for p in curve["points"]}
    missing = [p.step for p in record.points if p.step not in actual_by_step]
    if missing:
        raise ValueError(
            f"verdict: the target's curve {curve_path} has no evaluation at step {missing[0]} "
            f"(it has {sorted(actual_by_step)})"
        )
    points = tuple(_score(p, actual_by_step[p.step]) for p in record.points)
    assert record.sha256 is not None  # read_sealed checked it
    verdict = Verdict(
        prediction_sha256=record.sha256,
        metric=record.metric,
        target=record.target,
        points=points,
        experiment=record.experiment,
        issue=record.issue,
        summary=_summary(points[-1]),
        details={
            "curve_sha256": hashlib.sha256(read_bytes(curve_path)).hexdigest(),
            "scored_at": datetime.now(UTC).isoformat(timespec="seconds"),
            # the endpoint inside its interval as a number, for the experiment's criterion
            # (verdict.json/endpoint_hit: the notebook reads numbers, not booleans)
            "endpoint_hit": int(points[-1].inside),
        },
    )
    sealed = write_sealed(f"{config.output_path.rstrip('/')}/{VERDICT_FILE}", verdict.to_json())
    end = verdict.endpoint
    print(
        f"[verdict] {record.target}: actual {end.actual:.4f}, predicted {end.band.point:.4f} "
        f"({end.error_pct:+.2f}%), {'inside' if end.inside else 'OUTSIDE'} [{end.band.low:.4f}, "
        f"{end.band.high:.4f}]: {error_words(end.error_pct, record.metric)}; {verdict.hits}/{len(points)} "
        "points inside",
        file=sys.stderr,
        flush=True,
    )
    return sealed
