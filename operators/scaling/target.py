"""The target-train steps: runs that start only once the forecast is frozen, and posted to the issue.

**target train** (``train_target``) runs the target with the train operator, but first: it reads the
prediction record (refusing one whose hash does not match its content), checks that the record names this
target's config hash (config drift since the forecast is refused), and, when ``require_posted``, waits until
the engine has posted the record to the issue (``posted.json`` next to the record, naming its hash; the
engine writes it after creating the comment). It then writes ``tracking.json`` (the engine reads it to show
"on track / off track" while the run's evaluations land in metrics.jsonl) and trains, its watcher given the
record's band as the ``eval_band`` health rule (:mod:`.band`). The DAG makes the target depend on the
prediction step, so it cannot start before the record exists.

**after the forecast** (``train_after_forecast``): a run that must start only once the record is frozen and
posted, without being scored against it (the target at other learning rates: :mod:`.lrcheck`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from openlab_records import (
    POSTED_FILE,
    PREDICTION_FILE,
    TRACKING_FILE,
    Posted,
    Prediction,
    RecordFormatError,
    Tracking,
    read_json,
    read_sealed,
    write_json_atomic,
)
from operators.scaling.band import with_eval_band
from operators.train import TrainConfig, runtime_field, train


@dataclasses.dataclass(frozen=True)
class TargetTrainConfig:
    train: TrainConfig
    """The target's training run (its output_path is this step's)."""
    prediction: str
    """The prediction step's output path."""
    target_config_hash: str
    """Must equal the record's target.config_hash."""
    require_posted: bool = True
    """Wait for the engine's posted.json (the record is on the issue) before training."""
    post_timeout_s: float = runtime_field(default=600.0)
    """How long to wait for posted.json."""


@dataclasses.dataclass(frozen=True)
class AfterForecastConfig:
    train: TrainConfig
    """The run (its output_path is this step's)."""
    prediction: str
    """The prediction step's output path: the run starts only once the forecast is frozen."""
    require_posted: bool = True
    """Also wait for the engine's posted.json (the record is on the issue), as the target does."""
    post_timeout_s: float = runtime_field(default=600.0)
    """How long to wait for posted.json."""


def _wait_posted(prediction: str, sha: str, timeout_s: float) -> Posted:
    path = f"{prediction.rstrip('/')}/{POSTED_FILE}"
    deadline = time.time() + timeout_s
    while True:
        try:
            raw = read_json(path)
        except RecordFormatError:
            raw = None  # a receipt being written by a store without atomic renames: look again
        posted = None if raw is None else Posted.from_json(raw, path)
        if posted is not None and posted.prediction_sha256 == sha:
            return posted
        if time.time() > deadline:
            raise TimeoutError(
                f"target: the prediction {sha[:12]} was not posted to its issue within "
                f"{timeout_s:.0f} s (no {path} naming it). The issue-tracker publisher posts it "
                "when the prediction step succeeds; check the run's publisher errors, or set "
                "require_posted=False for a ladder without an issue"
            )
        time.sleep(0.25)


def _frozen(prediction: str) -> tuple[str, Prediction, str]:
    """The prediction record's path, the record and its hash, checked (a record edited since is refused)."""
    path = f"{prediction.rstrip('/')}/{PREDICTION_FILE}"
    record = Prediction.from_json(read_sealed(path), path)
    assert record.sha256 is not None  # read_sealed checked it
    return path, record, record.sha256


def train_target(config: TargetTrainConfig) -> dict[str, Any]:
    """Check the frozen forecast, wait until it is posted, record what is tracked, then train."""
    record_path, record, sha = _frozen(config.prediction)
    if record.target_config_hash != config.target_config_hash:
        raise ValueError(
            f"target: the prediction names config {record.target_config_hash} but this target "
            f"is {config.target_config_hash}: the config changed after the forecast; re-run the "
            "prediction for the new config (a new record) instead of scoring an old one"
        )
    posted = (
        _wait_posted(config.prediction, sha, config.post_timeout_s)
        if config.require_posted
        else None
    )
    tracking = Tracking(
        prediction=record_path,
        prediction_sha256=sha,
        metric_path=record.metric_path,
        details={"posted": posted.to_json() if posted is not None else None},
    )
    write_json_atomic(f"{config.train.output_path.rstrip('/')}/{TRACKING_FILE}", tracking.to_json())
    return train(with_eval_band(config.train, record, record_path))


def train_after_forecast(config: AfterForecastConfig) -> dict[str, Any]:
    """Train a run that must not start before the forecast is frozen and posted, such as the target at
    another learning rate: the record is read first, as the target reads it (its hash checked, a malformed
    record refused naming the field); the forecast's tracking does not apply (no tracking.json, no band
    alert)."""
    _, _, sha = _frozen(config.prediction)
    if config.require_posted:
        _wait_posted(config.prediction, sha, config.post_timeout_s)
    return train(config.train)
