"""End-to-end training on a tiny MoE: learning, resume bit-exactness, spike skipping, 1 vs 8 devices,
gradient accumulation with the real loss, evaluation sums, checkpoint loading and the CLI parser.

All runs share one model/optimizer/health configuration so the jitted train step compiles once per mesh
(``compiled.compile_train_step`` is cached); only ``output_dir``/``num_steps``/``run_steps`` vary where noted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_trainer import optim
from moe_trainer.checkpoint import CheckpointConfig, load_checkpoint
from moe_trainer.compiled import StepSpec, build_mesh, compile_train_step
from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, write_shard
from moe_trainer.data.loader import TrainLoader
from moe_trainer.evaluate import EvalConfig, evaluate
from moe_trainer.health import HealthConfig
from moe_trainer.loss import make_lm_loss
from moe_trainer.metrics import MetricsConfig
from moe_trainer.model import Model, init_params
from moe_trainer.optim import OptimizerConfig, ScheduleConfig
from moe_trainer.step import accumulate_gradients
from moe_trainer.train import parse_config, train
from moe_trainer.train_config import DataConfig, MeshConfig, TrainConfig

VOCAB = 64
EOS = 0
SEQ = 32
BATCH = 8
ROW_KEYS = {"step", "loss", "lr", "grad_norm", "update_norm", "skipped", "clipped", "tokens_per_s", "mfu",
            "aux_loss", "router_z_loss", "logit_z_loss", "drop_rate", "expert_load", "routing_entropy",
            "time"}

MODEL = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                    max_seq_len=SEQ, n_experts=4, top_k=2, expert_d_ff=32, n_shared_experts=1,
                    capacity_factor=None, aux_loss_coef=1e-2, router_z_loss_coef=1e-3, logit_z_loss_coef=1e-4,
                    dispatch="ragged", compute_dtype="float32")


def _docs(rng: np.random.Generator, n: int, domain: str) -> list[tuple[np.ndarray, str, int]]:
    """Arithmetic progressions mod 63 (ids 1..63) with a random start and stride and 3% noise: the unigram
    distribution is nearly uniform (~4.1 nats) while two tokens of context predict the next one."""
    docs = []
    for _ in range(n):
        length = int(rng.integers(24, 90))
        start, stride = int(rng.integers(0, 63)), int(rng.choice([1, 2, 5, 9]))
        toks = (start + stride * np.arange(length)) % 63 + 1
        noise = rng.random(length) < 0.03
        toks[noise] = rng.integers(1, VOCAB, size=int(noise.sum()))
        docs.append((toks, domain, 3 * length))  # pretend every token was 3 UTF-8 bytes
    return docs


def _write_cache(path: Path, docs: list[tuple[np.ndarray, str, int]]) -> str:
    header = CacheHeader(tokenizer={"name": "synthetic"}, vocab_size=VOCAB, eos_id=EOS)
    writer = CacheWriter(str(path), header)
    write_shard(str(path), "00000", header, docs)
    writer.write_manifest(["00000"])
    return str(path)


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("caches")
    rng = np.random.default_rng(0)
    train_path = _write_cache(root / "train", _docs(rng, 600, "synthetic"))
    val = {"arith": _write_cache(root / "val-arith", _docs(rng, 30, "arith")),
           "arith2": _write_cache(root / "val-arith2", _docs(rng, 12, "arith2"))}
    toks = TokenCache(train_path).read(0, TokenCache(train_path).num_tokens)
    p = np.bincount(toks, minlength=VOCAB) / toks.size
    unigram = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    return {"train": train_path, "val": val, "unigram_entropy": unigram}


def _config(caches: dict[str, Any], out: Path, **kw: Any) -> TrainConfig:
    base = TrainConfig(
        model=MODEL,
        data=DataConfig(train_cache=caches["train"], validation=caches["val"], seq_len=SEQ, batch_size=BATCH,
                        seed=1, prefetch=2),
        optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.01),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1),
        health=HealthConfig(max_grad_norm=1.0, update_window=16, update_sigma=4.0, skip_window=16,
                            skip_loss_sigma=6.0, skip_grad_sigma=None),
        checkpoint=CheckpointConfig(every_steps=50, keep=2),
        eval=EvalConfig(every_steps=0, batch_size=8),
        metrics=MetricsConfig(wandb_mode="offline", progress_bar=False),
        mesh=MeshConfig(data=1, expert=1, model=1),
        num_steps=160,
        output_dir=str(out),
        matmul_precision="highest",
    )
    return dataclasses.replace(base, **kw)


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def learned(caches: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("learn") / "run"
    result = train(_config(caches, out))
    return {"result": result, "out": out, "rows": _rows(out)}


def test_tiny_moe_learns_below_unigram_entropy(learned: dict[str, Any], caches: dict[str, Any]) -> None:
    rows = [r for r in learned["rows"] if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 161))
    last = float(np.mean([r["ce_loss"] for r in rows[-10:]]))
    # A model that only learnt token frequencies would sit at the unigram entropy (~4.1 nats).
    assert last < 0.5 * caches["unigram_entropy"], (last, caches["unigram_entropy"])
    ev = learned["result"].eval
    assert ev is not None and ev["macro"]["loss"] < 0.5 * caches["unigram_entropy"]


def test_metrics_rows_wandb_reference_and_eval_outputs(learned: dict[str, Any]) -> None:
    out, rows = learned["out"], learned["rows"]
    train_rows = [r for r in rows if "loss" in r]
    for r in train_rows:
        assert set(r) >= ROW_KEYS, ROW_KEYS - set(r)
        assert len(r["expert_load"]) == 2 and len(r["expert_load"][0]) == 4
        assert r["expert_load"][0] and abs(sum(r["expert_load"][0]) - 1.0) < 1e-4
    assert train_rows[0]["lr"] == pytest.approx(1e-2 / 10)  # row k: the lr of update k (schedule step k-1)
    assert train_rows[-1]["lr"] == pytest.approx(1e-3, rel=1e-4)
    assert all(r["drop_rate"] == 0.0 for r in train_rows)  # dropless model
    assert train_rows[-1]["mfu"] > 0 and train_rows[-1]["tokens_per_s"] > 0
    eval_rows = [r for r in rows if "eval" in r]
    assert [r["step"] for r in eval_rows] == [160]
    ev = eval_rows[0]["eval"]
    assert set(ev["domains"]) == {"arith", "arith2"} and {"loss", "bpb", "tokens",
                                                          "bytes"} <= set(ev["micro"])
    assert json.loads((out / "eval.json").read_text()) == ev
    ref = json.loads((out / "wandb.json").read_text())
    assert ref["mode"] == "offline" and ref["url"] is None and ref["project"] == "moe-trainer"
    assert Path(ref["dir"], "wandb").is_dir()


def test_rerunning_a_finished_run_is_a_no_op(learned: dict[str, Any], caches: dict[str, Any]) -> None:
    before = (learned["out"] / "metrics.jsonl").read_text()
    again = train(_config(caches, learned["out"]))
    assert (again.step, again.loss, again.eval) == (160, learned["result"].loss, learned["result"].eval)
    assert (learned["out"] / "metrics.jsonl").read_text() == before


def test_evaluate_sums_are_paloma_style(learned: dict[str, Any], caches: dict[str, Any]) -> None:
    model = load_checkpoint(str(learned["out"]))
    assert isinstance(model, Model) and model.config == MODEL
    ev = evaluate(model, caches["val"], seq_len=SEQ, batch_size=8)
    assert ev == learned["result"].eval  # the checkpoint holds the final parameters
    doms = ev["domains"]
    for name, d in doms.items():
        cache = TokenCache(caches["val"][name])
        assert d["tokens"] == cache.num_tokens and d["bytes"] == cache.num_bytes
        assert d["bpb"] == pytest.approx(d["loss"] * d["tokens"] / (math.log(2) * d["bytes"]))
    assert ev["macro"]["loss"] == pytest.approx(np.mean([d["loss"] for d in doms.values()]))
    nll = sum(d["loss"] * d["tokens"] for d in doms.values())
    assert ev["micro"]["loss"] == pytest.approx(nll / sum(d["tokens"] for d in doms.values()))
    assert ev["micro"]["bpb"] == pytest.approx(nll / (math.log(2) * sum(d["bytes"] for d in doms.values())))


def test_resume_is_bit_exact(learned: dict[str, Any], caches: dict[str, Any], tmp_path: Path) -> None:
    """Stop after 7 steps, lose the step-7 checkpoint (a crash before it was durable), resume from step 4,
    stop again at 12: the loss trajectory equals the uninterrupted 160-step run's, bit for bit."""
    out = tmp_path / "split"
    split = _config(caches, out, checkpoint=CheckpointConfig(every_steps=4, keep=3),
                    data=dataclasses.replace(_config(caches, out).data, validation={}))
    first = train(dataclasses.replace(split, run_steps=7))  # saves at 4 and (end of invocation) 7
    assert first.step == 7
    shutil.rmtree(out / "checkpoints" / "7")
    second = train(dataclasses.replace(split, run_steps=5))  # resumes at 4, runs 5..9
    assert second.step == 9
    third = train(dataclasses.replace(split, run_steps=3))  # resumes at 9 (end-of-invocation checkpoint)
    assert third.step == 12
    resumed = [r["loss"] for r in _rows(out)]
    reference = [r["loss"] for r in learned["rows"] if "loss" in r][:12]
    assert resumed == reference  # same floats, one row per step


def _damage_checkpoint(step_dir: Path) -> Path:
    """Truncate the largest data file of a checkpoint in place (a disk or bucket losing its tail)."""
    data = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
               key=lambda p: p.stat().st_size)
    with data.open("r+b") as f:
        f.truncate(100)
    return data


def test_a_damaged_checkpoint_falls_back_bit_exact(learned: dict[str, Any], caches: dict[str, Any],
                                                   tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Checkpoints at 4 and 8; the step-8 checkpoint is damaged on disk. The resume reports it in one line,
    moves it aside, resumes from 4 and records the 4 steps redone; the losses stay the uninterrupted run's."""
    out = tmp_path / "damaged"
    progress = tmp_path / "progress.json"
    split = _config(caches, out, checkpoint=CheckpointConfig(every_steps=4, keep=3),
                    data=dataclasses.replace(_config(caches, out).data, validation={}),
                    progress_file=str(progress))
    assert train(dataclasses.replace(split, run_steps=8)).step == 8
    _damage_checkpoint(out / "checkpoints" / "8")
    capfd.readouterr()
    second = train(dataclasses.replace(split, run_steps=6))  # falls back to 4, runs 5..10
    assert second.step == 10
    reports = [line for line in capfd.readouterr().err.splitlines() if "checkpoint step 8" in line]
    assert len(reports) == 1, reports
    (fallback,) = second.checkpoint_fallbacks
    assert (fallback["step"], fallback["resumed_from"], fallback["steps_redone"]) == (8, 4, 4)
    assert fallback["path"] == str(out / "checkpoints" / "8") and fallback["path"] in reports[0]
    assert fallback["error"] in reports[0] and "resuming from step 4 (4 steps redone)" in reports[0]
    assert "\n" not in fallback["error"] and len(fallback["error"]) <= 300
    assert "TensorStore(" not in reports[0]  # not orbax's dump of the TensorStore spec
    moved = Path(fallback["moved_to"])
    assert moved.parent == out / "checkpoints" and moved.name.startswith("8.corrupt-") and moved.is_dir()
    assert not (out / "checkpoints" / "8.orbax-checkpoint-tmp").exists()
    recorded = [json.loads(line) for line in (out / "checkpoint_fallbacks.jsonl").read_text().splitlines()]
    assert [{k: r[k] for k in fallback} for r in recorded] == [fallback]
    written = json.loads(progress.read_text())
    assert written["resumed_from"] == 4 and written["checkpoint_fallbacks"] == [fallback]
    assert (out / "checkpoints" / "8").is_dir()  # step 8 was saved again, next to the damaged copy
    third = train(dataclasses.replace(split, run_steps=2))  # resumes at 10 (end-of-invocation checkpoint)
    assert third.step == 12 and third.checkpoint_fallbacks == []
    resumed = [r["loss"] for r in _rows(out)]
    reference = [r["loss"] for r in learned["rows"] if "loss" in r][:12]
    assert resumed == reference  # same floats, one row per step
    assert moved.is_dir()  # kept through later saves and pruning


def test_a_changed_config_is_an_error_not_a_fallback(caches: dict[str, Any], tmp_path: Path) -> None:
    """A checkpoint whose layout differs from the config is not damage: no fallback, nothing moved aside."""
    out = tmp_path / "changed"
    cfg = _config(caches, out, checkpoint=CheckpointConfig(every_steps=2, keep=3), num_steps=4, run_steps=4,
                  data=dataclasses.replace(_config(caches, out).data, validation={}))
    train(cfg)
    wider = dataclasses.replace(cfg, model=dataclasses.replace(MODEL, expert_d_ff=48), num_steps=6,
                                run_steps=None)
    with pytest.raises(ValueError, match=r"checkpoint step 4 .* does not match this config.*saved float32\["):
        train(wider)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2", "4"]
    assert not (out / "checkpoint_fallbacks.jsonl").exists()


def test_injected_loss_spike_is_skipped_and_logged(caches: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "spike"
    cfg = _config(caches, out, run_steps=40,
                  data=dataclasses.replace(_config(caches, out).data, validation={}))
    loader = TrainLoader(TokenCache(caches["train"]), BATCH, SEQ, seed=1)

    class Spiky:
        def batch(self, step: int) -> dict[str, np.ndarray]:
            b = loader.batch(step)
            if step == 30:  # step index 30 -> row 31: uniformly random targets, ~4 nats above the trend
                b["targets"] = np.random.default_rng(0).integers(1, VOCAB,
                                                                 b["targets"].shape).astype(np.int32)
            return b

    result = train(cfg, batch_source=Spiky())
    rows = {r["step"]: r for r in _rows(out)}
    assert rows[31]["skipped"] and rows[31]["loss_spike"], rows[31]
    assert not any(rows[s]["skipped"] for s in rows if s != 31)
    assert result.skipped_steps == 1 and result.step == 40


def test_gradient_accumulation_with_the_moe_loss() -> None:
    # One MoE layer keeps compilation short; the balance loss is a per-microbatch statistic (see step.py).
    cfg = MODEL.replace(aux_loss_coef=0.0, n_layers=1)
    params = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32),
             "targets": jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32),
             "segment_ids": jnp.asarray(np.repeat(np.arange(4), SEQ // 4)[None].repeat(BATCH, 0), jnp.int32),
             "loss_mask": jnp.asarray(rng.random((BATCH, SEQ)) > 0.2, jnp.float32)}
    loss_fn = make_lm_loss(cfg)
    with jax.default_matmul_precision("highest"):
        l1, g1, _ = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, 1))(params, batch)
        l4, g4, _ = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, 4))(params, batch)
    assert float(l4) == pytest.approx(float(l1), rel=1e-5)
    flat1, flat4 = jax.tree.leaves(g1), jax.tree.leaves(g4)
    for a, b in zip(flat1, flat4, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


def test_one_device_and_eight_devices_give_the_same_losses(caches: dict[str, Any]) -> None:
    """The tiny config on one device (ragged dispatch) and on a data=2 x expert=2 x model=2 mesh of 8 fake
    CPU devices with expert parallelism (fixed-capacity all_to_all; dropless here) take the same steps."""
    assert jax.device_count() == 8, "the root conftest must give JAX 8 fake CPU devices"
    loader = TrainLoader(TokenCache(caches["train"]), BATCH, SEQ, seed=1)
    losses = {}
    for shape, dispatch in (((1, 1, 1), "ragged"), ((2, 2, 2), "ep_alltoall")):
        mesh = build_mesh(MeshConfig(*shape))
        cfg = _config(caches, Path("unused"))
        with jax.default_matmul_precision("highest"):
            spec = StepSpec(cfg.model.replace(dispatch=dispatch), cfg.optimizer, cfg.schedule, cfg.health,
                            cfg.accum_steps, cfg.num_steps, cfg.seed, (BATCH, SEQ))
            comp = compile_train_step(spec, mesh)
            state = comp.init()
            out = []
            for step in range(4):
                state, m = comp.step(state, jax.device_put(loader.batch(step), comp.batch_sharding))
                out.append(float(m["loss"]))
                assert int(m["dropped"]) == 0
        losses[shape] = out
        if shape == (2, 2, 2):
            w_gate = state.params["layers"][0]["moe"]["w_gate"]
            assert "expert" in str(w_gate.sharding.spec), w_gate.sharding
            mu = state.opt_state.inner_states["decay"].inner_state[0].mu["layers"][0]["moe"]["w_gate"]
            assert mu.sharding.spec == w_gate.sharding.spec, "optimizer state must be sharded like its param"
    # Different reduction orders across 8 shards: fp32 agreement to ~1e-5 relative after 4 updates.
    np.testing.assert_allclose(losses[(2, 2, 2)], losses[(1, 1, 1)], rtol=2e-5)


def test_muon_aux_free_and_capacity_run(caches: dict[str, Any], tmp_path: Path) -> None:
    """One short run exercising Muon on the real parameter tree, aux-loss-free router biases and a capacity
    limit (drops, plus the capacity-limited eval next to the dropless one)."""
    out = tmp_path / "combo"
    model = MODEL.replace(balance="aux_free", capacity_factor=0.5, aux_loss_coef=0.0)
    cfg = _config(caches, out, model=model, num_steps=12, optimizer=OptimizerConfig(
        name="muon", lr=1e-2, muon_lr=1e-2, weight_decay=0.01, router_bias_rate=1e-2),
        checkpoint=CheckpointConfig(every_steps=5, keep=3), eval=EvalConfig(every_steps=6, max_batches=2))
    result = train(cfg)
    rows = _rows(out)
    train_rows = [r for r in rows if "loss" in r]
    assert all(r["drop_rate"] > 0 for r in train_rows), "capacity 0.5 must drop assignments"
    assert train_rows[-1]["ce_loss"] < train_rows[0]["ce_loss"]
    eval_rows = [r for r in rows if "eval" in r]
    assert [r["step"] for r in eval_rows] == [6, 12] and all("eval_capacity" in r for r in eval_rows)
    assert result.eval is not None and result.eval == eval_rows[-1]["eval"]
    # Sign steps of the rate: after 5 steps every bias is an odd-or-even multiple of 1e-2 within +-5e-2 and
    # some moved. (With logits this small the bias dominates selection, so loads oscillate from step to step;
    # the biases can return to 0 after an even number of steps — hence step 5.)
    params = load_checkpoint(str(out / "checkpoints" / "5")).params
    bias = np.asarray(params["layers"][0]["moe"]["router_bias"]) / 1e-2
    assert np.any(bias != 0) and np.allclose(bias, np.round(bias), atol=1e-3) and np.all(np.abs(bias) <= 5)
    labels = optim.param_labels(params, cfg.optimizer)
    assert labels["layers"][0]["moe"]["w_gate"] == "muon" and labels["layers"][0]["moe"]["router"] == "decay"
    assert labels["layers"][0]["moe"]["router_bias"] == "frozen" and labels["lm_head"] == "decay"


def test_cli_parser_reads_presets_and_overrides(tmp_path: Path) -> None:
    cfg = parse_config(["--config", "tiny", "--num_steps", "7", "--optimizer.lr", "0.02",
                        "--output_dir", str(tmp_path), "--model.n_experts", "4"])
    assert (cfg.num_steps, cfg.optimizer.lr, cfg.model.n_experts) == (7, 0.02, 4)
    assert cfg.model.d_model == 128  # untouched preset value
    with pytest.raises(ValueError, match="valid presets: .*tiny"):
        parse_config(["--config", "no-such-preset"])
