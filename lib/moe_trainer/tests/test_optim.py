"""Schedules, parameter groups, Muon, and gradient accumulation on a tiny hand-written model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_lm import cyclic_batch, init_toy, toy_loss

from moe_trainer import optim
from moe_trainer.health import HealthConfig
from moe_trainer.step import accumulate_gradients, init_state, make_train_step


@pytest.mark.parametrize("kind", ["cosine", "linear", "wsd", "constant"])
def test_schedule_boundaries(kind: str) -> None:
    cfg = optim.ScheduleConfig(kind=kind, warmup_steps=10, min_lr_ratio=0.1, decay_fraction=0.25)
    sched = optim.make_schedule(cfg, num_steps=101)
    at = lambda s: float(sched(jnp.int32(s)))  # noqa: E731
    assert at(0) == pytest.approx(0.1)  # (0 + 1) / warmup
    assert at(4) == pytest.approx(0.5)
    assert at(9) == pytest.approx(1.0)
    assert at(10) == pytest.approx(1.0)
    final = 1.0 if kind == "constant" else 0.1
    assert at(100) == pytest.approx(final)
    if kind == "cosine":
        assert at(55) == pytest.approx(0.55, abs=1e-6)  # halfway through the decay: (1 + 0.1) / 2
    if kind == "linear":
        assert at(55) == pytest.approx(0.55, abs=1e-6)
    if kind == "wsd":
        decay_start = 100 - 25
        assert at(decay_start) == pytest.approx(1.0)  # stable right up to the decay
        assert at(decay_start + 12) == pytest.approx(1.0 - 0.9 * 12 / 25, abs=1e-6)
    values = [at(s) for s in range(10, 101)]
    assert all(a >= b - 1e-7 for a,
               b in zip(values, values[1:], strict=False)), "must not increase after warmup"


def test_schedule_rejects_bad_kind() -> None:
    with pytest.raises(ValueError, match="schedule.kind='step'.*cosine"):
        optim.ScheduleConfig(kind="step")


def test_param_groups_and_weight_decay() -> None:
    params = init_toy()
    cfg = optim.OptimizerConfig(lr=0.1, weight_decay=0.5)
    labels = optim.param_labels(params, cfg)
    assert labels == {"embed": "no_decay", "norm_scale": "no_decay", "w_out": "decay", "out_bias": "no_decay"}
    muon_labels = optim.param_labels(params, optim.OptimizerConfig(name="muon"))
    assert muon_labels["w_out"] == "muon" and muon_labels["embed"] == "no_decay"
    assert optim.group_sizes(params, cfg) == {"no_decay": 16 * 8 + 8 + 16, "decay": 8 * 16}
    # With zero gradients Adam's direction is 0, so only decoupled weight decay moves a parameter.
    tx = optim.build_optimizer(cfg, params)
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, state, params)
    np.testing.assert_allclose(updates["w_out"], -0.1 * 0.5 * params["w_out"], rtol=1e-6)
    for name in ("embed", "norm_scale", "out_bias"):
        assert not np.any(np.asarray(updates[name])), f"{name} must not be decayed"


def test_newton_schulz_orthogonalises_batched() -> None:
    g = jax.random.normal(jax.random.key(1), (3, 32, 12), jnp.float32)
    out = optim.newton_schulz(g, steps=5)
    for i in range(3):
        s = np.linalg.svd(np.asarray(out[i]), compute_uv=False)
        # The quintic iteration trades exactness for speed: singular values land in roughly [0.7, 1.2].
        assert s.min() > 0.6 and s.max() < 1.25, s
        np.testing.assert_allclose(out[i], optim.newton_schulz(g[i], steps=5), rtol=1e-5, atol=1e-6)


def test_muon_update_rms_matches_adamw_scale() -> None:
    params = {"w": jnp.zeros((64, 16), jnp.float32)}
    tx = optim.build_optimizer(optim.OptimizerConfig(name="muon", muon_lr=1.0, weight_decay=0.0), params)
    grads = {"w": jax.random.normal(jax.random.key(2), (64, 16), jnp.float32)}
    updates, _ = tx.update(grads, tx.init(params), params)
    rms = float(jnp.sqrt(jnp.mean(jnp.square(updates["w"]))))
    # Orthogonal 64x16 (16 unit singular values) scaled by 0.2*sqrt(64): RMS = 0.2*8*sqrt(16/(64*16)) = 0.2.
    assert 0.13 < rms < 0.25, rms


def test_gradient_accumulation_equals_large_batch() -> None:
    params = init_toy()
    batch = jax.tree.map(jnp.asarray, cyclic_batch(0, batch=8, seq=12))
    loss1, g1, s1 = jax.jit(lambda p, b: accumulate_gradients(toy_loss, p, b, 1))(params, batch)
    loss4, g4, s4 = jax.jit(lambda p, b: accumulate_gradients(toy_loss, p, b, 4))(params, batch)
    np.testing.assert_allclose(loss4, loss1, rtol=1e-6)
    for name in params:
        np.testing.assert_allclose(g4[name], g1[name], rtol=2e-5, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(s4["tokens"], s1["tokens"])
    # ... and therefore the same optimizer step.
    cfg = optim.OptimizerConfig(lr=1e-2)
    tx = optim.build_optimizer(cfg, params)
    sched = optim.make_schedule(optim.ScheduleConfig(kind="constant", warmup_steps=0), 10)
    outs = []
    for accum in (1, 4):
        step = jax.jit(make_train_step(toy_loss, tx, sched, HealthConfig(), accum_steps=accum))
        new_state, _ = step(init_state(params, tx, HealthConfig(), seed=0), batch)
        outs.append(new_state.params)
    for name in params:
        np.testing.assert_allclose(outs[1][name], outs[0][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_accumulation_rejects_indivisible_batch() -> None:
    params = init_toy()
    batch = jax.tree.map(jnp.asarray, cyclic_batch(0, batch=6, seq=4))
    with pytest.raises(ValueError, match="batch size 6 is not divisible by accum_steps=4"):
        accumulate_gradients(toy_loss, params, batch, 4)


def test_muon_matrix_views_follow_logical_axes() -> None:
    assert optim.matrix_view((32, 4, 8), ("embed", "heads", "head_dim")) == (0, 1)  # [embed | heads*hd]
    assert optim.matrix_view((4, 8, 32), ("heads", "head_dim", "embed")) == (0, 2)  # [heads*hd | embed]
    assert optim.matrix_view((6, 32, 16), ("experts", "expert_embed", "expert_mlp")) == (1, 1)
    assert optim.matrix_view((6, 32, 16), None) == (1, 1)
    # wo as one [heads*head_dim, embed] matrix: orthogonal over the merged rows, not per head.
    params = {"wo": jnp.zeros((4, 8, 32), jnp.float32)}
    axes = {"wo": ("heads", "head_dim", "embed")}
    tx = optim.build_optimizer(optim.OptimizerConfig(name="muon", muon_lr=1.0, weight_decay=0.0), params,
                               axes)
    g = {"wo": jax.random.normal(jax.random.key(3), (4, 8, 32), jnp.float32)}
    upd = np.asarray(tx.update(g, tx.init(params), params)[0]["wo"]).reshape(32, 32)
    s = np.linalg.svd(upd / (0.2 * np.sqrt(32)), compute_uv=False)
    assert s.min() > 0.6 and s.max() < 1.25, s


def test_frozen_router_bias_gets_no_update_and_no_state() -> None:
    params = {"router_bias": jnp.ones((4,)), "w": jnp.ones((4, 4))}
    cfg = optim.OptimizerConfig(lr=0.1, weight_decay=0.5)
    assert optim.param_labels(params, cfg)["router_bias"] == "frozen"
    tx = optim.build_optimizer(cfg, params)
    grads = {"router_bias": jnp.ones((4,)), "w": jnp.ones((4, 4))}
    updates, _ = tx.update(grads, tx.init(params), params)
    assert not np.any(np.asarray(updates["router_bias"])) and np.all(np.asarray(updates["w"]) < 0)
