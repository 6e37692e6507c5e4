"""Grouped-query attention with (partial) RoPE, optional QK-norm, document masking and a sliding window.

Mask: query i sees key j iff j <= i, both carry the same segment id (documents packed in one row never see
each other), and, on local layers with a window w, i - j < w. Positions restart at 0 at each document start
so RoPE sees per-document positions, as an unpacked batch would. Scores and softmax run in float32.

Implementations of the attention core (`ModelConfig.attention_impl`, resolved by `attention_impl`):
- "xla": `jax.nn.dot_product_attention(implementation="xla")` with `is_causal`, `local_window_size=(w-1, 0)`
  and the same-document mask [B, 1, S, S] (GQA handled by the library: query heads grouped per KV head).
- "cudnn": the same call with `implementation="cudnn"` (GPU only, bf16/fp16 inputs; the document mask is
  folded into an additive bias by jax, the window becomes cuDNN's `sliding_window_length` = w). Never
  materialises the [B, heads, S, S] scores.
- "reference": this module's own einsum core (`causal_attend`), tuned for XLA:CPU (one contracting dim per
  matmul, keys stored [hd, S], and two causal query blocks that skip the masked key block above the diagonal).
  It is the oracle of the tests: "xla" equals it in values and gradients at float32.
- "auto": "cudnn" on a GPU when the compute dtype is bfloat16 and head_dim is a multiple of 8 up to 128;
  "reference" on CPU (measured faster there: docs/benchmarks/trainer-accel.md); "xla" otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moe_trainer.config import ATTENTION_IMPLS, ModelConfig
from moe_trainer.layers import Params, apply_rope, cast, linear, normal, rms_norm, rope_tables


def init_attention(key: jax.Array, cfg: ModelConfig) -> Params:
    """Parameters of one attention layer: wq [D,H,hd], wk/wv [D,KV,hd], wo [H,hd,D], optional q/k norm
    gains."""
    kq, kk, kv, ko = jax.random.split(key, 4)
    d, h, kvh, hd, std = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.init_std
    p: Params = {
        "wq": normal(kq, (d, h, hd), std),
        "wk": normal(kk, (d, kvh, hd), std),
        "wv": normal(kv, (d, kvh, hd), std),
        "wo": normal(ko, (h, hd, d), std),
    }
    if cfg.qk_norm:
        p["q_norm"] = jnp.ones((hd,), jnp.float32)
        p["k_norm"] = jnp.ones((hd,), jnp.float32)
    return p


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of each token inside its document: [B, S] int32, restarting where the segment id changes."""
    s = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], dtype=bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - start_idx


def attention_mask(segment_ids: jax.Array, window: int | None) -> jax.Array:
    """Boolean [B, 1, 1, S, S] mask (query, key): causal, same document, and within the window if given."""
    s = segment_ids.shape[1]
    q = jnp.arange(s)[:, None]
    k = jnp.arange(s)[None, :]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (q - k < window)
    same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (allowed[None] & same_doc)[:, None, None]


def attention(
    p: Params,
    x: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    cfg: ModelConfig,
    *,
    is_global: bool,
) -> jax.Array:
    """Self-attention of x [B, S, D] (compute dtype) -> [B, S, D]."""
    dt = x.dtype
    b, s, _ = x.shape
    q = linear(x, cast(p["wq"], dt))
    k = linear(x, cast(p["wk"], dt))
    v = linear(x, cast(p["wv"], dt))
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.norm_eps)
    if not is_global and cfg.rope_dims > 0:
        # positions come from segment_positions: per-document offsets, always in [0, S)
        cos, sin = rope_tables(positions, cfg.rope_dims, cfg.rope_theta, max_position=s)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    impl = attention_impl(cfg)
    window = None if is_global else cfg.sliding_window
    if impl != "reference":
        return linear(fused_attend(q, k, v, segment_ids, window, impl).reshape(b, s, -1),
                      cast(p["wo"], dt).reshape(-1, p["wo"].shape[-1]))
    # Query heads of one KV head are stacked with the query positions ([B, KV, groups*S, hd]) so every matmul
    # here and in its gradients has one contracting dim (XLA:CPU's fast path; see layers.linear).
    n, groups, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    q = q.reshape(b, s, n, groups, hd).transpose(0, 2, 3, 1, 4).reshape(b, n, groups * s, hd)
    # keys as [B, KV, hd, S]: XLA:CPU's batched GEMM is ~15% slower when the rhs contracts its last dim
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, KV, hd, S], [B, KV, S, hd]
    mask = attention_mask(segment_ids, window)
    out = causal_attend(q, k, v, mask, query_blocks(s)).astype(dt).reshape(b, n, groups, s, hd)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, s, cfg.n_heads, hd)
    return linear(out.reshape(b, s, -1), cast(p["wo"], dt).reshape(-1, p["wo"].shape[-1]))


def attention_impl(cfg: ModelConfig, platform: str | None = None) -> str:
    """The attention core `cfg.attention_impl` names on `platform` (default: JAX's default backend)."""
    impl = cfg.attention_impl
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"ModelConfig.attention_impl={impl!r} is invalid: choose one of "
                         f"{list(ATTENTION_IMPLS)}")
    if impl != "auto":
        return impl
    platform = platform or jax.default_backend()
    if platform == "cpu":
        return "reference"
    if (
        platform in ("gpu", "cuda")
        and cfg.resolved_compute_dtype(platform) == "bfloat16"
        and cfg.head_dim % 8 == 0
        and cfg.head_dim <= 128
    ):
        return "cudnn"
    return "xla"


def fused_attend(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, window: int | None, impl: str
) -> jax.Array:
    """`jax.nn.dot_product_attention` for q [B, S, H, hd], k/v [B, S, KV, hd] -> [B, S, H, hd] in q's dtype:
    causal, same-document mask from segment_ids [B, S], window w as `local_window_size=(w - 1, 0)`."""
    same_doc = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]  # [B, 1, S, S]
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=same_doc,
        is_causal=True,
        local_window_size=local,
        implementation="cudnn" if impl == "cudnn" else "xla",
    )


def query_blocks(seq: int) -> int:
    """Query blocks of `causal_attend`: 2 on CPU when they divide the sequence, else 1.

    Two blocks skip the key block above the diagonal (a quarter of the scores and softmax): one layer's
    attention core forward+backward at the tiny preset went from ~4.5 to ~3.1 ms on the 2-core CPU; 4 blocks
    were no faster. Other platforms keep one block (not measured there).
    """
    return 2 if jax.default_backend() == "cpu" and seq % 2 == 0 and seq >= 64 else 1


def causal_attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, blocks: int = 1) -> jax.Array:
    """Causal attention core: q [B, KV, G*S, hd], keys [B, KV, hd, S], values [B, KV, S, hd], mask [B, 1, 1,
    S, S] (bool, query x key; must be causal) -> [B, KV, G*S, hd] in q's dtype. Scores and softmax in float32.

    With `blocks` > 1 the queries are cut into that many position blocks; block i attends only to keys
    [0, (i+1) * S/blocks), since the mask hides every later key from it, so the fully masked blocks above the
    diagonal are never computed. Same result as one block, up to summation order.
    """
    b, n, gs, hd = q.shape
    s = k.shape[-1]
    g, c = gs // s, s // blocks
    q6 = q.reshape(b, n, g, blocks, c, hd)
    outs = []
    for i in range(blocks):
        keys = (i + 1) * c
        qi = q6[:, :, :, i].reshape(b, n, g * c, hd)
        scores = jnp.einsum("bnqk,bnks->bnqs", qi, k[..., :keys], preferred_element_type=jnp.float32)
        scores = scores.reshape(b, n, g, c, keys) * (hd**-0.5)
        scores = jnp.where(mask[..., i * c : (i + 1) * c, :keys], scores, np.finfo(np.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype).reshape(b, n, g * c, keys)
        outs.append(jnp.einsum("bnqs,bnsk->bnqk", probs, v[:, :, :keys]).reshape(b, n, g, c, hd))
    return jnp.stack(outs, axis=3).reshape(b, n, gs, hd) if blocks > 1 else outs[0].reshape(b, n, gs, hd)
