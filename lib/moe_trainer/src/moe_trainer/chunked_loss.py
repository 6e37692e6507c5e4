"""Fused, chunked output head + cross-entropy: the [tokens, vocab] logits never exist all at once.

``chunked_lm_loss(h, w, targets, weights, z_coef=..., chunk_tokens=...)`` returns the same three sums as the
plain path (``logits = h @ w`` then ``loss.token_nll``)::

    loss_sum = Σ_t m_t·(CE_t + z_coef·lse_t²),   ce_sum = Σ_t m_t·CE_t,   z_sum = Σ_t m_t·lse_t²

with lse_t = logsumexp(logits_t) and m the per-token loss weights (the batch's ``loss_mask``). It walks the
sequence in chunks of about ``chunk_tokens`` tokens (the idea of Levanter's blockwise cross-entropy and
Liger's fused linear cross-entropy) and, for each chunk, computes the logits, their logsumexp, the loss terms
and at once the gradient of ``loss_sum`` with respect to those logits::

    dL/dlogits_t = m_t·(softmax_t·(1 + 2·z_coef·lse_t) - onehot(target_t))

which it turns into the chunk's rows of dL/dh (``dlogits @ wᵀ``) and adds into dL/dw (``h_chunkᵀ @ dlogits``).
So the backward pass only scales the stored dL/dh and dL/dw by the upstream cotangent: nothing is recomputed,
and a chunk's logits are consumed while still in cache. Only ``loss_sum`` is differentiable; ``ce_sum`` and
``z_sum`` are statistics (their gradient is zero by construction, ``stop_gradient``).

Numerics: the logits, softmax and every sum are float32 whatever the compute dtype of ``h``/``w`` (matmuls
accumulate in float32); dL/dlogits is cast to the compute dtype for the two gradient matmuls, as
mixed-precision training does. Chunks split the *sequence* axis, never the batch axis, so under a mesh every
chunk keeps the batch sharding of ``h`` and the vocabulary sharding of ``w`` (the logsumexp over a
vocab-sharded chunk is an all-reduce XLA inserts). The chunks run in a ``lax.scan``: compile time does not
grow with the sequence length.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from moe_trainer.sharding import constrain

__all__ = ["chunked_lm_loss", "seq_chunks", "vocab_blocks"]


def seq_chunks(batch: int, seq: int, chunk_tokens: int) -> tuple[int, int]:
    """(number of chunks, sequence positions per chunk) for about ``chunk_tokens`` tokens per chunk.

    A chunk holds ``batch x positions`` tokens; the sequence is padded up to ``chunks x positions`` when the
    chunks do not divide it (the padding carries zero loss weight).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1 (tokens per output-head chunk)")
    per_chunk = max(1, min(seq, chunk_tokens // max(batch, 1)))
    n = -(-seq // per_chunk)
    return n, -(-seq // n)


def vocab_blocks(vocab: int, block: int) -> tuple[int, int]:
    """(number of vocabulary blocks, columns per block) for about ``block`` columns per block.

    Prefers a block count that divides the vocabulary (up to twice the minimal count), so the head needs no
    padding; otherwise the head is padded with zero columns whose logits are masked out.
    """
    if block < 1:
        raise ValueError(
            f"vocab_block={block} must be >= 1 (vocabulary columns per block), or 0 for no blocking"
        )
    n0 = -(-vocab // block)
    for n in range(n0, 2 * n0 + 1):
        if vocab % n == 0:
            return n, vocab // n
    return n0, -(-vocab // n0)


def _chunk_terms(
    h: jax.Array, w: jax.Array, t: jax.Array, mesh: Mesh | None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Logits of one chunk h [B, C, D] and their float32 per-token terms: (logits, lse, ce, onehot mask)."""
    b, c, d = h.shape
    logits = jnp.dot(h.reshape(b * c, d), w, preferred_element_type=jnp.float32).reshape(b, c, -1)
    logits = constrain(logits, ("batch", "seq", "act_vocab"), mesh)
    lse = jax.nn.logsumexp(logits, axis=-1)
    # a gather of one logit per token: cheaper than another pass over the [B, C, V] chunk
    ce = lse - jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
    onehot = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2) == t[..., None]
    return logits, lse, ce, onehot


def _split(x: jax.Array, n: int, c: int) -> jax.Array:
    """[B, n*c, ...] -> [n, B, c, ...] (chunk-major, for lax.scan)."""
    b = x.shape[0]
    return jnp.moveaxis(x.reshape(b, n, c, *x.shape[2:]), 1, 0)


def _merge(x: jax.Array) -> jax.Array:
    """Inverse of _split: [n, B, c, ...] -> [B, n*c, ...]."""
    n, b, c = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, n * c, *x.shape[3:])


def _pad_seq(
    h: jax.Array, targets: jax.Array, weights: jax.Array, total: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    pad = total - h.shape[1]
    if pad == 0:
        return h, targets, weights
    widths = [(0, 0), (0, pad)]
    return (jnp.pad(h, [*widths, (0, 0)]), jnp.pad(targets, widths), jnp.pad(weights, widths))


def _chunk_inputs(
    h: jax.Array, targets: jax.Array, weights: jax.Array, n: int
) -> tuple[int, jax.Array, jax.Array, jax.Array]:
    """Positions per chunk c, and h, targets, weights padded to n*c positions, chunk-major [n, B, c, ...]."""
    c = -(-h.shape[1] // n)
    hp, tp, mp = _pad_seq(h, targets, weights, n * c)
    return c, _split(hp, n, c), _split(tp, n, c), _split(mp, n, c)


def _loss_terms(
    ce: jax.Array, lse: jax.Array, m: jax.Array, z_coef: float
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """The per-token loss ce + z_coef·lse² (also dL/dweights) and the three sums weighted by m."""
    term = ce + z_coef * jnp.square(lse)
    return term, (jnp.sum(m * term), jnp.sum(m * ce), jnp.sum(m * jnp.square(lse)))


def _dlogits(
    logits: jax.Array, lse: jax.Array, is_target: jax.Array, m: jax.Array, z_coef: float, dtype: jnp.dtype
) -> jax.Array:
    """dL/dlogits = m·(softmax·(1 + 2·z_coef·lse) - onehot(target)) in float32, cast to ``dtype`` for the
    gradient matmuls; lse and m hold one value per row of logits, is_target marks each row's target."""
    probs = jnp.exp(logits - lse[..., None])
    scale = (1.0 + 2.0 * z_coef * lse)[..., None]
    return (m[..., None] * (probs * scale - is_target.astype(jnp.float32))).astype(dtype)


def _head_grad(h2: jax.Array, dlogits2: jax.Array) -> jax.Array:
    """A chunk's float32 share of dL/dw: h2ᵀ @ dlogits2 for token rows h2 [T, D] and dlogits2 [T, V]."""
    return jax.lax.dot_general(h2, dlogits2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _sums(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    z_coef: float,
    n: int,
    mesh: Mesh | None,
    with_grads: bool,
) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...] | None]:
    """The three loss sums and, when ``with_grads``, (dL/dh, dL/dw, dL/dweights) of loss_sum."""
    b, s, d = h.shape
    c, hs, ts, ms = _chunk_inputs(h, targets, weights, n)
    dt = h.dtype

    def body(
        dw: jax.Array | None, x: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[jax.Array | None, tuple[jax.Array, ...]]:
        hc, tc, mc = x
        logits, lse, ce, onehot = _chunk_terms(hc, w, tc, mesh)
        term, sums = _loss_terms(ce, lse, mc, z_coef)
        if dw is None:
            return None, sums
        dlogits2 = _dlogits(logits, lse, onehot, mc, z_coef, w.dtype).reshape(b * c, -1)
        dh = jnp.dot(dlogits2, w.T, preferred_element_type=jnp.float32).reshape(b, c, d).astype(dt)
        dw = dw + _head_grad(hc.reshape(b * c, d), dlogits2)
        return dw, (*sums, dh, term)

    dw0 = jnp.zeros(w.shape, jnp.float32) if with_grads else None
    dw, out = jax.lax.scan(body, dw0, (hs, ts, ms))
    sums = tuple(jnp.sum(o) for o in out[:3])
    if not with_grads:
        return sums, None
    assert dw is not None
    dh = _merge(out[3])[:, :s]
    dweights = _merge(out[4])[:, :s]
    return sums, (dh, dw, dweights)


def _block_logits(hc: jax.Array, wj: jax.Array, j: jax.Array, vocab: int) -> tuple[jax.Array, jax.Array]:
    """float32 logits [T, Vb] of token rows hc [T, D] against head block j (wj [D, Vb]); padding columns
    (index >= vocab) read the float32 minimum. Also returns the global column index of each column."""
    vb = wj.shape[1]
    col = j * vb + jax.lax.broadcasted_iota(jnp.int32, (1, vb), 1)
    logits = jnp.dot(hc, wj, preferred_element_type=jnp.float32)
    return jnp.where(col < vocab, logits, np.finfo(np.float32).min), col


Online = tuple[jax.Array, jax.Array, jax.Array]  # running max, rescaled sum, target logit: [n, B*c] each


def _head_blocks(w: jax.Array, nv: int) -> tuple[jax.Array, jax.Array]:
    """The head w [D, V] as nv blocks of Vb = ceil(V / nv) columns, zero-padded: ([nv, D, Vb], block ids)."""
    d, vocab = w.shape
    vb = -(-vocab // nv)
    wp = jnp.pad(w, ((0, 0), (0, nv * vb - vocab))) if nv * vb != vocab else w
    return jnp.moveaxis(wp.reshape(d, nv, vb), 1, 0), jnp.arange(nv, dtype=jnp.int32)


def _online_lse(hs: jax.Array, ts: jax.Array, wb: jax.Array, js: jax.Array, vocab: int
                ) -> tuple[jax.Array, jax.Array]:
    """Pass 1 of `_blocked_sums`: (lse, target logit) [n, B*c] of token chunks hs [n, B*c, D] (targets ts)
    against head blocks wb [nv, D, Vb], by an online logsumexp over the blocks (outer scan) and the chunks
    (inner scan)."""

    def lse_block(carry: Online, x: tuple[jax.Array, jax.Array]) -> tuple[Online, None]:
        wj, j = x

        def chunk(_: None, y: tuple[jax.Array, ...]) -> tuple[None, Online]:
            hc, tc, mx, sm, tl = y
            logits, col = _block_logits(hc, wj, j, vocab)
            new_mx = jnp.maximum(mx, jnp.max(logits, axis=-1))
            sm = sm * jnp.exp(mx - new_mx) + jnp.sum(jnp.exp(logits - new_mx[:, None]), axis=-1)
            tl = tl + jnp.sum(jnp.where(col == tc[:, None], logits, 0.0), axis=-1)
            return None, (new_mx, sm, tl)

        return jax.lax.scan(chunk, None, (hs, ts, *carry))[1], None

    init: Online = (
        jnp.full(ts.shape, np.finfo(np.float32).min),
        jnp.zeros(ts.shape),
        jnp.zeros(ts.shape),
    )
    (mx, sm, tl), _ = jax.lax.scan(lse_block, init, (wb, js))
    return mx + jnp.log(sm), tl


def _blocked_grads(
    hs: jax.Array, ts: jax.Array, ms: jax.Array, lse: jax.Array, wb: jax.Array, js: jax.Array, vocab: int,
    z_coef: float,
) -> tuple[jax.Array, jax.Array]:
    """Pass 2 of `_blocked_sums`: float32 (dL/dh [n, B*c, D], dL/dw by block [nv, D, Vb]), recomputing each
    block's logits and forming dL/dlogits from the final lse."""
    d, vb = wb.shape[1:]

    def grad_block(dh: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        wj, j = x

        def chunk(dwj: jax.Array, y: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
            hc, tc, mc, lc = y
            logits, col = _block_logits(hc, wj, j, vocab)
            dlogits = _dlogits(logits, lc, col == tc[:, None], mc, z_coef, wj.dtype)
            return dwj + _head_grad(hc, dlogits), jnp.dot(dlogits, wj.T, preferred_element_type=jnp.float32)

        dwj, dh_j = jax.lax.scan(chunk, jnp.zeros((d, vb), jnp.float32), (hs, ts, ms, lse))
        return dh + dh_j, dwj

    dh, dwb = jax.lax.scan(grad_block, jnp.zeros(hs.shape, jnp.float32), (wb, js))
    return dh, dwb


def _blocked_sums(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    z_coef: float,
    n: int,
    nv: int,
    with_grads: bool,
) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...] | None]:
    """`_sums` blocked over the vocabulary too: a [tokens/n, V/nv] block of logits at a time, never a row.

    Pass 1 (`_online_lse`) walks the head blocks (outer scan) and the token chunks (inner scan) keeping an
    online logsumexp (running max and rescaled sum) and the target logit per token. Pass 2 (`_blocked_grads`,
    gradients only) recomputes each block's logits, forms dL/dlogits from the final lse, adds dlogits @ w_jᵀ
    into dL/dh and accumulates h_chunkᵀ @ dlogits into block j of dL/dw. So the logits matmul runs twice (one
    more [T, D] x [D, V] product than `_sums`) in exchange for blocks that stay in cache.
    """
    b, s, d = h.shape
    vocab = w.shape[1]
    c, hs, ts, ms = _chunk_inputs(h, targets, weights, n)
    hs, ts, ms = hs.reshape(n, b * c, d), ts.reshape(n, b * c), ms.reshape(n, b * c)
    wb, js = _head_blocks(w, nv)
    lse, tl = _online_lse(hs, ts, wb, js, vocab)
    term, sums = _loss_terms(lse - tl, lse, ms, z_coef)
    if not with_grads:
        return sums, None
    dh, dwb = _blocked_grads(hs, ts, ms, lse, wb, js, vocab, z_coef)
    dw = jnp.moveaxis(dwb, 0, 1).reshape(d, -1)[:, :vocab]
    dh = _merge(dh.reshape(n, b, c, d))[:, :s].astype(h.dtype)
    return sums, (dh, dw, _merge(term.reshape(n, b, c))[:, :s])


def _dispatch(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    z_coef: float,
    n: int,
    nv: int,
    mesh: Mesh | None,
    with_grads: bool,
) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...] | None]:
    if nv > 1:
        return _blocked_sums(h, w, targets, weights, z_coef, n, nv, with_grads)
    return _sums(h, w, targets, weights, z_coef, n, mesh, with_grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _fused(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    z_coef: float,
    n: int,
    nv: int,
    mesh: Mesh | None,
) -> tuple[jax.Array, ...]:
    return _dispatch(h, w, targets, weights, z_coef, n, nv, mesh, with_grads=False)[0]


# the forward pass of the VJP: the sums and, as residuals, the gradients computed alongside them
_fused_fwd = functools.partial(_dispatch, with_grads=True)


def _fused_bwd(
    z_coef: float, n: int, nv: int, mesh: Mesh | None, res: tuple[jax.Array, ...], g: tuple[jax.Array, ...]
) -> tuple[jax.Array | None, ...]:
    del z_coef, n, nv, mesh
    dh, dw, dweights = res
    g_loss = g[0]  # g[1], g[2] (ce_sum, z_sum) are stop_gradient'ed by chunked_lm_loss: always zero
    # w was cast to h's dtype by chunked_lm_loss, so both cotangents take dh's dtype
    return (
        (g_loss * dh.astype(jnp.float32)).astype(dh.dtype),
        (g_loss * dw).astype(dh.dtype),
        None,
        g_loss * dweights,
    )


_fused.defvjp(_fused_fwd, _fused_bwd)


def chunked_lm_loss(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    *,
    z_coef: float,
    chunk_tokens: int,
    mesh: Mesh | None = None,
    vocab_block: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(loss_sum, ce_sum, z_sum) of hidden states h [B, S, D] under the output head w [D, V] (see the module
    docstring). targets int [B, S]; weights float [B, S] (the loss mask). Only loss_sum carries a gradient.
    vocab_block > 0 also blocks the vocabulary (about that many columns per block, `_blocked_sums`); 0 or a
    block as wide as the vocabulary computes whole rows of logits per chunk.

    The returned sums are float32; the gradients come back in the dtypes of h, w and weights.
    """
    if h.ndim != 3 or w.ndim != 2 or h.shape[-1] != w.shape[0]:
        raise ValueError(
            f"chunked_lm_loss: h must be [batch, seq, d] and w [d, vocab]; got h {h.shape}, w {w.shape}"
        )
    if targets.shape != h.shape[:2] or weights.shape != h.shape[:2]:
        raise ValueError(
            f"chunked_lm_loss: targets {targets.shape} and weights {weights.shape} must both be "
            f"[batch, seq] = {h.shape[:2]}"
        )
    if w.dtype != h.dtype:
        w = w.astype(h.dtype)
    n, _ = seq_chunks(h.shape[0], h.shape[1], chunk_tokens)
    nv = vocab_blocks(w.shape[1], vocab_block)[0] if vocab_block else 1
    loss_sum, ce_sum, z_sum = _fused(
        h, w, targets.astype(jnp.int32), weights.astype(jnp.float32), float(z_coef), n, nv, mesh
    )
    return loss_sum, jax.lax.stop_gradient(ce_sum), jax.lax.stop_gradient(z_sum)
