"""Injected trouble in real tiny training runs raises the right alert on the local tracker, in bounded steps.

Two shared trainer configurations (so the train step compiles twice in all): a healthy MoE trained on
arithmetic progressions (the false-positive check, and the runs with faults injected through the data: a loss
spike, NaN gradients, a stalled step) and a faulty one (update-norm clipping off, a tiny capacity factor).
Each run's alerts.jsonl is posted to a local issue by the engine's AlertPoster, as the issue publisher does
while the step runs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marin.status.alerts import fold, parse_events
from moe_trainer.checkpoint import CheckpointConfig
from moe_trainer.config import ModelConfig
from moe_trainer.health import HealthConfig
from moe_trainer.metrics import MetricsConfig
from moe_trainer.optim import OptimizerConfig, ScheduleConfig
from moe_trainer.train import train
from moe_trainer.train_config import DataConfig, MeshConfig, TrainConfig
from moe_trainer.watch import LossSpike, Stall
from tests.health.issue import post_alerts

VOCAB, SEQ, BATCH = 64, 32, 8
# The compile key of lib/moe_trainer/tests/test_train.py's `_config` (model, optimizer, schedule, health,
# num_steps, seed, mesh, batch, precision), so a suite run compiles the healthy train step once for both
# files; `run_steps` stops these runs early.
MODEL = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                    max_seq_len=SEQ, n_experts=4, top_k=2, expert_d_ff=32, n_shared_experts=1,
                    capacity_factor=None, aux_loss_coef=1e-2, router_z_loss_coef=1e-3, logit_z_loss_coef=1e-4,
                    dispatch="ragged", compute_dtype="float32")
BASE = TrainConfig(model=MODEL, data=DataConfig(seq_len=SEQ, batch_size=BATCH, seed=1, prefetch=2),
                   optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.01),
                   schedule=ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1),
                   health=HealthConfig(max_grad_norm=1.0, update_window=16, update_sigma=4.0, skip_window=16,
                                       skip_loss_sigma=6.0, skip_grad_sigma=None),
                   checkpoint=CheckpointConfig(every_steps=1000, keep=1),
                   metrics=MetricsConfig(wandb_mode="disabled", progress_bar=False),
                   mesh=MeshConfig(data=1, expert=1, model=1), num_steps=160, run_steps=64,
                   matmul_precision="highest")
SPIKE_FROM, NAN_STEPS, SLEEP_AT = 52, (8, 9, 10), 16


Posted = dict[str, list[str]]


@dataclasses.dataclass
class Progressions:
    """Arithmetic progressions mod 63 (two tokens of context predict the next), with faults from given steps:
    random targets (a loss spike), a NaN in the loss mask (NaN loss and gradients), a sleep (a stall)."""

    spike_from: int | None = None
    nan_steps: tuple[int, ...] = ()
    sleep_at: int | None = None
    sleep_s: float = 0.0

    def batch(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([7, step])
        start = rng.integers(0, 63, size=(BATCH, 1))
        stride = rng.choice([1, 2, 5], size=(BATCH, 1))
        toks = ((start + stride * np.arange(SEQ + 1)) % 63 + 1).astype(np.int32)
        targets = toks[:, 1:].copy()
        if self.spike_from is not None and step >= self.spike_from:
            targets = rng.integers(1, VOCAB, size=targets.shape).astype(np.int32)
        mask = np.ones((BATCH, SEQ), np.float32)
        if step in self.nan_steps:
            mask[0, 0] = np.nan
        if step == self.sleep_at:
            time.sleep(self.sleep_s)
        return {"inputs": toks[:, :-1], "targets": targets, "segment_ids": np.ones((BATCH, SEQ), np.int32),
                "loss_mask": mask}


@dataclasses.dataclass
class Run:
    path: Path
    events: list[dict[str, Any]]
    rows: list[dict[str, Any]]

    def fired(self, rule: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "fired" and e["rule"] == rule]

    def fired_rules(self) -> set[str]:
        return {e["rule"] for e in self.events if e["event"] == "fired"}


Runs = dict[str, Run]


def _run(root: Path, name: str, source: Progressions, config: TrainConfig = BASE, **watch: Any) -> Run:
    out = root / name
    cfg = dataclasses.replace(config, output_dir=str(out), watch=dataclasses.replace(config.watch, **watch))
    t0 = time.time()
    train(cfg, batch_source=source)
    events = parse_events((out / "alerts.jsonl").read_text().splitlines()) \
        if (out / "alerts.jsonl").exists() else []
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    print(f"{name}: {time.time() - t0:.1f} s")
    return Run(out, events, rows)


# Two compilations of the tiny train step: a few minutes on a loaded 2-core machine (past the default limit)
pytestmark = pytest.mark.timeout(2400)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The healthy run with default rules; one run with three faults at separate steps (NaN gradients, a
    3-second stall, then a loss spike), its stall and spike windows shortened through the watch config as an
    experiment would; and the faulty configuration (update-norm clipping off, capacity factor 0.25)."""
    root = tmp_path_factory.mktemp("runs")
    faulty = dataclasses.replace(BASE, model=dataclasses.replace(MODEL, capacity_factor=0.25),
                                 health=dataclasses.replace(BASE.health, update_window=0), num_steps=12,
                                 run_steps=None)
    trouble = Progressions(spike_from=SPIKE_FROM, nan_steps=NAN_STEPS, sleep_at=SLEEP_AT, sleep_s=3.0)
    return {
        "healthy": _run(root, "healthy", Progressions()),
        "trouble": _run(root, "trouble", trouble, loss_spike=LossSpike(trailing=32),
                        stall=Stall(no_progress_s=1.0), heartbeat_s=0.2, blind_after_s=30.0),
        "faulty": _run(root, "faulty", Progressions(), faulty),
    }


@pytest.fixture(scope="module")
def posted(runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The comments each run's alerts made on a local issue (one issue per run)."""
    return {name: _post(run, tmp_path_factory.mktemp(f"prefix-{name}")) for name, run in runs.items()}


def _post(run: Run, prefix: Path, status: str = "SUCCESS") -> list[str]:
    """Post the run's alerts to a local issue as the issue publisher does; returns the new comment bodies."""
    return post_alerts(run.path, prefix, status=status)


def test_healthy_run_raises_no_alert(runs: Runs, posted: Posted) -> None:
    # throughput is left out: on a machine shared with other test runs, a real slowdown is a real alert
    fired = runs["healthy"].fired_rules() - {"throughput"}
    assert fired == set(), [e["summary"] for e in runs["healthy"].events]
    assert all(not r.get("skipped") for r in runs["healthy"].rows if "loss" in r)
    assert not [b for b in posted["healthy"] if "Alert: `throughput`" not in b]


def test_loss_spike_fires_within_ten_steps_and_is_posted(runs: Runs, posted: Posted) -> None:
    spike = runs["trouble"]
    (first,) = spike.fired("loss_spike")
    # row k is after k updates: the batch of step 52 makes row 53; the floor of 8 rows rises at row 60
    assert SPIKE_FROM + 1 <= first["step"] <= SPIKE_FROM + 10, first
    assert first["severity"] == "critical" and first["values"]["floor"] > first["values"]["threshold"]
    assert "alert" in {k for r in spike.rows for k in r}  # the event is in metrics.jsonl too
    comments = [b for b in posted["trouble"] if "Alert: `loss_spike`" in b]
    assert len(comments) == 1 and f"step {first['step']}" in comments[0]
    assert "http://dash.local/steps/" in comments[0]


def test_nan_gradients_fire_nonfinite_and_skipped_steps(runs: Runs, posted: Posted) -> None:
    nan = runs["trouble"]
    (first,) = nan.fired("nonfinite")
    assert first["step"] == NAN_STEPS[0] + 1 and first["values"]["skipped"] is True
    skips = nan.fired("skipped_steps")
    assert skips[0]["step"] == NAN_STEPS[-1] + 1  # the third skipped step in the window
    resolved = {e["id"] for e in nan.events if e["event"] == "resolved"}
    assert first["id"] in resolved  # the loss became finite again
    bodies = posted["trouble"]
    (comment,) = [b for b in bodies if "Alert: `nonfinite`" in b]
    assert "**What:** non-finite" in comment and f"**Where:** step {first['step']}" in comment
    assert sum("Resolved: `nonfinite`" in b for b in bodies) == 1


def test_stalled_step_fires_stall_then_resolves(runs: Runs, posted: Posted) -> None:
    stall = runs["trouble"]
    (first,) = stall.fired("stall")
    # the loop stops at the sleeping batch minus what was prefetched (2)
    assert SLEEP_AT - 4 <= first["step"] <= SLEEP_AT and first["values"]["idle_s"] > 1.0
    (resolution,) = [e for e in stall.events if e["event"] == "resolved" and e["id"] == first["id"]]
    assert resolution["reason"] == "the condition cleared" and resolution["step"] <= SLEEP_AT + 2
    assert sum("Alert: `stall`" in b for b in posted["trouble"]) == 1


def test_disabled_update_filter_and_tiny_capacity_fire(runs: Runs, posted: Posted) -> None:
    faulty = runs["faulty"]
    (guard,) = faulty.fired("guards")
    assert guard["step"] == 1 and "update-norm clipping is off" in guard["summary"]
    (drops,) = faulty.fired("drop_rate")
    assert drops["step"] <= 6 and drops["values"]["drop_rate"] > 0.07
    alerts = {a.rule: a for a in fold(faulty.events)}
    resolution = alerts["guards"].resolved
    assert resolution is not None and resolution["reason"] == "the attempt ended"
    bodies = posted["faulty"]
    assert sum("Alert: `guards`" in b for b in bodies) == 1
    assert sum("Alert: `drop_rate`" in b for b in bodies) == 1
