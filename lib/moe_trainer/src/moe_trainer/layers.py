"""Small building blocks shared by attention, MoE and the model: RMSNorm, SwiGLU, RoPE, initialisers.

Numerics: norms always compute in float32 and return the input dtype; matmuls run in the compute dtype the
caller chose (`cast`).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

# A parameter tree (or subtree): str keys; leaves are arrays, inner nodes dicts, "layers" a list of dicts.
Params: TypeAlias = dict[str, Any]


def dtype_of(name: str) -> jnp.dtype:
    """The jnp dtype named by ModelConfig.compute_dtype."""
    # jnp.bfloat16 is typed Any, and so is the dtype built from it
    dt: jnp.dtype = jnp.dtype(jnp.bfloat16 if name == "bfloat16" else jnp.float32)
    return dt


def cast(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Cast floating arrays to the compute dtype (a no-op when already there)."""
    return x.astype(dtype) if x.dtype != dtype else x


def normal(key: jax.Array, shape: tuple[int, ...], std: float) -> jax.Array:
    """float32 normal initialiser."""
    return std * jax.random.normal(key, shape, jnp.float32)


def rms_norm(x: jax.Array, gain: jax.Array | None, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32; `gain=None` is the non-parametric form."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if gain is not None:
        y = y * gain.astype(jnp.float32)
    return y.astype(x.dtype)


def linear(x: jax.Array, w: jax.Array, *, preferred_element_type: jnp.dtype | None = None) -> jax.Array:
    """x [..., K] @ w [K, ...] as one 2-D matmul: leading dims of x and trailing dims of w are flattened.

    Why: XLA:CPU runs a dot with a single contracting dim on its fast GEMM path, but the weight gradient of
    ``einsum("bsd,dv->bsv")`` contracts two dims (b, s) and fell to a loop ~3-4x slower (the tiny preset's CPU
    step spent most of its time there). Same products and sums, so the results match up to reassociation.
    """
    k = x.shape[-1]
    if w.shape[0] != k:
        raise ValueError(f"linear: x [..., {k}] does not match weight {w.shape} (leading dim must be {k})")
    out = jnp.dot(x.reshape(-1, k), w.reshape(k, -1), preferred_element_type=preferred_element_type)
    return out.reshape(*x.shape[:-1], *w.shape[1:])


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """silu(x W_gate) * (x W_up) then W_down; x [..., D], W_gate/W_up [D, F], W_down [F, D]."""
    dt = x.dtype
    h = jax.nn.silu(linear(x, cast(w_gate, dt))) * linear(x, cast(w_up, dt))
    return linear(h, cast(w_down, dt))


def init_swiglu(key: jax.Array, d_in: int, d_hidden: int, std: float) -> Params:
    """Parameters of one dense SwiGLU MLP."""
    kg, ku, kd = jax.random.split(key, 3)
    return {
        "w_gate": normal(kg, (d_in, d_hidden), std),
        "w_up": normal(ku, (d_in, d_hidden), std),
        "w_down": normal(kd, (d_hidden, d_in), std),
    }


def rope_tables(positions: jax.Array, rope_dims: int, theta: float, max_position: int | None = None
                ) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [B, S, rope_dims] for integer positions [B, S] (Hugging Face "default" RoPE layout:
    frequencies repeated across the two halves, used with rotate-half).

    With `max_position` (the caller guarantees positions in [0, max_position)) the tables are looked up in a
    [max_position, rope_dims] constant computed on the host: the same float32 angles, their cos/sin taken in
    float64 and rounded to float32 (within 1 ulp of the device's float32 cos/sin). Why: XLA:CPU fuses the
    cos/sin of on-device tables into every consumer, so it evaluated two transcendental functions per element
    of q and k in ~40 fusions of the forward and backward passes (tiny preset); a gather from a constant is
    two loads (~5 ms, ~3% of the tiny train step on CPU, docs/benchmarks/trainer.md). A position outside the
    table reads NaN (`jnp.take`'s fill mode), never a wrong angle.
    """
    if max_position is not None:
        inv = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, rope_dims, 2, dtype=np.float32)
                                                       / np.float32(rope_dims)))
        angles_np = np.arange(max_position, dtype=np.float32)[:, None] * inv.astype(np.float32)[None, :]
        angles_np = np.concatenate([angles_np, angles_np], axis=-1).astype(np.float64)
        cos_t = jnp.asarray(np.cos(angles_np).astype(np.float32))
        sin_t = jnp.asarray(np.sin(angles_np).astype(np.float32))
        return jnp.take(cos_t, positions, axis=0), jnp.take(sin_t, positions, axis=0)
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rope_dims, 2, dtype=jnp.float32) / rope_dims))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, S, rope_dims/2)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate the first rope_dims dims of each head (rotate-half pairing); x [B, S, heads, head_dim].

    The rest of the head (partial RoPE) passes through unchanged. Computed in float32.
    """
    r = cos.shape[-1]
    if r == 0:
        return x
    xf = x.astype(jnp.float32)
    rot, rest = xf[..., :r], xf[..., r:]
    half = r // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    out = jnp.concatenate([rot * c + rotated * s, rest], axis=-1)
    return out.astype(x.dtype)
