"""Warm start across architectures: a model trained without QK-norm warm-starts one with QK-norm (every
mapped parameter identical, QK-norm gains one, the first loss near the source's last), the optimizer state
carried where shapes agree, experts grown by copying, router biases zero, dropped parameters listed, an
unresolvable shape an error naming the parameter, Hugging Face directories as sources, and resume after a
warm start."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from moe_trainer.checkpoint import CheckpointConfig, load_checkpoint, read_foreign_checkpoint
from moe_trainer.compiled import StepSpec, build_mesh, compile_train_step
from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard
from moe_trainer.health import HealthConfig
from moe_trainer.metrics import MetricsConfig
from moe_trainer.model import init_params
from moe_trainer.optim import OptimizerConfig, ScheduleConfig
from moe_trainer.params import is_axes_leaf, param_logical_axes
from moe_trainer.train import train
from moe_trainer.train_config import DataConfig, MeshConfig, TrainConfig
from moe_trainer.warm_start import WarmStartConfig, flatten, map_params, read_source, warm_state

VOCAB, SEQ, BATCH = 64, 32, 8
SOURCE = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                     max_seq_len=SEQ, n_experts=4, top_k=2, expert_d_ff=32, qk_norm=False, dispatch="ragged")
TARGET = SOURCE.replace(qk_norm=True)
SOURCE_STEPS = 60
# The bound of the QK-norm warm start's first loss, in nats: the loss may jump (QK-norm with unit gains
# changes the attention logits' scale) but must stay far closer to the source's last loss than to a fresh
# model's.
FIRST_LOSS_BOUND = 0.25


def _cache(path: Path) -> str:
    """Arithmetic progressions mod 63 with a random stride: learnable from two tokens of context."""
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(500):
        n = int(rng.integers(24, 90))
        docs.append(
            ((int(rng.integers(0, 63)) + int(rng.choice([1, 2, 5, 9])) * np.arange(n)) % 63 + 1, "a", n)
        )
    header = CacheHeader(tokenizer={"name": "synthetic"}, vocab_size=VOCAB, eos_id=0)
    writer = CacheWriter(str(path), header)
    write_shard(str(path), "00000", header, docs)
    writer.write_manifest(["00000"])
    return str(path)


def _config(model: ModelConfig, cache: str, out: Path, **kw: Any) -> TrainConfig:
    base = TrainConfig(
        model=model,
        data=DataConfig(train_cache=cache, seq_len=SEQ, batch_size=BATCH, seed=1, prefetch=2),
        optimizer=OptimizerConfig(lr=1e-2),
        schedule=ScheduleConfig(kind="constant", warmup_steps=5),
        health=HealthConfig(max_grad_norm=1.0, skip_loss_sigma=None, skip_grad_sigma=None),
        checkpoint=CheckpointConfig(every_steps=1000, keep=2, async_save=False),
        metrics=MetricsConfig(wandb_mode="disabled", progress_bar=False),
        mesh=MeshConfig(data=1),
        num_steps=SOURCE_STEPS,
        output_dir=str(out),
        matmul_precision="highest",
    )
    return dataclasses.replace(base, **kw)


def _losses(out: Path) -> list[float]:
    return [
        json.loads(line)["loss"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("warm")
    cache = _cache(root / "cache")
    out = root / "source"
    train(_config(SOURCE, cache, out))
    return {"cache": cache, "dir": str(out), "losses": _losses(out), "root": root}


def _warm(
    model: ModelConfig, source: dict[str, Any], ws: WarmStartConfig, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = _config(model, source["cache"], source["root"] / "unused", seed=seed)
    spec = StepSpec(cfg.model, cfg.optimizer, cfg.schedule, cfg.health, 1, cfg.num_steps, seed, (BATCH, SEQ))
    comp = compile_train_step(spec, build_mesh(cfg.mesh))
    return warm_state(comp.init(), comp.shardings, model, source["dir"], ws, seed)


def test_qk_norm_warm_start_copies_every_parameter_and_sets_the_gains_to_one(source: dict[str, Any]) -> None:
    state, report = _warm(TARGET, source, WarmStartConfig())
    src = flatten(load_checkpoint(source["dir"]).params)
    got = flatten(jax.device_get(state.params))
    assert sorted(report["copied"]) == sorted(src) and report["dropped"] == [] and report["grown"] == {}
    for name, value in src.items():
        assert np.array_equal(got[name], np.asarray(value)), name  # bit for bit
    new = {f"layers/{i}/attn/{n}" for i in range(2) for n in ("q_norm", "k_norm")}
    assert set(report["new"]) == new and set(report["new"].values()) == {"ones (norm gain)"}
    for name in new:
        assert np.array_equal(got[name], np.ones(8, np.float32)), name
    assert int(state.step) == 0 and int(state.data_position) == 0 and report["kind"] == "checkpoint"


def test_first_loss_after_a_qk_norm_warm_start_is_close_to_the_source_loss(source: dict[str, Any]) -> None:
    """Marin's 32B rescue at tiny scale: the warm-started QK-norm model continues the source's data stream;
    its first loss is within FIRST_LOSS_BOUND nats of the source's last loss (a fresh model starts ~ln 64 =
    4.16 nats, far above), and a run cut after two steps resumes from its own checkpoint, not init_from."""
    src_last, src_first = source["losses"][-1], source["losses"][0]
    assert src_first - src_last > 4 * FIRST_LOSS_BOUND  # the source learnt: the bound is a small fraction
    ws = WarmStartConfig(data_position="carry")
    out = source["root"] / "warm"
    cfg = _config(TARGET, source["cache"], out, init_from=source["dir"], warm_start=ws, num_steps=6)
    train(cfg)
    warm = _losses(out)
    assert abs(warm[0] - src_last) < FIRST_LOSS_BOUND, (warm[0], src_last)
    print(
        f"source first/last loss {src_first:.3f}/{src_last:.3f}, QK-norm warm start first loss {warm[0]:.3f}"
    )
    report = json.loads((out / "warm_start.json").read_text())
    assert report["data_position"] == SOURCE_STEPS and report["source_step"] == SOURCE_STEPS
    cut = source["root"] / "warm-cut"
    train(dataclasses.replace(cfg, output_dir=str(cut), run_steps=2))
    train(dataclasses.replace(cfg, output_dir=str(cut)))
    assert _losses(cut) == warm


def test_optimizer_state_is_carried_where_shapes_agree(source: dict[str, Any]) -> None:
    state, report = _warm(TARGET, source, WarmStartConfig(optimizer_state="carry"))
    raw, _, _ = read_foreign_checkpoint(source["dir"])
    src_opt = flatten(raw["opt_state"])
    got = flatten(jax.device_get(state.opt_state))
    carried = [n for n in got if n in src_opt and np.shape(src_opt[n]) == np.shape(got[n])]
    assert report["optimizer_state"] == {
        "mode": "carry",
        "carried_leaves": len(carried),
        "reset_leaves": len(got) - len(carried),
    }
    for name in carried:
        assert np.array_equal(np.asarray(got[name]), np.asarray(src_opt[name])), name
    fresh_moments = [n for n in got if n.endswith(("q_norm", "k_norm"))]
    assert fresh_moments and all(not np.asarray(got[n]).any() for n in fresh_moments)
    assert any(n.endswith("count") for n in carried)  # Adam's step count continues
    reset, _ = _warm(TARGET, source, WarmStartConfig())
    assert all(
        not np.asarray(v).any()
        for k, v in flatten(jax.device_get(reset.opt_state)).items()
        if "mu" in k.split("/")
    )


def _flat_init(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in flatten(init_params(cfg, jax.random.key(seed))).items()}


def _axes(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    return flatten(param_logical_axes(cfg), is_leaf=is_axes_leaf)


@pytest.mark.parametrize("noise", [0.0, 0.05], ids=["exact-copies", "noisy-copies"])
def test_new_experts_copy_source_experts_and_router_bias_starts_at_zero(noise: float) -> None:
    src_cfg = SOURCE.replace(n_shared_experts=1, shared_d_ff=16)
    dst_cfg = SOURCE.replace(n_experts=6, balance="aux_free")  # grows experts, adds biases, drops shared
    src = _flat_init(src_cfg, 1)
    out, report = map_params(
        src, _flat_init(dst_cfg, 2), _axes(dst_cfg), WarmStartConfig(expert_noise=noise), 0
    )
    assert report["dropped"] == sorted(
        f"layers/{i}/moe/shared/{w}" for i in range(2) for w in ("w_down", "w_gate", "w_up")
    )
    for i in range(2):
        pre = f"layers/{i}/moe/"
        assert report["new"][pre + "router_bias"] == "zeros (router bias)"
        assert np.array_equal(out[pre + "router_bias"], np.zeros(6, np.float32))
        for w in ("w_gate", "w_up", "w_down"):
            assert report["grown"][pre + w] == {"from": [4, 32, 32], "to": [6, 32, 32], "new_entries": "copy"}
            assert np.array_equal(out[pre + w][:4], src[pre + w])
            for e in (4, 5):
                if noise == 0.0:
                    assert np.array_equal(out[pre + w][e], src[pre + w][e - 4])
                else:
                    rel = out[pre + w][e] / src[pre + w][e - 4] - 1
                    assert 0.5 * noise < rel.std() < 1.5 * noise
        router = out[pre + "router"]
        assert router.shape == (32, 6) and np.array_equal(router[:, :4], src[pre + "router"])
        if noise == 0.0:
            assert np.array_equal(router[:, 4:], src[pre + "router"][:, :2])


def test_new_experts_can_start_from_the_fresh_initialisation() -> None:
    dst_cfg = SOURCE.replace(n_experts=6)
    fresh = _flat_init(dst_cfg, 2)
    out, _ = map_params(_flat_init(SOURCE, 1), fresh, _axes(dst_cfg), WarmStartConfig(new_experts="init"), 0)
    w = "layers/1/moe/w_up"
    assert np.array_equal(out[w][4:], fresh[w][4:]) and not np.array_equal(out[w][:4], fresh[w][:4])


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"expert_d_ff": 48}, "layers/0/moe/w_down"),
        ({"n_experts": 2}, "layers/0/moe/router"),  # fewer experts: nothing says which to keep
        ({"vocab_size": 80}, "embed"),
    ],
    ids=["expert-width", "fewer-experts", "vocab"],
)
def test_an_unresolvable_shape_mismatch_names_the_parameter(changes: dict[str, Any], name: str) -> None:
    dst_cfg = SOURCE.replace(**changes)
    with pytest.raises(ValueError, match=f"parameter '{name}' has shape .* warm_start.rename"):
        map_params(_flat_init(SOURCE, 1), _flat_init(dst_cfg, 2), _axes(dst_cfg), WarmStartConfig(), 0)


def test_rename_maps_a_source_parameter_onto_another_path() -> None:
    src = _flat_init(SOURCE, 1)
    src = {k.replace("/mlp_norm", "/post_attn_norm"): v for k, v in src.items()}  # a source with other names
    out, report = map_params(
        src,
        _flat_init(SOURCE, 2),
        _axes(SOURCE),
        WarmStartConfig(rename={r"/post_attn_norm$": "/mlp_norm"}),
        0,
    )
    assert report["new"] == {} and report["dropped"] == []
    assert np.array_equal(out["layers/1/mlp_norm"], src["layers/1/post_attn_norm"])


def test_a_hugging_face_directory_is_a_source(tmp_path: Path) -> None:
    from moe_trainer.hf import save_hf
    from moe_trainer.model import Model

    params = init_params(TARGET, jax.random.key(7))
    save_hf(Model(TARGET, params), str(tmp_path / "hf"))
    src = read_source(str(tmp_path / "hf"))
    assert src.kind == "hf" and src.opt_state is None
    dst_cfg = TARGET.replace(n_experts=8)
    out, report = map_params(
        flatten(src.params), _flat_init(dst_cfg, 0), _axes(dst_cfg), WarmStartConfig(expert_noise=0.0), 0
    )
    assert np.array_equal(out["layers/0/attn/wq"], np.asarray(params["layers"][0]["attn"]["wq"]))
    assert np.array_equal(out["layers/0/moe/w_down"][4:], np.asarray(params["layers"][0]["moe"]["w_down"]))
    assert len(report["grown"]) == 8 and report["new"] == {} and report["dropped"] == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_source(str(tmp_path / "nowhere"))
