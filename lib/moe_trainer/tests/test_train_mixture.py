"""Training on a two-source mixture with a stage change: the per-source token metrics, and a run stopped in
the middle of the second stage and resumed reproduces the uninterrupted run bit for bit."""

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
from moe_trainer.data.mixture import MixtureConfig, MixtureStage, open_mixture
from moe_trainer.health import HealthConfig
from moe_trainer.metrics import MetricsConfig
from moe_trainer.optim import OptimizerConfig, ScheduleConfig
from moe_trainer.train import train
from moe_trainer.train_config import DataConfig, MeshConfig, TrainConfig

VOCAB, SEQ, BATCH = 64, 16, 8
MODEL = ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32,
                    max_seq_len=SEQ, n_experts=4, top_k=2, expert_d_ff=16, dispatch="ragged")


def _cache(path: Path, seed: int, stride: int) -> str:
    """Arithmetic progressions with one stride per source: the sources are told apart by their statistics."""
    rng = np.random.default_rng(seed)
    docs = [((int(rng.integers(0, 63)) + stride * np.arange(int(rng.integers(10, 40)))) % 63 + 1, "d", 30)
            for _ in range(150)]
    header = CacheHeader(tokenizer={"name": "synthetic"}, vocab_size=VOCAB, eos_id=0)
    writer = CacheWriter(str(path), header)
    write_shard(str(path), "00000", header, docs)
    writer.write_manifest(["00000"])
    return str(path)


@pytest.fixture(scope="module")
def mixture(tmp_path_factory: pytest.TempPathFactory) -> MixtureConfig:
    root = tmp_path_factory.mktemp("sources")
    return MixtureConfig(
        sources={"one": _cache(root / "one", 0, 1), "five": _cache(root / "five", 1, 5)},
        weights={"one": 0.75, "five": 0.25},
        stages=(MixtureStage(3, {"one": 0.2, "five": 0.8}),),
        block_size=32,
    )


def _config(mixture: MixtureConfig, out: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(
        model=MODEL,
        data=DataConfig(mixture=mixture, seq_len=SEQ, batch_size=BATCH, seed=3, prefetch=2),
        optimizer=OptimizerConfig(lr=1e-2),
        schedule=ScheduleConfig(kind="constant", warmup_steps=0),
        health=HealthConfig(max_grad_norm=1.0, skip_loss_sigma=None, skip_grad_sigma=None),
        checkpoint=CheckpointConfig(every_steps=100, keep=2, async_save=False),
        metrics=MetricsConfig(wandb_mode="disabled", progress_bar=False),
        mesh=MeshConfig(data=1),
        num_steps=6,
        output_dir=str(out),
        matmul_precision="highest",
        **kw,
    )


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_mixture_metrics_and_resume_mid_stage_is_bit_exact(mixture: MixtureConfig, tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    train(_config(mixture, whole))
    rows = _rows(whole)
    loader = open_mixture(mixture, BATCH, SEQ, seed=3)
    for r in rows:  # row k: after k updates, so the data of steps [0, k)
        assert {k: r[f"tokens/{k}"] for k in ("one", "five")} == loader.tokens_seen(r["step"])
        assert r["epoch/five"] == pytest.approx(loader.epochs(r["step"])["five"])
    seen = [rows[i]["tokens/five"] - (rows[i - 1]["tokens/five"] if i else 0) for i in range(len(rows))]
    assert sum(seen[:3]) < sum(seen[3:])  # the second stage draws mostly from `five`

    cut = tmp_path / "cut"
    first = train(dataclasses.replace(_config(mixture, cut), run_steps=4))  # stops one step into stage 1
    assert first.step == 4
    train(_config(mixture, cut))
    assert [r["loss"] for r in _rows(cut)] == [r["loss"] for r in rows]
    assert [r["tokens/one"] for r in _rows(cut)] == [r["tokens/one"] for r in rows]


def test_train_cache_and_mixture_together_are_refused(mixture: MixtureConfig) -> None:
    with pytest.raises(ValueError, match="train_cache=.* and data.mixture.sources are both set"):
        DataConfig(train_cache="/somewhere", mixture=mixture)
