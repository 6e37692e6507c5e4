"""A train step scored against a pre-registered prediction gets its band as a health rule, with no risk point
written by hand: real tiny training runs through the ladder's target operator (``train_target``), which reads
``prediction.json`` through the hash-checked reader and hands the watcher one band point per evaluation.

- "outside": a band the run must miss at its first two evaluations (far below any bits per byte a model of
  noisy progressions reaches) and a wide one at the last two: ``eval_band`` fires at the first evaluation,
  resolves at the third, and the local issue gets one alert and one resolution.
- "inside": the band is the outside run's own evaluations +-1% (the runs are deterministic: same config,
  data and seeds), so it lands inside at every point and nothing about the band is raised or posted.
- a record edited after it was written is refused before anything trains.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moe_trainer.checkpoint import CheckpointConfig
from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard
from moe_trainer.health import HealthConfig
from moe_trainer.optim import OptimizerConfig, ScheduleConfig
from moe_trainer.train_config import MeshConfig
from openlab_records import PREDICTION_FILE, RecordTamperedError, write_sealed
from operators.scaling.target import TargetTrainConfig, train_target
from operators.train import TrainConfig
from tests.health.issue import post_alerts

VOCAB, SEQ, BATCH, STEPS, EVERY = 64, 32, 8, 40, 10
EVAL_STEPS = (10, 20, 30, 40)
CONFIG_HASH = "c" * 64
MODEL = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                    max_seq_len=SEQ, n_experts=4, top_k=2, expert_d_ff=32, n_shared_experts=1,
                    capacity_factor=None, aux_loss_coef=1e-2, router_z_loss_coef=1e-3, logit_z_loss_coef=1e-4,
                    dispatch="ragged", compute_dtype="float32")
OVERRIDES = {"optimizer": OptimizerConfig(lr=1e-2, weight_decay=0.01),
             "schedule": ScheduleConfig(kind="cosine", warmup_steps=5, min_lr_ratio=0.1),
             "health": HealthConfig(max_grad_norm=1.0, update_window=16, update_sigma=4.0, skip_window=16,
                                    skip_loss_sigma=6.0, skip_grad_sigma=None),
             "checkpoint": CheckpointConfig(every_steps=1000, keep=1),
             "mesh": MeshConfig(data=1, expert=1, model=1), "matmul_precision": "highest",
             "eval.batch_size": 8}

pytestmark = pytest.mark.timeout(1800)  # one compilation of the tiny train step and of its evaluation


def _cache(path: Path, rng: np.random.Generator, n: int, domain: str) -> str:
    """Arithmetic progressions mod 63 with 3% noise (two tokens of context predict the next)."""
    docs = []
    for _ in range(n):
        length = int(rng.integers(24, 90))
        toks = (int(rng.integers(0, 63)) + int(rng.choice([1, 2, 5, 9])) * np.arange(length)) % 63 + 1
        noise = rng.random(length) < 0.03
        toks[noise] = rng.integers(1, VOCAB, size=int(noise.sum()))
        docs.append((toks, domain, 3 * length))
    header = CacheHeader(tokenizer={"name": "synthetic"}, vocab_size=VOCAB, eos_id=0)
    writer = CacheWriter(str(path), header)
    write_shard(str(path), "00000", header, docs)
    writer.write_manifest(["00000"])
    return str(path)


def _prediction(root: Path, band: list[tuple[float, float, float]]) -> str:
    """A sealed prediction record (the fields train_target and the band read), one band per eval step."""
    points = [{"label": f"{s / STEPS:.0%}", "fraction": s / STEPS, "step": s, "point": p, "low": lo,
               "high": hi} for s, (p, lo, hi) in zip(EVAL_STEPS, band, strict=True)]
    write_sealed(str(root / PREDICTION_FILE), {
        "schema": "marin-prediction/v1", "experiment": "test_band", "issue": "local/health#1",
        "metric": {"name": "micro.bpb", "path": "eval.micro.bpb"}, "points": points,
        "target": {"name": "tiny", "config_hash": CONFIG_HASH}})
    return str(root)


def _target(root: Path, caches: dict[str, Any], prediction: str) -> dict[str, Any]:
    train = TrainConfig(output_path=str(root), train_cache=caches["train"], validation=caches["val"],
                        model=MODEL, overrides=OVERRIDES, num_steps=STEPS, batch_size=BATCH, seq_len=SEQ,
                        eval_every=EVERY, wandb_mode="disabled", progress_bar=False)
    return train_target(TargetTrainConfig(train=train, prediction=prediction, target_config_hash=CONFIG_HASH,
                                          require_posted=False))


def _events(out: Path, rule: str) -> list[dict[str, Any]]:
    lines = (out / "alerts.jsonl").read_text().splitlines() if (out / "alerts.jsonl").exists() else []
    return [e for e in map(json.loads, lines) if e["rule"] == rule]


def _evals(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval"]["micro"]["bpb"] for r in rows if "eval" in r}


@dataclasses.dataclass
class BandRuns:
    root: Path
    outside: Path
    inside: Path
    caches: dict[str, Any]


@pytest.fixture(scope="module")
def band_runs(tmp_path_factory: pytest.TempPathFactory) -> BandRuns:
    root = tmp_path_factory.mktemp("band")
    rng = np.random.default_rng(0)
    caches = {"train": _cache(root / "train", rng, 300, "synthetic"),
              "val": {"arith": _cache(root / "val", rng, 20, "arith")}}
    missed = [(0.0015, 0.001, 0.002)] * 2 + [(5.0, 0.0, 100.0)] * 2
    _target(root / "outside", caches, _prediction(root / "prediction-outside", missed))
    actual = _evals(root / "outside")
    tight = [(actual[s], actual[s] * 0.99, actual[s] * 1.01) for s in EVAL_STEPS]
    _target(root / "inside", caches, _prediction(root / "prediction-inside", tight))
    return BandRuns(root, root / "outside", root / "inside", caches)


def test_an_eval_outside_the_band_fires_is_posted_and_resolves_inside(band_runs: BandRuns) -> None:
    out = band_runs.outside
    resolved_config = json.loads((out / "train_config.json").read_text())["watch"]["eval_band"]
    assert [p["step"] for p in resolved_config["points"]] == list(EVAL_STEPS)  # from the record, not by hand
    assert "prediction-outside/prediction.json (sha256 " in resolved_config["source"]
    fired, resolved = _events(out, "eval_band")
    assert (fired["event"], fired["step"], fired["severity"]) == ("fired", EVAL_STEPS[0], "warning")
    assert fired["values"]["high"] == 0.002 and fired["values"]["value"] > 0.002
    assert (resolved["event"], resolved["step"], resolved["reason"]) == ("resolved", EVAL_STEPS[2],
                                                                         "the condition cleared")
    bodies = post_alerts(out, band_runs.root / "issue-outside")
    (alert,) = [b for b in bodies if "Alert: `eval_band`" in b]
    assert "outside the pre-registered band [0.0010, 0.0020]" in alert and f"step {EVAL_STEPS[0]}" in alert
    assert sum("Resolved: `eval_band`" in b for b in bodies) == 1


def test_an_eval_inside_the_band_raises_nothing(band_runs: BandRuns) -> None:
    assert _evals(band_runs.inside) == pytest.approx(_evals(band_runs.outside), rel=1e-3)
    assert _events(band_runs.inside, "eval_band") == []
    bodies = post_alerts(band_runs.inside, band_runs.root / "issue-inside")
    assert not [b for b in bodies if "eval_band" in b]


def test_a_prediction_edited_after_the_fact_is_refused_before_training(band_runs: BandRuns) -> None:
    prediction = Path(_prediction(band_runs.root / "prediction-edited", [(1.0, 0.9, 1.1)] * 4))
    record = json.loads((prediction / PREDICTION_FILE).read_text())
    record["points"][0]["high"] = 50.0  # widening the band after the forecast was frozen
    (prediction / PREDICTION_FILE).write_text(json.dumps(record))
    with pytest.raises(RecordTamperedError, match="was edited after it was written"):
        _target(band_runs.root / "edited", band_runs.caches, str(prediction))
    assert not (band_runs.root / "edited" / "metrics.jsonl").exists()
