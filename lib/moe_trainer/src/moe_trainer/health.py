"""Training-health guards: gradient clipping, update-norm clipping and skip-bad-step, with rolling windows.

These are the tools Marin's 32B run leaned on when loss spikes appeared (max grad norm 0.2, update-norm
clipping at mean + 2σ over 128 steps, skip bad steps; see docs/trainer.md):

- **global gradient clipping**: gradients are rescaled to ``max_grad_norm`` when their global norm exceeds it;
- **update-norm clipping**: the final update (after the optimizer and learning rate) is rescaled to the
  threshold ``mean + k·std`` of the norms of the last ``update_window`` *applied* updates when it exceeds it.
  The filter is inactive until half the window is filled (as in Levanter's ``clip_update_norm``), so warmup
  never trips it on an empty history;
- **skip-bad-step**: a step is not applied (parameters, optimizer state and router biases unchanged) when the
  loss or gradient norm is non-finite, or — once half the window is filled — when the loss or gradient norm
  is more than ``k`` standard deviations above its rolling mean (OLMo-core/Levanter ``skipstep``). Finite
  values enter the loss / grad-norm windows whether or not the step was skipped, so a genuine level shift is
  absorbed after a few steps instead of skipping forever.

The windows are plain arrays in :class:`HealthState`, part of the train state, so a resumed run restores them
(Marin's "necromancy" had to rebuild this history by hand after a restart).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """Gradient clipping, update-norm clipping and skip-bad-step settings."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value (None disables)."""
    update_window: int = 128
    """Number of past applied-update norms kept for update-norm clipping (0 disables the filter)."""
    update_sigma: float = 3.0
    """Clip an update whose norm exceeds mean + update_sigma · std of the window (Marin 32B used 2.0)."""
    skip_nonfinite: bool = True
    """Skip a step whose loss or gradient norm is NaN or infinite."""
    skip_window: int = 128
    """Number of past losses and gradient norms kept for spike detection (0 disables spike skipping)."""
    skip_loss_sigma: float | None = 6.0
    """Skip a step whose loss exceeds mean + this · std of the window (None disables)."""
    skip_grad_sigma: float | None = 6.0
    """Skip a step whose gradient norm exceeds mean + this · std of the window (None disables)."""

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"health.max_grad_norm={self.max_grad_norm} must be > 0 or null")
        if self.update_window < 0 or self.skip_window < 0:
            raise ValueError(
                f"health.update_window={self.update_window} and skip_window={self.skip_window} must be >= 0"
            )
        for name in ("update_sigma", "skip_loss_sigma", "skip_grad_sigma"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"health.{name}={value} must be > 0")


def init_health(cfg: HealthConfig) -> dict[str, jax.Array]:
    """Empty windows and counters (0-d int32 arrays, so orbax restores them as arrays)."""
    zero = jnp.zeros((), jnp.int32)
    return {
        "update_norms": jnp.zeros((max(cfg.update_window, 1),), jnp.float32),
        "n_updates": zero,
        "losses": jnp.zeros((max(cfg.skip_window, 1),), jnp.float32),
        "grad_norms": jnp.zeros((max(cfg.skip_window, 1),), jnp.float32),
        "n_seen": zero,
        "skipped_total": zero,
        "grad_clipped_total": zero,
        "update_clipped_total": zero,
    }


def window_stats(buf: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and (population) standard deviation of the first min(count, len(buf)) entries of a ring buffer."""
    n = jnp.minimum(count, buf.shape[0])
    valid = jnp.arange(buf.shape[0]) < n
    nf = jnp.maximum(n, 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, buf, 0.0)) / nf
    var = jnp.sum(jnp.where(valid, (buf - mean) ** 2, 0.0)) / nf
    return mean, jnp.sqrt(var)


def _push(buf: jax.Array, count: jax.Array, value: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Write ``value`` at the ring position of ``count`` when ``keep``; return the new buffer and count."""
    pos = count % buf.shape[0]
    new = buf.at[pos].set(jnp.where(keep, value, buf[pos]))
    return new, count + keep.astype(count.dtype)


def _spike(buf: jax.Array, count: jax.Array, value: jax.Array, sigma: float | None) -> jax.Array:
    if sigma is None or buf.shape[0] < 2:
        return jnp.asarray(False, dtype=jnp.bool_)
    mean, std = window_stats(buf, count)
    armed = count >= max(buf.shape[0] // 2, 2)
    return armed & (value > mean + sigma * std)


def clip_gradients(grads: PyTree, grad_norm: jax.Array, cfg: HealthConfig) -> tuple[PyTree, jax.Array]:
    """Rescale gradients to ``max_grad_norm``; returns (grads, clipped flag)."""
    if cfg.max_grad_norm is None:
        return grads, jnp.bool_(False)
    clipped = grad_norm > cfg.max_grad_norm
    scale = jnp.where(clipped, cfg.max_grad_norm / jnp.maximum(grad_norm, 1e-30), 1.0)
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads), clipped


def skip_decision(
    health: dict[str, jax.Array], loss: jax.Array, grad_norm: jax.Array, cfg: HealthConfig
) -> dict[str, jax.Array]:
    """Decide whether to skip this step; returns flags {skip, nonfinite, loss_spike, grad_spike}."""
    nonfinite = ~(jnp.isfinite(loss) & jnp.isfinite(grad_norm))
    loss_spike = _spike(health["losses"], health["n_seen"], loss, cfg.skip_loss_sigma)
    grad_spike = _spike(health["grad_norms"], health["n_seen"], grad_norm, cfg.skip_grad_sigma)
    skip = (nonfinite & cfg.skip_nonfinite) | loss_spike | grad_spike
    return {"skip": skip, "nonfinite": nonfinite, "loss_spike": loss_spike, "grad_spike": grad_spike}


def clip_update(
    updates: PyTree, health: dict[str, jax.Array], cfg: HealthConfig
) -> tuple[PyTree, jax.Array, jax.Array]:
    """Update-norm clipping against the rolling window; returns (updates, norm after clipping, clipped)."""
    norm = global_norm(updates)
    if cfg.update_window < 2:
        return updates, norm, jnp.bool_(False)
    mean, std = window_stats(health["update_norms"], health["n_updates"])
    armed = health["n_updates"] >= max(cfg.update_window // 2, 2)
    threshold = mean + cfg.update_sigma * std
    clipped = armed & (norm > threshold)
    scale = jnp.where(clipped, threshold / jnp.maximum(norm, 1e-30), 1.0)
    updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
    return updates, jnp.where(clipped, threshold, norm), clipped


def record(
    health: dict[str, jax.Array],
    *,
    loss: jax.Array,
    grad_norm: jax.Array,
    update_norm: jax.Array,
    skipped: jax.Array,
    grad_clipped: jax.Array,
    update_clipped: jax.Array,
) -> dict[str, jax.Array]:
    """Advance the windows and counters after a step (applied update norms only; finite losses always)."""
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    losses, n_seen = _push(health["losses"], health["n_seen"], loss, finite)
    grad_norms, _ = _push(health["grad_norms"], health["n_seen"], grad_norm, finite)
    applied = ~skipped & jnp.isfinite(update_norm)
    update_norms, n_updates = _push(health["update_norms"], health["n_updates"], update_norm, applied)

    def inc(flag: jax.Array) -> jax.Array:
        return flag.astype(jnp.int32)

    return {
        "update_norms": update_norms,
        "n_updates": n_updates,
        "losses": losses,
        "grad_norms": grad_norms,
        "n_seen": n_seen,
        "skipped_total": health["skipped_total"] + inc(skipped),
        "grad_clipped_total": health["grad_clipped_total"] + inc(grad_clipped & ~skipped),
        "update_clipped_total": health["update_clipped_total"] + inc(update_clipped & ~skipped),
    }


def global_norm(tree: PyTree) -> jax.Array:
    """fp32 global L2 norm of a pytree (summed in fp32 whatever the leaf dtypes)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))
