"""Gradient clipping, update-norm clipping and skip-bad-step: windows, triggers, and untouched state on
skip."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_lm import cyclic_batch, init_toy, toy_loss

from moe_trainer import health as H
from moe_trainer import optim
from moe_trainer.step import init_state, make_train_step


def spiky_loss(p: Any, b: dict[str, jax.Array], total: jax.Array, n: int) -> tuple[jax.Array, Any]:
    """The toy loss times the batch's ``spike`` factor: a test-side way to inject a loss/gradient spike."""
    loss, stats = toy_loss(p, b, total, n)
    return loss * b["spike"], stats


def _batch(step: int, spike: float = 1.0, **kw: Any) -> dict[str, jax.Array]:
    b = {k: jnp.asarray(v) for k, v in cyclic_batch(step, **kw).items()}
    b["spike"] = jnp.float32(spike)
    return b


def _stepper(cfg: H.HealthConfig, lr: float = 1e-2) -> tuple[Any, Any]:
    params = init_toy()
    tx = optim.build_optimizer(optim.OptimizerConfig(lr=lr, weight_decay=0.0), params)
    sched = optim.make_schedule(optim.ScheduleConfig(kind="constant", warmup_steps=0), 1000)
    step = jax.jit(make_train_step(spiky_loss, tx, sched, cfg))
    return step, init_state(params, tx, cfg, seed=0)


def test_window_stats_match_numpy_before_and_after_wrap() -> None:
    buf, count = jnp.zeros((5,), jnp.float32), jnp.int32(0)
    seen: list[float] = []
    for v in [1.0, 4.0, 2.0, 8.0, 3.0, 7.0, 5.0]:
        buf, count = H._push(buf, count, jnp.float32(v), jnp.bool_(True))
        seen.append(v)
        mean, std = H.window_stats(buf, count)
        ref = np.array(seen[-5:])
        assert float(mean) == pytest.approx(ref.mean()) and float(std) == pytest.approx(ref.std(), rel=1e-5)


def test_nonfinite_loss_is_skipped_and_changes_nothing() -> None:
    step, state = _stepper(H.HealthConfig(skip_window=8))
    state, _ = step(state, _batch(0))
    before = jax.tree.map(np.asarray, state)
    state, m = step(state, _batch(1, spike=float("nan")))
    assert bool(m["skipped"]) and bool(m["nonfinite"])
    for part in ("params", "opt_state"):
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, getattr(state, part)),
                     getattr(before, part))
    assert int(state.step) == 2 and int(state.data_position) == 2, "a skipped step still consumes data"
    assert int(state.health["skipped_total"]) == 1
    assert int(state.health["n_seen"]) == 1, "non-finite values never enter the windows"


def test_loss_spike_is_skipped_then_level_shift_absorbed() -> None:
    cfg = H.HealthConfig(skip_window=8, skip_loss_sigma=6.0, skip_grad_sigma=None, update_window=0)
    step, state = _stepper(cfg)
    for i in range(6):
        state, m = step(state, _batch(i))
        assert not bool(m["skipped"]), f"step {i} must not be skipped"
    state, m = step(state, _batch(6, spike=50.0))
    assert bool(m["skipped"]) and bool(m["loss_spike"]) and not bool(m["nonfinite"])
    # The spiked loss still entered the window, so a persistent shift is absorbed instead of skipped forever.
    assert float(state.health["losses"][6]) == pytest.approx(float(m["loss"]))
    skipped = []
    for i in range(7, 12):
        state, m = step(state, _batch(i, spike=50.0))
        skipped.append(bool(m["skipped"]))
    assert not any(skipped), skipped
    assert int(state.health["skipped_total"]) == 1


def test_grad_spike_is_skipped() -> None:
    cfg = H.HealthConfig(skip_window=8, skip_loss_sigma=None, skip_grad_sigma=6.0, max_grad_norm=None)
    step, state = _stepper(cfg)
    for i in range(6):
        state, _ = step(state, _batch(i))
    state, m = step(state, _batch(6, spike=1e3))
    assert bool(m["grad_spike"]) and bool(m["skipped"])


def test_gradient_clipping_flag_and_norm() -> None:
    grads = {"a": jnp.full((4,), 3.0), "b": jnp.full((2, 2), 4.0)}
    norm = H.global_norm(grads)
    assert float(norm) == pytest.approx(np.sqrt(4 * 9 + 4 * 16))
    clipped, flag = H.clip_gradients(grads, norm, H.HealthConfig(max_grad_norm=1.0))
    assert bool(flag) and float(H.global_norm(clipped)) == pytest.approx(1.0, rel=1e-6)
    same, flag = H.clip_gradients(grads, norm, H.HealthConfig(max_grad_norm=100.0))
    assert not bool(flag) and float(H.global_norm(same)) == pytest.approx(float(norm))


def linear_loss(p: Any, b: dict[str, jax.Array], total: jax.Array, n: int) -> tuple[jax.Array, Any]:
    """loss = <w, direction>: the gradient is exactly the batch's ``direction``."""
    return jnp.sum(p["w"] * b["direction"]), {}


def test_update_norm_clipping_on_injected_spike() -> None:
    """Pure-noise gradients keep Adam's |m|/sqrt(v) near sqrt((1-b1)/(1+b1)) ~ 0.23; one coherent, 100x larger
    gradient pushes it towards (1-b1)/sqrt(1-b2) ~ 0.45, about doubling the update norm (the ~2x Adam
    update-norm spikes Marin saw before loss spikes). The rolling filter clips it to mean + k·std."""
    cfg = H.HealthConfig(update_window=16, update_sigma=3.0, skip_window=0, max_grad_norm=None)
    params = {"w": jnp.zeros((256,), jnp.float32)}
    tx = optim.build_optimizer(optim.OptimizerConfig(lr=1e-2, weight_decay=0.0), params)
    sched = optim.make_schedule(optim.ScheduleConfig(kind="constant", warmup_steps=0), 1000)
    step = jax.jit(make_train_step(linear_loss, tx, sched, cfg))
    state = init_state(params, tx, cfg, seed=0)
    rng = np.random.default_rng(0)
    mask = jnp.ones((1, 1), jnp.float32)
    norms = []
    for i in range(60):
        direction = jnp.asarray(rng.choice([-1.0, 1.0], size=256).astype(np.float32))
        state, m = step(state, {"direction": direction, "loss_mask": mask})
        assert not bool(m["update_clipped"]), f"steady step {i} must not be clipped"
        norms.append(float(m["update_norm"]))
    window = np.array(norms[-16:])
    state, m = step(state, {"direction": jnp.full((256,), 100.0), "loss_mask": mask})
    assert bool(m["update_clipped"]) and not bool(m["skipped"])
    assert float(m["update_norm"]) == pytest.approx(window.mean() + 3.0 * window.std(), rel=1e-4)
    assert float(m["update_norm"]) < 1.3 * window.mean()  # the unclipped update would be ~1.8x the mean
    assert int(state.health["update_clipped_total"]) == 1


def test_metrics_rows_keep_nonfinite_values_visible(tmp_path: Any) -> None:
    import json

    from moe_trainer.metrics import MetricsConfig, MetricsWriter

    writer = MetricsWriter(str(tmp_path), MetricsConfig(wandb_mode="disabled", progress_bar=False),
                           run_config={}, total_steps=3, start_step=0)
    writer.log({"step": 1, "loss": float("nan"), "grad_norm": np.float32(np.inf),
                "expert_load": np.array([[0.5, np.nan]]), "skipped": np.bool_(True)})
    writer.close()
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row == {"step": 1, "loss": "nan", "grad_norm": "inf", "expert_load": [[0.5, "nan"]],
                   "skipped": True}


def test_donated_step_copies_no_parameter_or_optimizer_state() -> None:
    """The skip-step select must not make XLA copy the donated params or Adam moments before updating them
    (step.apply_gradients orders the optimizer-state select after the update norm; without that the compiled
    step copied every moment leaf, ~12 ms per tiny-preset CPU step). Checked on the compiled HLO: no entry
    parameter holding a parameter or optimizer-state leaf is the operand of a copy."""
    import re

    params = init_toy()
    tx = optim.build_optimizer(optim.OptimizerConfig(lr=1e-2), params)
    sched = optim.make_schedule(optim.ScheduleConfig(kind="constant", warmup_steps=0), 100)
    cfg = H.HealthConfig(update_window=8, skip_window=8)
    state = init_state(params, tx, cfg, seed=0)
    batch = {k: jnp.asarray(v) for k, v in cyclic_batch(0).items()}
    # keep_unused: one entry parameter per argument leaf, in flattening order
    step = jax.jit(make_train_step(toy_loss, tx, sched, cfg), donate_argnums=0, keep_unused=True)
    hlo = step.lower(state, batch).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    number = {m.group(1): int(m.group(2)) for m in re.finditer(r"%([\w.\-]+) = \S+ parameter\((\d+)\)",
                                                               entry)}
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path((state, batch))[0]]
    assert len(number) == len(paths), "every state and batch leaf is one entry parameter"
    copied = [paths[number[name]] for name in re.findall(r" copy\(%([\w.\-]+)\)", entry) if name in number]
    trained = [p for p in copied if "'params'" in p or "'opt_state'" in p]
    assert not trained, f"the compiled step copies donated parameter/optimizer-state buffers: {trained}"
