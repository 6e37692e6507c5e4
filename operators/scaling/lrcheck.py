"""The learning-rate check at the target: was the rule's rate the best one where the forecast was scored?

A ladder's record states the assumption that its learning-rate rule is not mistuned at the target's size;
the check at the smallest and the top rung (:mod:`.fitstep`) cannot test that, and on 2026-12-03 the rule
sat on a flat optimum at both rungs and ended 0.9% above the best multiple at a target 10x beyond them
(docs/benchmarks/scaling-ladder.md). With ``plan_ladder(target_lr_multiples=...)`` the ladder trains the
target at those multiples of the rule's rate after the forecast is frozen and posted
(:func:`~operators.scaling.target.train_after_forecast`; the fit never reads them), and this step compares
their ends with the target's own.

It writes ``note.json``, a record sealed like the prediction (schema ``marin-prediction-note/v1``): the
prediction's hash, a title and a one-line ``text`` (what the engine posts to the issue as its own comment
and shows on the step's dashboard page: marin/tracking/predictions.py), and the figures: the end value at
each multiple (``null`` for a run that diverged), the best multiple, the rule's gap to it as a fraction
(``rule_gap``), the tolerance and ``held``. It is a step of its own, not part of the verdict, so a check run
that fails or diverges never holds back the forecast's score.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from openlab_records import NOTE_FILE, PREDICTION_FILE, Note, Prediction, read_json, read_sealed, write_sealed
from operators.scaling.curve import CURVE_FILE
from operators.scaling.gates import LR_CHECK_TOLERANCE, rule_gap


@dataclasses.dataclass(frozen=True)
class TargetLrCheckConfig:
    output_path: str
    """Where note.json is written."""
    prediction: str
    """The prediction step's output path (the note quotes its hash)."""
    target_curve: str
    """The target's eval step output path: the rule's run."""
    runs: tuple[tuple[float, str], ...]
    """(multiple of the rule's learning rate, that run's eval step output path) per run of the check."""
    tolerance: float = LR_CHECK_TOLERANCE
    """The rule holds when its run ends within this fraction of the best multiple's end."""


def _end_value(curve_dir: str) -> float:
    path = f"{curve_dir.rstrip('/')}/{CURVE_FILE}"
    curve = read_json(path)
    if curve is None:
        raise FileNotFoundError(f"target learning-rate check: no {path}: that run's eval step has not run")
    ends = [p for p in curve["points"] if float(p["fraction"]) == 1.0]
    if not ends:
        raise ValueError(f"target learning-rate check: {path} has no evaluation at the end of its run")
    return float(ends[0]["value"])


def compare_ends(ends: dict[float, float], tolerance: float) -> dict[str, Any]:
    """The check's figures from each multiple's end value (1.0: the rule's run); non-finite ends are runs
    that diverged: listed as null, never the best; when the rule's own run diverged it did not hold."""
    finite = {m: v for m, v in ends.items() if math.isfinite(v)}
    best = min(finite, key=lambda m: finite[m]) if finite else None
    rule = ends[1.0]
    gap = rule_gap(rule, finite[best]) if best is not None and math.isfinite(rule) else None
    return {
        "values": {f"{m:g}": (v if math.isfinite(v) else None) for m, v in sorted(ends.items())},
        "best_multiple": best,
        "rule_gap": gap,
        "tolerance": tolerance,
        "held": gap is not None and gap <= tolerance,
    }


def describe(check: dict[str, Any]) -> str:
    """One line for the issue and the dashboard."""

    def fmt(v: float | None) -> str:
        return "diverged" if v is None else f"{v:.4f}"

    values = check["values"]
    others = ", ".join(f"x{m} {fmt(v)}" for m, v in values.items() if m != "1")
    head = f"The rule's learning rate ended at {fmt(values['1'])} ({others})"
    if check["rule_gap"] is None:
        return f"{head}: no comparison (the rule's run or every run diverged); the rule did not hold."
    state = "the rule held" if check["held"] else "the rule is MISTUNED at the target"
    return (
        f"{head}; best x{check['best_multiple']:g}, the rule's run {100 * check['rule_gap']:.2f}% above it: "
        f"{state} (tolerance {100 * check['tolerance']:.2f}%)."
    )


def check_target_lr(config: TargetLrCheckConfig) -> dict[str, Any]:
    """Compare the target's end with its runs at other learning rates; write the sealed note.json."""
    if not config.runs:
        raise ValueError("target learning-rate check: no runs at other multiples (target_lr_multiples)")
    path = f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}"
    record = Prediction.from_json(read_sealed(path), path)
    ends = {1.0: _end_value(config.target_curve)}
    for multiple, curve_dir in config.runs:
        ends[float(multiple)] = _end_value(curve_dir)
    check = compare_ends(ends, config.tolerance)
    assert record.sha256 is not None  # read_sealed checked it
    note = Note(
        prediction_sha256=record.sha256,
        title="Learning rate at the target",
        text=describe(check),
        details={"kind": "target_lr_check", "experiment": record.experiment, "issue": record.issue,
                 "target": record.target, **check},
    )
    sealed = write_sealed(f"{config.output_path.rstrip('/')}/{NOTE_FILE}", note.to_json())
    print(f"[lr-check] {record.target}: {note.text}", file=sys.stderr, flush=True)
    return sealed
