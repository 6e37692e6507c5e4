"""The fused, chunked output head + cross-entropy (chunked_loss.py) against the plain path: values and
gradients (hidden states, head, loss weights), z-loss, masking, padding of uneven chunks, tied and untied
heads, bf16, and the whole training loss on one device and on an 8-device mesh."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from moe_trainer import ModelConfig, init_params, make_mesh, shard_params
from moe_trainer.chunked_loss import chunked_lm_loss, seq_chunks
from moe_trainer.loss import make_lm_loss, token_nll

B, S, D, V = 3, 10, 16, 50
Z = 0.05  # a large logit z-loss coefficient, so a wrong z-loss gradient cannot hide under the CE gradient


def _plain(h: jax.Array, w: jax.Array, t: jax.Array, m: jax.Array, z: float) -> tuple[jax.Array, ...]:
    logits = jnp.einsum("bsd,dv->bsv", h, w, preferred_element_type=jnp.float32)
    nll, lse = token_nll(logits, t)
    ce, zs = jnp.sum(m * nll), jnp.sum(m * jnp.square(lse))
    return ce + z * zs, ce, zs


@pytest.fixture(scope="module")
def inputs() -> tuple[jax.Array, ...]:
    k = jax.random.split(jax.random.key(0), 4)
    h = jax.random.normal(k[0], (B, S, D), jnp.float32)
    w = 0.5 * jax.random.normal(k[1], (D, V), jnp.float32)
    t = jax.random.randint(k[2], (B, S), 0, V, dtype=jnp.int32)
    # loss weights: zeros (masked tokens), ones and fractions
    m = jnp.round(jax.random.uniform(k[3], (B, S)) * 4) / 4
    return h, w, t, m


def _value_and_grads(fn: Any, inputs: tuple[jax.Array, ...]) -> tuple[Any, ...]:
    h, w, t, m = inputs
    out = fn(h, w, t, m)
    grads = jax.grad(lambda h, w, m: fn(h, w, t, m)[0], argnums=(0, 1, 2))(h, w, m)
    return out, grads


@pytest.mark.parametrize(
    ("chunk_tokens", "vocab_block"),
    [(1, 0), (7, 0), (9, 0), (12, 0), (30, 0), (1000, 0), (7, 10), (9, 16), (30, 7), (1, 50), (1000, 64)],
    ids=lambda c: str(c),
)
def test_values_and_gradients_equal_the_plain_path(
    inputs: tuple[jax.Array, ...], chunk_tokens: int, vocab_block: int
) -> None:
    """Chunks of 1 position, uneven chunks (the sequence is padded), one chunk, and one larger than the batch;
    and blocked over the vocabulary: 5 blocks of 10 (dividing 50), 4 of 13 (the head padded by 2 masked
    columns), 8 of 7 (padded; an online logsumexp over many blocks), one block, a block wider than the
    vocab."""
    fused = jax.jit(
        functools.partial(chunked_lm_loss, z_coef=Z, chunk_tokens=chunk_tokens, vocab_block=vocab_block)
    )
    plain = jax.jit(functools.partial(_plain, z=Z))
    (f_out, f_grads), (p_out, p_grads) = _value_and_grads(fused, inputs), _value_and_grads(plain, inputs)
    for name, a, b in zip(("loss_sum", "ce_sum", "z_sum"), f_out, p_out, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)
    for name, a, b in zip(("dh", "dw", "dweights"), f_grads, p_grads, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(b))), err_msg=name)
    # masked tokens get exactly no gradient
    masked = np.asarray(inputs[3]) == 0
    assert masked.any() and not np.asarray(f_grads[0])[masked].any()


def test_statistics_carry_no_gradient_and_the_loss_scales_with_its_cotangent(
    inputs: tuple[jax.Array, ...],
) -> None:
    h, w, t, m = inputs
    fused = chunked_lm_loss
    g_stats = jax.grad(lambda h: sum(fused(h, w, t, m, z_coef=Z, chunk_tokens=7)[1:]))(h)
    assert not np.asarray(g_stats).any()
    g1 = jax.grad(lambda h: fused(h, w, t, m, z_coef=Z, chunk_tokens=7)[0])(h)
    g3 = jax.grad(lambda h: -3.0 * fused(h, w, t, m, z_coef=Z, chunk_tokens=7)[0])(h)
    np.testing.assert_allclose(g3, -3.0 * g1, rtol=1e-6)


def test_bf16_compute_matches_the_plain_path_to_bf16_precision(inputs: tuple[jax.Array, ...]) -> None:
    h, w, t, m = inputs
    hb, wb = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    f_out, f_grads = _value_and_grads(
        functools.partial(chunked_lm_loss, z_coef=Z, chunk_tokens=7), (hb, wb, t, m)
    )
    p_out, p_grads = _value_and_grads(functools.partial(_plain, z=Z), (hb, wb, t, m))
    for a, b in zip(f_out, p_out, strict=True):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(a, b, rtol=1e-6)  # same bf16 products, float32 softmax and sums
    for name, a, b in zip(("dh", "dw", "dweights"), f_grads, p_grads, strict=True):
        assert a.dtype == b.dtype, name
        scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
        np.testing.assert_allclose(
            a.astype(jnp.float32), b.astype(jnp.float32), rtol=2e-2, atol=2e-2 * scale, err_msg=name
        )


def test_vocab_block_plan() -> None:
    from moe_trainer.chunked_loss import vocab_blocks

    assert vocab_blocks(128256, 2048) == (64, 2004)  # the block count nearest above 128256/2048 dividing it
    assert vocab_blocks(32000, 2048) == (16, 2000)
    assert vocab_blocks(50, 16) == (5, 10)
    assert vocab_blocks(53, 16) == (4, 14)  # 53 is prime: padded to 4 x 14
    with pytest.raises(ValueError, match="vocab_block"):
        vocab_blocks(50, 0)
    with pytest.raises(ValueError, match="loss_vocab_block"):
        ModelConfig(loss_vocab_block=-1)


def test_bf16_blocked_over_the_vocabulary(inputs: tuple[jax.Array, ...]) -> None:
    h, w, t, m = inputs
    hb, wb = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    f_out, f_grads = _value_and_grads(
        functools.partial(chunked_lm_loss, z_coef=Z, chunk_tokens=7, vocab_block=16), (hb, wb, t, m)
    )
    p_out, p_grads = _value_and_grads(functools.partial(_plain, z=Z), (hb, wb, t, m))
    for a, b in zip(f_out, p_out, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)  # an online logsumexp: float32 sums in another order
    for name, a, b in zip(("dh", "dw", "dweights"), f_grads, p_grads, strict=True):
        assert a.dtype == b.dtype, name
        scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
        np.testing.assert_allclose(
            a.astype(jnp.float32), b.astype(jnp.float32), rtol=2e-2, atol=2e-2 * scale, err_msg=name
        )


def test_chunk_plan_and_argument_errors() -> None:
    assert seq_chunks(4, 128, 512) == (1, 128)
    assert seq_chunks(16, 128, 512) == (4, 32)
    assert seq_chunks(16, 128, 8) == (128, 1)  # never fewer than one position per chunk
    assert seq_chunks(3, 10, 9) == (4, 3)  # 10 positions in 4 chunks of 3: padded to 12
    with pytest.raises(ValueError, match="chunk_tokens"):
        seq_chunks(4, 8, 0)
    with pytest.raises(ValueError, match=r"w \[d, vocab\]"):
        chunked_lm_loss(
            jnp.zeros((2, 3, 4)),
            jnp.zeros((5, 6)),
            jnp.zeros((2, 3), jnp.int32),
            jnp.ones((2, 3)),
            z_coef=0.0,
            chunk_tokens=4,
        )
    with pytest.raises(ValueError, match="loss_chunk_tokens"):
        ModelConfig(loss_chunk_tokens=-1)
    assert ModelConfig(loss_chunk_tokens=0).loss_chunk() == 0
    assert ModelConfig().loss_chunk() == (512 if jax.default_backend() == "cpu" else 8192)


# ---- the whole training loss: fused (chunked) against plain (loss_chunk_tokens=0) -------------------------

CFG = ModelConfig(
    vocab_size=96,
    d_model=32,
    n_layers=1,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    n_experts=4,
    top_k=2,
    expert_d_ff=16,
    logit_z_loss_coef=0.01,
)
LB, LS = 4, 8


def _batch(seed: int) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, CFG.vocab_size, (LB, LS + 1)).astype(np.int32)
    seg = np.zeros((LB, LS), np.int32)
    seg[1, 5:] = 1  # two documents packed in one row
    seg[2, 6:] = -1  # padding at the end of a row, masked out of the loss
    mask = (seg >= 0).astype(np.float32)
    mask[0, :3] = 0.0  # a prompt not trained on
    return {
        "inputs": jnp.asarray(toks[:, :-1]),
        "targets": jnp.asarray(toks[:, 1:]),
        "segment_ids": jnp.asarray(seg),
        "loss_mask": jnp.asarray(mask),
    }


def _loss_and_grads(
    cfg: ModelConfig, params: dict, batch: dict[str, jax.Array], mesh: Any = None
) -> tuple[Any, ...]:
    loss_fn = make_lm_loss(cfg, mesh=mesh)
    total = jnp.sum(batch["loss_mask"])
    fn = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, total, 1), has_aux=True))
    (loss, stats), grads = fn(params, batch)
    return loss, stats, grads


def _assert_same(fused: tuple[Any, ...], plain: tuple[Any, ...]) -> None:
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-6)
    for key in ("ce_sum", "logit_z_sum", "tokens", "aux_loss"):
        np.testing.assert_allclose(fused[1][key], plain[1][key], rtol=1e-6, err_msg=key)
    flat_f = jax.tree_util.tree_leaves_with_path(fused[2])
    flat_p = jax.tree.leaves(plain[2])
    for (path, a), b in zip(flat_f, flat_p, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_training_loss_and_gradients_equal_the_plain_path(tie: bool) -> None:
    cfg = CFG.replace(tie_embeddings=tie)
    params = init_params(cfg, jax.random.key(3))
    batch = _batch(0)
    plain = _loss_and_grads(cfg.replace(loss_chunk_tokens=0), params, batch)
    fused = _loss_and_grads(cfg.replace(loss_chunk_tokens=10), params, batch)  # 4 rows x 2 positions/chunk
    assert float(plain[1]["logit_z_sum"]) > 0
    _assert_same(fused, plain)
    blocked = _loss_and_grads(cfg.replace(loss_chunk_tokens=10, loss_vocab_block=40), params, batch)
    _assert_same(blocked, plain)  # 96 columns in 3 blocks of 32


def test_sharded_fused_loss_equals_the_sharded_plain_loss() -> None:
    """On a data=2 x expert=2 x model=2 mesh: vocab-sharded head, batch-sharded hidden states and chunks."""
    assert jax.device_count() == 8, "the root conftest must give JAX 8 fake CPU devices"
    mesh = make_mesh(data=2, expert=2, model=2)
    cfg = CFG.replace(dispatch="ep_alltoall")
    params = shard_params(init_params(cfg, jax.random.key(4)), cfg, mesh)
    assert params["lm_head"].sharding.spec == P("data", "model")
    batch = jax.device_put(_batch(1), NamedSharding(mesh, P(("data", "expert"))))
    plain = _loss_and_grads(cfg.replace(loss_chunk_tokens=0), params, batch, mesh=mesh)
    # 4 chunks of 2 positions
    fused = _loss_and_grads(cfg.replace(loss_chunk_tokens=8), params, batch, mesh=mesh)
    _assert_same(fused, plain)
    assert fused[2]["lm_head"].sharding.spec == plain[2]["lm_head"].sharding.spec
