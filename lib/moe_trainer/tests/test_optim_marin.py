"""MuonH / AdamH against hand computations in numpy, Marin's parameter groups, and the budget rules."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_lm import cyclic_batch, init_toy, toy_loss

from moe_trainer import optim
from moe_trainer.config import ModelConfig
from moe_trainer.health import HealthConfig
from moe_trainer.hparams import DelphiV2Rule, MoeMayRule
from moe_trainer.params import init_params, param_logical_axes
from moe_trainer.step import init_state, make_train_step


def np_hyperball(w: np.ndarray, u: np.ndarray, lr: float) -> np.ndarray:
    """The hyperball update written out matrix by matrix (last two axes), in float64."""
    out = np.empty_like(w, dtype=np.float64)
    for idx in np.ndindex(*w.shape[:-2]):
        p, d = w[idx].astype(np.float64), u[idx].astype(np.float64)
        r = np.sqrt((p * p).sum())
        moved = p - lr * d * r / max(np.sqrt((d * d).sum()), 1e-10)
        out[idx] = moved / np.sqrt((moved * moved).sum()) * r - p
    return out


def np_newton_schulz(g: np.ndarray, steps: int) -> np.ndarray:
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.astype(np.float64)
    tr = x.shape[0] > x.shape[1]
    x = x.T if tr else x
    x = x / (np.sqrt((x * x).sum()) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tr else x


def _rng(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_hyperball_step_matches_hand_computation_and_keeps_norms() -> None:
    w = np.array([[3.0, 0.0, 4.0], [0.0, 0.0, 0.0]], np.float32)  # ||w|| = 5
    u = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], np.float32)  # ||u|| = 1
    # W' = W - 0.2 * 5 * U = [[3, -1, 4], 0]; ||W'|| = sqrt(26); W_new = W' * 5 / sqrt(26).
    expected = np.array([[3.0, -1.0, 4.0], [0.0, 0.0, 0.0]]) * 5 / math.sqrt(26) - w
    got = np.asarray(optim_marin_step(w, u, 0.2))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(w + got), 5.0, rtol=1e-6)
    # Stacked [layers, experts, rows, cols]: one radius per matrix, never shared across the stack.
    ws, us = _rng(0, 2, 3, 4, 5) * np.arange(1, 7, dtype=np.float32).reshape(2, 3, 1, 1), _rng(1, 2, 3, 4, 5)
    got = np.asarray(optim_marin_step(ws, us, 0.05))
    np.testing.assert_allclose(got, np_hyperball(ws, us, 0.05), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(ws + got, axis=(-2, -1)), np.linalg.norm(ws, axis=(-2, -1)),
                               rtol=1e-5)
    assert not np.any(np.asarray(optim_marin_step(ws, us, 0.0))), "a zero learning rate must not move W"


def optim_marin_step(w: np.ndarray, u: np.ndarray, lr: float) -> jax.Array:
    from moe_trainer.optim_marin import hyperball_step

    return hyperball_step(jnp.asarray(w), jnp.asarray(u), lr)


def _hyperball_tx(name: str, **kw: float) -> tuple[optim.ScheduledTransformation, dict, dict]:
    params = {"layers_w": jnp.asarray(_rng(2, 2, 6, 4)), "lm_head": jnp.asarray(_rng(3, 4, 8)),
              "norm": jnp.ones((4,), jnp.float32)}
    axes = {"layers_w": ("layers", "embed", "mlp"), "lm_head": ("embed", "vocab"), "norm": ("norm",)}
    cfg = optim.OptimizerConfig(name=name, weight_decay=0.0, **kw)
    return optim.build_optimizer(cfg, params, axes), params, axes


def test_adamh_two_steps_match_hand_computation() -> None:
    b1, b2, eps, lr = 0.9, 0.95, 1e-8, 0.03
    tx, params, _ = _hyperball_tx("adamh", hyperball_lr=lr, beta1=b1, beta2=b2, eps=eps, lr=1e-3)
    state = tx.init(params)
    w = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v2 = {k: np.zeros_like(v) for k, v in w.items()}
    p = dict(params)
    for t, factor in ((1, 1.0), (2, 0.5)):
        g = {k: _rng(10 + t + i, *w[k].shape) for i, k in enumerate(sorted(w))}
        grads = {k: jnp.asarray(x) for k, x in g.items()}
        upd, state = tx.update(grads, state, p, lr_factor=jnp.float32(factor))
        for k in ("layers_w", "lm_head"):  # both AdamH under name=adamh (the Delphi v2 recipe)
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
            direction = (m[k] / (1 - b1 ** t)) / (np.sqrt(v2[k] / (1 - b2 ** t)) + eps)
            want = np_hyperball(w[k] if w[k].ndim > 2 else w[k][None], direction if w[k].ndim > 2
                                else direction[None], lr * factor).reshape(w[k].shape)
            np.testing.assert_allclose(np.asarray(upd[k]), want, rtol=2e-4, atol=2e-6, err_msg=f"{k}@{t}")
            w[k] = w[k] + want
        # The norm gain is plain Adam at lr = 1e-3: |update| = lr * factor after one step's bias correction.
        if t == 1:
            np.testing.assert_allclose(np.abs(np.asarray(upd["norm"])), 1e-3, rtol=1e-4)
        p = {k: jnp.asarray(w[k], jnp.float32) if k != "norm" else p[k] + upd[k] for k in p}
    for i in range(2):
        np.testing.assert_allclose(np.linalg.norm(np.asarray(p["layers_w"])[i]),
                                   np.linalg.norm(np.asarray(params["layers_w"])[i]), rtol=1e-5)


def test_muonh_two_steps_match_hand_computation() -> None:
    mu, lr, steps = 0.95, 0.02, 5
    tx, params, _ = _hyperball_tx("muonh", hyperball_lr=lr, muon_momentum=mu, muon_ns_steps=steps)
    assert optim.param_labels(params, optim.OptimizerConfig(name="muonh"), {
        "layers_w": ("layers", "embed", "mlp"), "lm_head": ("embed", "vocab"), "norm": ("norm",)}) == {
        "layers_w": "muonh", "lm_head": "adamh", "norm": "adam"}
    state = tx.init(params)
    w = np.asarray(params["layers_w"], np.float64)
    buf = np.zeros_like(w)
    p = dict(params)
    for t in (1, 2):
        g = _rng(20 + t, *w.shape)
        grads = {"layers_w": jnp.asarray(g), "lm_head": jnp.zeros((4, 8)), "norm": jnp.zeros((4,))}
        upd, state = tx.update(grads, state, p, lr_factor=jnp.float32(1.0))
        buf = mu * buf + g
        nesterov = mu * buf + g
        direction = np.stack([np_newton_schulz(nesterov[i], steps) for i in range(2)])  # per stacked layer
        want = np_hyperball(w, direction, lr)
        np.testing.assert_allclose(np.asarray(upd["layers_w"]), want, rtol=2e-4, atol=2e-6, err_msg=f"@{t}")
        w = w + want
        p = {**p, "layers_w": jnp.asarray(w, jnp.float32)}


def test_muonh_uses_the_projection_matrix_view() -> None:
    # wq [embed, heads, head_dim] is one [embed, heads*head_dim] matrix: one radius, one orthogonalisation.
    params = {"wq": jnp.asarray(_rng(4, 8, 2, 3))}
    axes = {"wq": ("embed", "heads", "head_dim")}
    tx = optim.build_optimizer(optim.OptimizerConfig(name="muonh", hyperball_lr=0.1), params, axes)
    g = _rng(5, 8, 2, 3)
    upd = np.asarray(tx.update({"wq": jnp.asarray(g)}, tx.init(params), params)[0]["wq"])
    u = np_newton_schulz(1.95 * g.reshape(8, 6), 5)  # first Nesterov step: (mu + 1) g
    want = np_hyperball(np.asarray(params["wq"]).reshape(1, 8, 6), u[None], 0.1).reshape(8, 2, 3)
    np.testing.assert_allclose(upd, want, rtol=2e-4, atol=2e-6)


def test_marin_groups_on_the_moe_model() -> None:
    cfg = ModelConfig(n_layers=2, n_experts=4, top_k=2, n_shared_experts=1, balance="aux_free", latent_dim=32)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    axes = param_logical_axes(cfg)
    labels = optim.param_labels(params, optim.OptimizerConfig(name="muonh"), axes)
    moe, attn = labels["layers"][0]["moe"], labels["layers"][0]["attn"]
    assert labels["lm_head"] == "adamh" and labels["embed"] == "adam" and labels["final_norm"] == "adam"
    assert {attn[k] for k in ("wq", "wk", "wv", "wo")} == {"muonh"} and attn["q_norm"] == "adam"
    assert {moe[k] for k in ("w_gate", "w_up", "w_down", "latent_down", "latent_up")} == {"muonh"}
    assert set(jax.tree.leaves(moe["shared"])) == {"muonh"}
    assert moe["router"] == "adam" and moe["router_bias"] == "frozen" and moe["latent_norm"] == "adam"
    delphi = optim.param_labels(params, optim.OptimizerConfig(name="adamh"), axes)
    assert delphi["lm_head"] == "adamh" and delphi["layers"][0]["attn"]["wq"] == "adamh"
    assert delphi["embed"] == "adam" and delphi["layers"][0]["moe"]["router"] == "adam"
    # A stacked norm gain [layers, embed] is still a vector when the axes say its first axis is a batch axis.
    stacked = {"gain": jnp.ones((3, 8))}
    muonh = optim.OptimizerConfig(name="muonh")
    assert optim.param_labels(stacked, muonh, {"gain": ("layers", "embed")}) == {"gain": "adam"}


def test_unknown_optimizer_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"optimizer.name='muonhh'.*adamw, muon, muonh, adamh"):
        optim.OptimizerConfig(name="muonhh")


@pytest.mark.parametrize("name", ["muonh", "adamh"])
def test_hyperball_training_keeps_norms_and_learns(name: str) -> None:
    params = init_toy()
    cfg = optim.OptimizerConfig(name=name, hyperball_lr=0.05, lr=1e-2)
    tx = optim.build_optimizer(cfg, params)
    sched = optim.make_schedule(optim.ScheduleConfig(kind="cosine", warmup_steps=2), 30)
    step = jax.jit(make_train_step(toy_loss, tx, sched, HealthConfig(max_grad_norm=None)))
    state = init_state(params, tx, HealthConfig(max_grad_norm=None), seed=0)
    losses = []
    for s in range(30):
        state, metrics = step(state, jax.tree.map(jnp.asarray, cyclic_batch(s)))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.7 * losses[0], losses
    np.testing.assert_allclose(np.linalg.norm(state.params["w_out"]), np.linalg.norm(params["w_out"]),
                               rtol=1e-5)


def test_delphi_v2_rule_at_reference_and_scaled_points() -> None:
    rule = DelphiV2Rule()
    ref = rule.at(batch_size=64, seq_len=4096, tokens=2.5e9)
    assert (ref.lr, ref.adam_lr, ref.eps, ref.beta2) == pytest.approx((0.0063, 6.56e-4, 1.85e-8, 0.9999))
    # 4x the batch, 10x the tokens: lr = 0.0063 * 2 * 10^-0.3, r = 0.4.
    hp = rule.at(batch_size=256, seq_len=4096, tokens=2.5e10)
    assert hp.lr == pytest.approx(0.0063 * 2 * 0.5011872336, rel=1e-9)
    assert hp.adam_lr == pytest.approx(6.56e-4 * 0.6324555320, rel=1e-9)
    assert hp.eps == pytest.approx(1.85e-8 / 0.6324555320, rel=1e-9)
    assert hp.beta2 == pytest.approx(0.9999 ** 4, rel=1e-12) and hp.num_steps == round(2.5e10 / (256 * 4096))
    # The same tokens per step at a shorter context give the same rates (B is counted in tokens).
    assert rule.at(batch_size=2048, seq_len=512, tokens=2.5e10).lr == pytest.approx(hp.lr)
    # Capped lr and floored beta2 at a very large batch and few tokens.
    big = rule.at(batch_size=131072, seq_len=4096, tokens=2e12)  # beta2 = 0.9999^2048 = 0.81
    assert big.lr == 0.01 and big.beta2 == 0.9
    ov = hp.overrides()
    assert ov["optimizer.name"] == "adamh" and ov["schedule.kind"] == "wsd"
    assert ov["schedule.min_lr_ratio"] == 0
    assert ov["schedule.warmup_steps"] == round(0.1 * hp.num_steps) and ov["health.max_grad_norm"] == 0.1


@pytest.mark.parametrize(("flops", "batch", "lr"), [(1e19, 8, 2.51549e-3), (1e21, 1024, 7.14871e-3),
                                                    (1e23, 16384, 7.18270e-3)], ids=["1e19", "1e21", "1e23"])
def test_delphi_v2_rule_from_budgets(flops: float, batch: int, lr: float) -> None:
    fpt = 6 * 1e9  # a 1B-parameter dense model, 6N FLOPs per training token
    hp = DelphiV2Rule().for_budget(flops, fpt, seq_len=4096)
    tokens = flops / fpt
    assert hp.tokens == pytest.approx(tokens)
    # Marin's choice by hand: the power of two at ~2^16 steps, halved while a rate is capped.
    b = 2 ** math.ceil(math.log2(max(tokens / (2**16 * 4096), 1)))
    while b > 8 and not (0.0063 * math.sqrt(b / 64) * (2.5e9 / tokens) ** 0.3 < 0.01
                         and 6.56e-4 * math.sqrt(b / 64 * 2.5e9 / tokens) < 0.01
                         and 0.9999 ** (b / 64) > 0.9):
        b //= 2
    assert hp.batch_size == max(b, 8) == batch
    assert hp.lr == pytest.approx(lr, rel=1e-5)  # at 1e23: 65536 -> 32768 -> 16384 (lr 0.0144, 0.0102 capped)
    assert hp.beta2 == pytest.approx(min(0.9999, 0.9999 ** (batch / 64)))  # capped at 0.9999 below B0


def test_may_rule_reproduces_the_hero_numbers() -> None:
    # The hero: 11,264 sequences of 4,096 tokens, 18T tokens, d6144 (research/moe-trainer.md §1.2).
    hp = MoeMayRule().at(batch_size=11264, seq_len=4096, tokens=18e12, d_model=6144)
    assert hp.adam_lr == pytest.approx(7.0e-4, rel=0.01) and hp.lr == pytest.approx(13 / 3 * hp.adam_lr)
    assert hp.lr == pytest.approx(3.05e-3, rel=0.01) and hp.beta2 == 0.95 and hp.num_steps == 390_139
    assert hp.eps == pytest.approx(9.676e-18 * math.sqrt(18e12 / (11264 * 4096)))
    assert hp.overrides()["schedule.kind"] == "linear" and hp.overrides()["optimizer.name"] == "muonh"


def test_muonh_step_on_the_moe_model_keeps_every_expert_radius() -> None:
    cfg = ModelConfig(n_layers=2, n_experts=4, top_k=2, d_model=32, n_heads=2, n_kv_heads=1, expert_d_ff=16)
    params = init_params(cfg, jax.random.key(0))
    axes = param_logical_axes(cfg)
    opt = optim.OptimizerConfig(name="muonh", hyperball_lr=0.1)
    tx = optim.build_optimizer(opt, params, axes)
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape), params)
    update = jax.jit(lambda g, s, p: tx.update(g, s, p, lr_factor=jnp.float32(0.5)))
    upd, _ = update(grads, tx.init(params), params)
    new = jax.tree.map(lambda p, u: p + u, params, upd)
    w_up, w_new = np.asarray(params["layers"][1]["moe"]["w_up"]), np.asarray(new["layers"][1]["moe"]["w_up"])
    radii = np.linalg.norm(w_up, axis=(-2, -1))  # one per expert
    np.testing.assert_allclose(np.linalg.norm(w_new, axis=(-2, -1)), radii, rtol=1e-5)
    wq, wq_new = np.asarray(params["layers"][0]["attn"]["wq"]), np.asarray(new["layers"][0]["attn"]["wq"])
    np.testing.assert_allclose(np.linalg.norm(wq_new), np.linalg.norm(wq), rtol=1e-5)
    head, head_new = np.asarray(params["lm_head"]), np.asarray(new["lm_head"])
    np.testing.assert_allclose(np.linalg.norm(head_new), np.linalg.norm(head), rtol=1e-5)
    # Each matrix moved by about lr_factor * lr of its radius (the projection shortens the chord slightly).
    moved = np.linalg.norm(w_new - w_up, axis=(-2, -1)) / radii
    np.testing.assert_allclose(moved, 0.05, rtol=0.01)


def test_hero_preset_carries_the_may_rule() -> None:
    from moe_trainer.presets import load_preset

    preset = load_preset("marin-535b-a23b")
    data = preset.data
    tokens = float(preset.num_steps * data.batch_size * data.seq_len)
    hp = MoeMayRule().at(data.batch_size, data.seq_len, tokens, preset.model.d_model)
    opt = preset.optimizer
    assert opt.name == "muonh" and opt.beta1 == hp.beta1 and opt.beta2 == hp.beta2
    assert (opt.lr, opt.hyperball_lr, opt.eps) == pytest.approx((hp.adam_lr, hp.lr, hp.eps), rel=2e-3)


def test_delphi_v2_rule_for_a_model_counts_its_training_flops() -> None:
    from moe_trainer.flops import flops_per_token

    cfg = ModelConfig(vocab_size=1024, d_model=64, n_layers=2, n_experts=4, top_k=2)
    fpt = flops_per_token(cfg, 128)
    assert fpt.total == pytest.approx(3 * fpt.forward)
    hp = DelphiV2Rule(target_steps=256).for_model(1e13, cfg, seq_len=128)
    assert hp.tokens == pytest.approx(1e13 / fpt.total) and hp == DelphiV2Rule(target_steps=256).for_budget(
        1e13, fpt.total, 128)
    # ~256 steps asks for 2^ceil(log2(T / (256 * 128))) = 512 sequences; the lr cap halves it to 128.
    assert 2 ** math.ceil(math.log2(hp.tokens / (256 * 128))) == 512
    rule = DelphiV2Rule()
    assert hp.batch_size == 128 and hp.lr < 0.01 <= rule._lr(256 * 128, hp.tokens)
