"""The full model: config validation, parameter tree, backends agree end to end, sharded == single device,
document masking, sliding window, NoPE, aux-free balancing, capacity and dtype behaviour."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_trainer import (
    Model,
    ModelConfig,
    forward,
    init_params,
    make_mesh,
    param_logical_axes,
    param_shardings,
    shard_params,
    update_router_bias,
)
from moe_trainer.params import is_axes_leaf

# Every feature on at once: dense first layer, shared experts, latent, half-RoPE, NoPE, window, sigmoid,
# aux-free.
RICH = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                   n_experts=8, top_k=2, expert_d_ff=16, first_k_dense=1, n_shared_experts=1, shared_d_ff=8,
                   latent_dim=16, rope_fraction=0.5, nope_every=2, sliding_window=4, score_fn="sigmoid",
                   balance="aux_free")
B, S = 4, 8


@pytest.fixture(scope="module")
def params() -> dict:
    p = jax.jit(init_params, static_argnums=0)(RICH, jax.random.key(0))
    # a non-zero selection bias so the aux-free path is exercised in every comparison
    p["layers"][1]["moe"]["router_bias"] = 0.05 * jnp.arange(8, dtype=jnp.float32)
    return p


@pytest.fixture(scope="module")
def tokens() -> jax.Array:
    return jax.random.randint(jax.random.key(1), (B, S), 0, RICH.vocab_size, dtype=jnp.int32)


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    assert jax.device_count() == 8, "the root conftest must give JAX 8 fake CPU devices"
    return make_mesh(data=2, expert=2, model=2)


def _loss(params: dict, tokens: jax.Array, cfg: ModelConfig, **kw: object) -> tuple:
    logits, stats = forward(params, tokens, cfg, **kw)
    lp = jax.nn.log_softmax(logits[:, :-1])
    ce = -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1))
    return ce + stats.weighted_loss, (logits, stats)


@functools.cache
def _value_and_grad(cfg: ModelConfig, dispatch: str, cf: float | None, mesh: object) -> object:
    fn = functools.partial(_loss, cfg=cfg, dispatch=dispatch, capacity_factor=cf, mesh=mesh)
    return jax.jit(jax.value_and_grad(fn, has_aux=True))


@functools.cache
def _jit_forward(cfg: ModelConfig, dispatch: str | None = None, cf: object = "config") -> object:
    return jax.jit(functools.partial(forward, cfg=cfg, dispatch=dispatch, capacity_factor=cf))


def _fwd(params: dict, tokens: jax.Array, cfg: ModelConfig, dispatch: str | None = None,
         cf: object = "config",
         segment_ids: jax.Array | None = None) -> tuple:
    """Jitted forward, compiled once per (config, backend, capacity, shape) across the module."""
    return _jit_forward(cfg, dispatch, cf)(params, tokens, segment_ids=segment_ids)


def _run(params: dict, tokens: jax.Array, dispatch: str, cf: float | None, mesh: object = None) -> tuple:
    (loss, (logits, stats)), grads = _value_and_grad(RICH, dispatch, cf, mesh)(params, tokens)
    return loss, logits, stats, grads


def _close(a: object, b: object, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


# ---- config and parameter tree -----------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "field"), [
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(rope_fraction=0.3), "rope_fraction"),
    (dict(n_experts=4, top_k=5), "top_k"),
    (dict(capacity_factor=0.0), "capacity_factor"),
    (dict(dispatch="nccl"), "dispatch"),
])
def test_config_validation_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"ModelConfig.{field}="):
        ModelConfig(**change)


def test_layer_schedule() -> None:
    cfg = ModelConfig(n_layers=8, n_experts=4, first_k_dense=1, moe_every=2, nope_every=3)
    assert cfg.moe_layers == (2, 4, 6)
    assert [i for i in range(8) if cfg.is_global_layer(i)] == [2, 5, 7]


def test_logical_axes_match_params(params: dict, mesh: jax.sharding.Mesh) -> None:
    axes = param_logical_axes(RICH)
    flat_axes, tree_axes = jax.tree_util.tree_flatten(axes, is_leaf=is_axes_leaf)
    flat_params, tree_params = jax.tree_util.tree_flatten(params)
    assert tree_axes == tree_params
    assert all(len(a) == p.ndim for a, p in zip(flat_axes, flat_params, strict=True))
    assert all(p.dtype == jnp.float32 for p in flat_params)
    specs = param_shardings(RICH, mesh)
    moe = specs["layers"][1]["moe"]
    assert tuple(moe["w_gate"].spec) == ("expert", "data", "model")
    assert tuple(specs["embed"].spec) == ("model", "data")


# ---- backends and sharding agree end to end ----------------------------------------------------------------
@pytest.mark.parametrize("cf", [None, 0.5], ids=["dropless", "cf0.5"])
def test_ragged_matches_dense_oracle(params: dict, tokens: jax.Array, cf: float | None) -> None:
    ref = _run(params, tokens, "dense", cf)
    got = _run(params, tokens, "ragged", cf)
    _close(got[:2], ref[:2])
    _close(got[3], ref[3], rtol=1e-4, atol=1e-6)
    assert int(got[2].dropped) == int(ref[2].dropped)
    assert (int(ref[2].dropped) > 0) == (cf is not None)


@pytest.mark.parametrize("dispatch", ["ep_allgather", "ep_alltoall", "ragged"])
def test_sharded_forward_matches_single_device(params: dict, tokens: jax.Array, mesh: jax.sharding.Mesh,
                                               dispatch: str) -> None:
    """(data=2, expert=2, model=2) sharded params and EP dispatch equal the 1-device oracle, values and
    grads."""
    ref = _run(params, tokens, "dense", None)
    got = _run(shard_params(params, RICH, mesh), tokens, dispatch, None, mesh)
    _close(got[:2], ref[:2])
    _close(got[3], ref[3], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got[2].expert_load, ref[2].expert_load, rtol=1e-6)


@pytest.mark.parametrize("dispatch", ["ep_allgather", "ep_alltoall"])
def test_sharded_capacity_drops_match_grouped_oracle(params: dict, tokens: jax.Array, mesh: jax.sharding.Mesh,
                                                     dispatch: str) -> None:
    """With a mesh, capacity applies per token shard: EP backends equal the dense oracle on the same mesh."""
    ref = _run(params, tokens, "dense", 0.5, mesh)
    got = _run(shard_params(params, RICH, mesh), tokens, dispatch, 0.5, mesh)
    _close(got[:2], ref[:2])
    _close(got[3], ref[3], rtol=1e-4, atol=1e-6)
    assert int(got[2].dropped) == int(ref[2].dropped) > 0


# ---- masking and positions ---------------------------------------------------------------------------------
def test_documents_in_a_packed_row_do_not_see_each_other(params: dict, tokens: jax.Array) -> None:
    seg = jnp.array([[0] * 3 + [1] * 5] * B, jnp.int32)
    packed, _ = _fwd(params, tokens, RICH, "dense", None, seg)
    first, _ = _fwd(params, tokens[:, :3], RICH, "dense", None)
    second, _ = _fwd(params, tokens[:, 3:], RICH, "dense", None)
    np.testing.assert_allclose(packed[:, :3], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[:, 3:], second, rtol=1e-5, atol=1e-5)
    unmasked, _ = _fwd(params, tokens, RICH, "dense", None)
    assert np.abs(np.asarray(unmasked[:, 3:] - packed[:, 3:])).max() > 1e-3


def test_padding_tokens_are_not_routed(params: dict, tokens: jax.Array) -> None:
    seg = jnp.zeros((B, S), jnp.int32).at[:, -2:].set(-1)
    _, stats = _fwd(params, tokens, RICH, "dense", segment_ids=seg)
    assert int(stats.assignments) == B * (S - 2) * RICH.top_k * len(RICH.moe_layers)
    np.testing.assert_allclose(np.asarray(stats.expert_load).sum(-1), 1.0, rtol=1e-6)


@functools.cache
def _one_layer(**kw: object) -> tuple[ModelConfig, dict]:
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, **kw)
    return cfg, init_params(cfg, jax.random.key(3))


def test_sliding_window_limits_what_a_query_sees(tokens: jax.Array) -> None:
    cfg, p = _one_layer(sliding_window=3)
    changed = tokens.at[:, 0].set((tokens[:, 0] + 1) % 64)
    a, _ = _fwd(p, tokens, cfg)
    b, _ = _fwd(p, changed, cfg)
    diff = np.abs(np.asarray(a - b)).max(axis=(0, 2))
    assert diff[1] > 1e-4 and diff[2] > 1e-4  # inside the window of token 0
    assert np.all(diff[3:] == 0.0)  # token 0 is outside every later window


def test_nope_layers_ignore_token_order_and_rope_fraction_zero_equals_nope(tokens: jax.Array) -> None:
    cfg_nope, p = _one_layer(nope_every=1)
    perm = tokens.at[:, :-1].set(tokens[:, :-1][:, ::-1])
    a, _ = _fwd(p, tokens, cfg_nope)
    b, _ = _fwd(p, perm, cfg_nope)
    np.testing.assert_allclose(a[:, -1], b[:, -1], rtol=1e-5, atol=1e-5)
    cfg_rope = cfg_nope.replace(nope_every=None)
    c, _ = _fwd(p, tokens, cfg_rope)
    d, _ = _fwd(p, perm, cfg_rope)
    assert np.abs(np.asarray(c[:, -1] - d[:, -1])).max() > 1e-4
    e, _ = _fwd(p, tokens, cfg_nope.replace(nope_every=None, rope_fraction=0.0))
    np.testing.assert_allclose(e, a, rtol=1e-6, atol=1e-6)


# ---- balancing, capacity, losses, dtype --------------------------------------------------------------------
def test_aux_free_bias_steers_selection_only(params: dict, tokens: jax.Array) -> None:
    _, _, stats, grads = _run(params, tokens, "dense", None)
    assert np.all(np.asarray(grads["layers"][1]["moe"]["router_bias"]) == 0.0)
    new = update_router_bias(params, stats.expert_load, 0.01)
    load = np.asarray(stats.expert_load[0])
    step = np.asarray(new["layers"][1]["moe"]["router_bias"] - params["layers"][1]["moe"]["router_bias"])
    np.testing.assert_allclose(step, 0.01 * np.sign(load.mean() - load), rtol=1e-6)
    heavy = jax.tree.map(lambda x: x, params)
    heavy["layers"][1]["moe"]["router_bias"] = jnp.zeros(8).at[5].set(10.0)  # sigmoid scores are < 1
    _, stats_heavy = _fwd(heavy, tokens, RICH, "dense")
    np.testing.assert_allclose(stats_heavy.expert_load[0, 5], 1.0 / RICH.top_k, rtol=1e-6)


def test_update_router_bias_is_a_noop_without_aux_free() -> None:
    cfg = RICH.replace(balance="aux_loss")
    p = init_params(cfg, jax.random.key(0))
    assert update_router_bias(p, jnp.full((2, 8), 0.125), 0.1) is p


def test_weighted_loss_and_capacity_override(params: dict, tokens: jax.Array) -> None:
    cfg = RICH.replace(balance="aux_loss", capacity_factor=0.5, aux_loss_coef=0.1, router_z_loss_coef=0.01)
    p = init_params(cfg, jax.random.key(0))
    _, st = _fwd(p, tokens, cfg, "dense")
    np.testing.assert_allclose(st.weighted_loss, 0.1 * st.aux_loss + 0.01 * st.router_z_loss, rtol=1e-6)
    assert int(st.dropped) > 0 and 0 < float(st.drop_rate) < 1
    _, st_free = _fwd(p, tokens, cfg, "dense", None)
    assert int(st_free.dropped) == 0
    np.testing.assert_allclose(st_free.expert_load, st.expert_load)  # load counts routing decisions
    _, st_af = _fwd(params, tokens, RICH, "dense")
    np.testing.assert_allclose(st_af.weighted_loss, RICH.router_z_loss_coef * st_af.router_z_loss, rtol=1e-6)


def test_model_logits_and_bf16(params: dict, tokens: jax.Array) -> None:
    model = Model(RICH, params)
    ref, _ = _fwd(params, tokens, RICH, "dense", None)
    np.testing.assert_allclose(model.logits(np.asarray(tokens)), ref, rtol=1e-5, atol=1e-5)
    bf16, _ = _fwd(params, tokens, RICH.replace(compute_dtype="bfloat16"), "ragged")
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, ref, rtol=0, atol=2e-2 * float(jnp.abs(ref).max()))


def test_remat_gives_the_same_gradients(params: dict, tokens: jax.Array) -> None:
    ref = _run(params, tokens, "ragged", None)
    (loss, (logits, _)), grads = _value_and_grad(RICH.replace(remat=True), "ragged", None, None)(params,
                                                                                                 tokens)
    _close((loss, logits), ref[:2])
    _close(grads, ref[3], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("window", [None, 24], ids=["causal", "window24"])
def test_causal_query_blocks_equal_one_block(window: int | None) -> None:
    """Skipping the key blocks above the diagonal (2 and 4 query blocks) gives the one-block values and
    gradients, with documents packed in a row (segment masking) and a sliding window."""
    from moe_trainer.attention import attention_mask, causal_attend

    b, n, g, s, hd = 2, 2, 2, 64, 8
    kq, kk, kv, kc = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(kq, (b, n, g * s, hd))
    k = jax.random.normal(kk, (b, n, hd, s))
    v = jax.random.normal(kv, (b, n, s, hd))
    cot = jax.random.normal(kc, q.shape)
    seg = jnp.concatenate([jnp.zeros((b, 20), jnp.int32), jnp.ones((b, s - 20), jnp.int32)], axis=1)
    mask = attention_mask(seg, window)

    def value_and_grads(blocks: int) -> tuple:
        def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return jnp.sum(causal_attend(q, k, v, mask, blocks) * cot)
        return jax.jit(lambda q, k, v: (causal_attend(q, k, v, mask, blocks),
                                        jax.grad(loss, (0, 1, 2))(q, k, v)))(q, k, v)

    out_ref, g_ref = value_and_grads(1)
    for blocks in (2, 4):
        out, grads = value_and_grads(blocks)
        np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-6)
        for a, r in zip(grads, g_ref, strict=True):
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope_dims", [32, 8], ids=["full", "partial"])
def test_rope_table_lookup_matches_device_tables(rope_dims: int) -> None:
    """The host-computed RoPE table (what attention uses) equals the on-device cos/sin to float32 rounding for
    per-document positions, and a position outside the table reads NaN instead of a wrong angle."""
    from moe_trainer.attention import segment_positions
    from moe_trainer.layers import rope_tables

    seg = jnp.array([[0] * 40 + [1] * 88, [2] * 128])
    pos = segment_positions(seg)
    device = rope_tables(pos, rope_dims, 10_000.0)
    table = rope_tables(pos, rope_dims, 10_000.0, max_position=128)
    for a, b in zip(device, table, strict=True):
        assert a.shape == b.shape == (2, 128, rope_dims)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=2e-7)
    outside = rope_tables(jnp.array([[127, 128]]), rope_dims, 10_000.0, max_position=128)[0]
    assert np.all(np.isfinite(outside[0, 0])) and np.all(np.isnan(outside[0, 1]))
