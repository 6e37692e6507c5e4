"""The prediction record as a health rule: the target run's watcher alerts when an evaluation leaves its band.

A scaling ladder pre-registers the target's held-out metric at each evaluation point with a 90% interval
(``prediction.json``, :mod:`.prediction`). The target's train step (``train_target``) reads that record
through the hash-checked reader (:func:`openlab_records.read_sealed`: a record edited after it
was written is refused, so is the run) and gives the trainer's watcher the band with :func:`with_eval_band`:
``watch.eval_band`` (``moe_trainer.health_rules.EvalBand``) gets the metric, one ``BandPoint`` (step,
point, low, high, label) per evaluation point, and the record's path and sha256 as its source. The watcher
then fires an ``eval_band`` alert (severity and pending like every rule, no silence window by default;
docs/health.md) when an
evaluation at one of those steps lands outside its interval, and resolves it when a later one lands inside;
the engine posts both to the experiment's issue. No risk point has to be written by hand.

The band is a runtime input of the step, never part of its identity: the target's config hash is fixed
before the forecast exists (the record names it). Other fields of ``watch.eval_band`` (severity,
pending_steps, silence_s, enabled) keep what the step's overrides say.
"""

from __future__ import annotations

import dataclasses

from moe_trainer.health_rules import BandPoint, EvalBand
from openlab_records import Prediction
from operators.train import TrainConfig

EVAL_PREFIX = "eval."


def eval_band(record: Prediction, path: str) -> EvalBand:
    """The EvalBand rule of the (already hash-checked) record read from ``path``."""
    metric = record.metric_path.removeprefix(EVAL_PREFIX)
    points = tuple(BandPoint(step=p.step, point=float(p.point), low=float(p.low), high=float(p.high),
                             label=p.label) for p in record.points)
    return EvalBand(metric=metric, points=points, source=f"{path} (sha256 {str(record.sha256)[:12]})")


def with_eval_band(train: TrainConfig, record: Prediction, path: str) -> TrainConfig:
    """``train`` with the record's band as its watcher's ``eval_band`` rule (metric, points, source)."""
    band = eval_band(record, path)
    overrides = {**train.overrides, "watch.eval_band.metric": band.metric,
                 "watch.eval_band.points": band.points, "watch.eval_band.source": band.source}
    return dataclasses.replace(train, overrides=overrides)
