"""The accelerator path on CPU: `jax.nn.dot_product_attention` ("xla") against the reference attention core,
and scanned against unrolled layers, equal in values and gradients (documents packed in a row, sliding
windows, NoPE layers, grouped-query heads, dense and MoE layers interleaved)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_trainer import ModelConfig, forward, init_params
from moe_trainer.attention import attention, init_attention, segment_positions

# dense first layer, MoE after it, NoPE every 2nd layer (so local and global layers alternate), window 4, GQA
RICH = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                   n_experts=8, top_k=2, expert_d_ff=16, first_k_dense=1, n_shared_experts=1, shared_d_ff=8,
                   latent_dim=16, rope_fraction=0.5, nope_every=2, sliding_window=4, score_fn="sigmoid",
                   balance="aux_free")
B, S = 4, 8


def _close(a: object, b: object, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def params() -> dict:
    return jax.jit(init_params, static_argnums=0)(RICH, jax.random.key(0))


@pytest.fixture(scope="module")
def batch() -> tuple[jax.Array, jax.Array]:
    tokens = jax.random.randint(jax.random.key(1), (B, S), 0, RICH.vocab_size, dtype=jnp.int32)
    # two packed documents in rows 0-1, one in rows 2-3, padding at the end of row 3
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1]] * 2 + [[0] * 8, [0] * 6 + [-1] * 2], jnp.int32)
    return tokens, seg


def _loss(params: dict, tokens: jax.Array, seg: jax.Array, cfg: ModelConfig) -> tuple:
    logits, stats = forward(params, tokens, cfg, segment_ids=seg)
    lp = jax.nn.log_softmax(logits[:, :-1])
    ce = -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1))
    return ce + stats.weighted_loss, (logits, stats)


@functools.cache
def _value_and_grad(cfg: ModelConfig) -> object:
    return jax.jit(jax.value_and_grad(functools.partial(_loss, cfg=cfg), has_aux=True))


def _run(params: dict, batch: tuple, cfg: ModelConfig) -> tuple:
    (loss, (logits, stats)), grads = _value_and_grad(cfg)(params, *batch)
    return loss, logits, stats, grads


@pytest.mark.parametrize("window", [None, 24], ids=["causal", "window24"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2)], ids=["gqa", "mha"])
def test_dot_product_attention_equals_reference(window: int | None, heads: int, kv_heads: int) -> None:
    """One attention layer (projections, QK-norm, RoPE, core) at a length where the reference cuts two query
    blocks: jax.nn.dot_product_attention gives the same outputs and gradients (parameters and input)."""
    s = 64
    cfg = ModelConfig(d_model=32, n_heads=heads, n_kv_heads=kv_heads, head_dim=8, sliding_window=window)
    p = init_attention(jax.random.key(2), cfg)
    x = jax.random.normal(jax.random.key(3), (2, s, 32))
    cot = jax.random.normal(jax.random.key(4), (2, s, 32))
    seg = jnp.concatenate([jnp.zeros((2, 20), jnp.int32), jnp.ones((2, s - 20), jnp.int32)], axis=1)
    pos = segment_positions(seg)

    def run(impl: str) -> tuple:
        c = cfg.replace(attention_impl=impl)

        def f(p: dict, x: jax.Array) -> jax.Array:
            return jnp.sum(attention(p, x, seg, pos, c, is_global=False) * cot)
        return jax.jit(lambda p, x: (attention(p, x, seg, pos, c, is_global=False),
                                     jax.grad(f, (0, 1))(p, x)))(p, x)

    out_ref, g_ref = run("reference")
    out, grads = run("xla")
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-6)
    _close(grads, g_ref, rtol=1e-5, atol=1e-5)


def test_model_with_dot_product_attention_equals_reference(params: dict, batch: tuple) -> None:
    """The whole model (window, NoPE, GQA, packed documents, padding): loss, logits, stats, every gradient."""
    ref = _run(params, batch, RICH.replace(attention_impl="reference"))
    got = _run(params, batch, RICH.replace(attention_impl="xla"))
    _close(got[:3], ref[:3], rtol=1e-5, atol=1e-6)
    _close(got[3], ref[3], rtol=1e-5, atol=1e-7)


def test_auto_attention_choice() -> None:
    from moe_trainer.attention import attention_impl

    assert attention_impl(RICH, "cpu") == "reference"
    assert attention_impl(RICH.replace(compute_dtype="bfloat16"), "gpu") == "cudnn"
    assert attention_impl(RICH, "gpu") == "xla"  # float32: cuDNN's fused kernel takes bf16/fp16 only
    assert attention_impl(RICH.replace(attention_impl="xla"), "cpu") == "xla"
    auto = RICH.replace(compute_dtype="auto")  # bf16 on accelerators, float32 on CPU
    assert (
        auto.resolved_compute_dtype("gpu") == "bfloat16" and auto.resolved_compute_dtype("cpu") == "float32"
    )
    assert attention_impl(auto, "gpu") == "cudnn" and attention_impl(auto, "cpu") == "reference"
    with pytest.raises(ValueError, match="attention_impl"):
        RICH.replace(attention_impl="flash")


# ---- scanned layers ---------------------------------------------------------------------------------------
# 7 layers: dense first, then (dense, MoE) pairs, NoPE every 4th and the last: segments of several kinds
DEEP = RICH.replace(n_layers=7, moe_every=2, nope_every=4)


def test_layer_segments_cover_every_layer_with_repeating_kinds() -> None:
    from moe_trainer.layer_stack import layer_segments

    assert layer_segments(ModelConfig(n_layers=16)) == [(0, 1, 16)]
    assert layer_segments(ModelConfig(n_layers=16, nope_every=4)) == [(0, 4, 4)]
    assert layer_segments(RICH) == [(0, 1, 1), (1, 1, 2)]
    for cfg in (RICH, DEEP, ModelConfig(n_layers=9, n_experts=4, first_k_dense=1, moe_every=2, nope_every=3)):
        covered = []
        for start, p, r in layer_segments(cfg):
            kinds = [(cfg.is_moe_layer(i), cfg.is_global_layer(i)) for i in range(start, start + p * r)]
            assert kinds == kinds[:p] * r
            covered += list(range(start, start + p * r))
        assert covered == list(range(cfg.n_layers))


@pytest.mark.parametrize(
    ("cfg", "remat"),
    [(DEEP, None), (RICH, "full"), (RICH, "dots"), (RICH, "dots_no_batch")],
    ids=["deep", "rich-remat-full", "rich-remat-dots", "rich-remat-dots-no-batch"],
)
def test_scanned_layers_equal_the_unrolled_loop(cfg: ModelConfig, remat: str | None, batch: tuple) -> None:
    """lax.scan over stacked layers == the Python loop: loss, logits, routing stats and every gradient (packed
    documents, a window, NoPE and MoE layers interleaved with dense ones), with and without remat."""
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(5))
    if remat is not None:
        cfg = cfg.replace(remat=True, remat_policy=remat)
    ref = _run(params, batch, cfg.replace(scan_layers=False))
    got = _run(params, batch, cfg.replace(scan_layers=True))
    _close(got[:3], ref[:3], rtol=1e-5, atol=1e-6)
    _close(got[3], ref[3], rtol=1e-5, atol=1e-7)
