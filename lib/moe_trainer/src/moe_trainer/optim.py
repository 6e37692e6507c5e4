"""Optimizer and learning-rate schedules: AdamW with parameter groups, optional Muon for matrices.

The optimizer is an optax ``GradientTransformation`` that produces the update *direction* for each parameter
group already multiplied by that group's peak learning rate; the schedule multiplier (a function of the
global training step, see :func:`make_schedule`) is applied by the train step. Keeping the schedule outside
optax's own step counter matters because a skipped step (see ``health.py``) leaves the optimizer state
untouched: the learning rate must still follow the global step, while Adam's bias correction counts the
updates actually applied.

Parameter groups (chosen from the parameter path and rank, see :func:`param_labels`):

- ``decay``: matrices trained by AdamW with decoupled weight decay;
- ``no_decay``: norms, biases, embeddings (and every parameter of rank < 2): AdamW without weight decay;
- ``frozen``: statistics stored among the parameters but never trained (the aux-loss-free ``router_bias``,
  updated by the train step from the expert load): their update is zero and they hold no optimizer state;
- ``muon``: with ``OptimizerConfig.name == "muon"``, the hidden matrices (attention, dense and expert MLPs,
  latent projections) use Muon — Nesterov momentum orthogonalised by a quintic Newton–Schulz iteration —
  scaled so that its RMS matches AdamW's (0.2·sqrt(max(fan_in, fan_out)), Moonshot's convention), so the same
  learning rate and weight decay carry over. Embeddings, the output head and the router stay on AdamW.

Muon needs each tensor's matrix view. With the model's logical axes (``param_logical_axes``), leading
``experts`` axes are batch axes (one matrix per expert), and a rank-3 projection is split at its ``embed``
axis: ``wq [embed, heads, head_dim]`` is the matrix [embed, heads·head_dim] and ``wo [heads, head_dim,
embed]`` is [heads·head_dim, embed]. Without logical axes, leading axes beyond the last two are batch axes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any

SCHEDULES = ("constant", "cosine", "linear", "wsd")
OPTIMIZERS = ("adamw", "muon")
# Quintic Newton–Schulz coefficients (Keller Jordan's Muon): they push singular values towards ~1 in 5 steps.
_NS_COEFFS = (3.4445, -4.7750, 2.0315)


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule: a multiplier in [min_lr_ratio, 1] of each group's peak learning rate."""

    kind: str = "cosine"
    """One of constant, cosine, linear, wsd (warmup-stable-decay)."""
    warmup_steps: int = 100
    """Steps of linear warmup from 0 to the peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak (cosine, linear, wsd)."""
    decay_fraction: float = 0.2
    """wsd only: fraction of the total steps spent in the final linear decay."""

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule.kind={self.kind!r} is not one of {SCHEDULES}")
        if self.warmup_steps < 0:
            raise ValueError(f"schedule.warmup_steps={self.warmup_steps} must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"schedule.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"schedule.decay_fraction={self.decay_fraction} must be in (0, 1]")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer: AdamW for every group, or Muon for hidden matrices plus AdamW for the rest."""

    name: str = "adamw"
    """adamw, or muon (Muon on hidden matrices, AdamW on embeddings, head, router, norms, biases)."""
    lr: float = 3e-4
    """Peak AdamW learning rate."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.95
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam epsilon (added to the root of the second moment)."""
    weight_decay: float = 0.1
    """Decoupled weight decay for the decay and muon groups (never for norms, biases, embeddings)."""
    muon_lr: float = 3e-4
    """Peak learning rate of the muon group (its RMS is matched to AdamW's, so lr is a good default)."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    muon_ns_steps: int = 5
    """Newton–Schulz iterations per Muon update."""
    frozen_patterns: tuple[str, ...] = ("router_bias",)
    """Parameter-path substrings of statistics the optimizer must leave alone (zero update, no state)."""
    router_bias_rate: float = 1e-3
    """Aux-loss-free balancing (model.balance="aux_free"): router-bias step size per train step."""
    no_decay_patterns: tuple[str, ...] = ("embed", "norm", "bias", "scale")
    """Parameter-path substrings that put a parameter in the no_decay group (rank < 2 always is)."""
    adam_only_patterns: tuple[str, ...] = ("embed", "lm_head", "unembed", "output", "router")
    """With muon: parameter-path substrings that keep a matrix on AdamW."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer.name={self.name!r} is not one of {OPTIMIZERS}")
        if self.lr <= 0 or self.muon_lr <= 0:
            raise ValueError(f"optimizer lr={self.lr} and muon_lr={self.muon_lr} must be > 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"optimizer betas ({self.beta1}, {self.beta2}) must lie in [0, 1)")


def make_schedule(cfg: ScheduleConfig, num_steps: int) -> Callable[[jax.Array], jax.Array]:
    """Return ``step -> multiplier`` (fp32), evaluated at the step being taken (0-based).

    Warmup reaches 1.0 at step ``warmup_steps``; the decay phases end at ``min_lr_ratio`` on the last step
    (``num_steps - 1``).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1 to build a schedule")
    warm = cfg.warmup_steps
    last = max(num_steps - 1, 1)
    lo = cfg.min_lr_ratio

    def schedule(step: jax.Array) -> jax.Array:
        s = jnp.asarray(step, jnp.float32)
        warmup = jnp.minimum(1.0, (s + 1.0) / warm) if warm > 0 else jnp.float32(1.0)
        span = max(last - warm, 1)
        frac = jnp.clip((s - warm) / span, 0.0, 1.0)  # progress through the post-warmup phase
        if cfg.kind == "constant":
            after = jnp.float32(1.0)
        elif cfg.kind == "cosine":
            after = lo + (1.0 - lo) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        elif cfg.kind == "linear":
            after = 1.0 - (1.0 - lo) * frac
        else:  # wsd: stable at 1.0, then linear decay over the last decay_fraction of the run
            decay_len = max(int(round(cfg.decay_fraction * num_steps)), 1)
            decay_start = last - decay_len
            dfrac = jnp.clip((s - decay_start) / decay_len, 0.0, 1.0)
            after = 1.0 - (1.0 - lo) * dfrac
        return jnp.where(s < warm, warmup, after).astype(jnp.float32)

    return schedule


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for k in path:
        key = getattr(k, "key", None)
        if key is None:
            key = getattr(k, "name", None)
        if key is None:
            key = getattr(k, "idx", k)
        parts.append(str(key))
    return "/".join(parts).lower()


def param_labels(params: PyTree, cfg: OptimizerConfig) -> PyTree:
    """Label every parameter with its group: ``decay``, ``no_decay``, ``muon`` or ``frozen``."""

    def label(path: tuple[Any, ...], leaf: Any) -> str:
        name = _path_name(path)
        if any(p in name for p in cfg.frozen_patterns):
            return "frozen"
        if jnp.ndim(leaf) < 2 or any(p in name for p in cfg.no_decay_patterns):
            return "no_decay"
        if cfg.name == "muon" and not any(p in name for p in cfg.adam_only_patterns):
            return "muon"
        return "decay"

    return jax.tree_util.tree_map_with_path(label, params)


def newton_schulz(g: jax.Array, steps: int, eps: float = 1e-7) -> jax.Array:
    """Approximately orthogonalise the last two axes of ``g`` (batched over leading axes), in fp32."""
    x = g.astype(jnp.float32)
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = jnp.swapaxes(x, -1, -2)
    x = x / (jnp.sqrt(jnp.sum(x * x, axis=(-2, -1), keepdims=True)) + eps)
    a, b, c = _NS_COEFFS
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    if transpose:
        x = jnp.swapaxes(x, -1, -2)
    return x


class MuonState(NamedTuple):
    momentum: PyTree


# Logical axes that are batch dimensions of a stacked matrix, and those that mark a projection's model side.
_BATCH_AXES = ("experts",)
_EMBED_AXES = ("embed", "expert_embed")


def matrix_view(shape: tuple[int, ...], axes: tuple[str | None, ...] | None) -> tuple[int, int]:
    """(number of leading batch axes, number of row axes) of a tensor's matrix view for Muon."""
    if axes is None or len(axes) != len(shape):
        return max(len(shape) - 2, 0), 1
    n_batch = 0
    while n_batch < len(axes) - 2 and axes[n_batch] in _BATCH_AXES:
        n_batch += 1
    rest = axes[n_batch:]
    n_rows = 1 if len(rest) <= 2 or rest[0] in _EMBED_AXES else len(rest) - 1
    return n_batch, n_rows


def _orthogonalise(u: jax.Array, view: tuple[int, int], ns_steps: int) -> jax.Array:
    n_batch, n_rows = view
    shape = u.shape
    rows = math.prod(shape[n_batch:n_batch + n_rows])
    cols = math.prod(shape[n_batch + n_rows:])
    m = u.reshape(*shape[:n_batch], rows, cols)
    return (newton_schulz(m, ns_steps) * (0.2 * math.sqrt(max(rows, cols)))).reshape(shape)


def scale_by_muon(momentum: float, ns_steps: int, views: dict[str, tuple[int, int]] | None = None
                  ) -> optax.GradientTransformation:
    """Muon direction: Nesterov momentum, Newton–Schulz orthogonalised, RMS-matched to AdamW (0.2·√max(m,n)).

    ``views`` maps a parameter path (see :func:`param_labels`) to its :func:`matrix_view`; paths not in it
    use the default view (last two axes).
    """
    views = views or {}

    def init(params: PyTree) -> MuonState:
        return MuonState(jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params))

    def update(grads: PyTree, state: MuonState, params: PyTree = None) -> tuple[PyTree, MuonState]:
        del params
        buf = jax.tree.map(lambda m, g: momentum * m + g.astype(jnp.float32), state.momentum, grads)
        nesterov = jax.tree.map(lambda m, g: g.astype(jnp.float32) + momentum * m, buf, grads)

        def orth(path: tuple[Any, ...], u: jax.Array) -> jax.Array:
            view = views.get(_path_name(path), matrix_view(u.shape, None))
            return _orthogonalise(u, view, ns_steps)

        return jax.tree_util.tree_map_with_path(orth, nesterov), MuonState(buf)

    return optax.GradientTransformation(init, update)


def build_optimizer(cfg: OptimizerConfig, params: PyTree, logical_axes: PyTree | None = None
                    ) -> optax.GradientTransformation:
    """The grouped optimizer. Its updates are ``-peak_lr · direction``; multiply by the schedule outside.

    ``params`` is used only for its tree structure and shapes (an abstract ``jax.eval_shape`` tree is fine);
    ``logical_axes`` (the model's ``param_logical_axes``) gives Muon each tensor's matrix view.
    """
    labels = param_labels(params, cfg)

    def adamw(weight_decay: float) -> optax.GradientTransformation:
        parts = [optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps)]
        if weight_decay > 0:
            parts.append(optax.add_decayed_weights(weight_decay))
        parts.append(optax.scale(-cfg.lr))
        return optax.chain(*parts)

    transforms = {"decay": adamw(cfg.weight_decay), "no_decay": adamw(0.0), "frozen": optax.set_to_zero()}
    if cfg.name == "muon":
        views: dict[str, tuple[int, int]] = {}
        if logical_axes is not None:
            flat_axes = jax.tree_util.tree_flatten_with_path(logical_axes,
                                                             is_leaf=lambda x: isinstance(x, tuple))[0]
            shapes = {_path_name(p): jnp.shape(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
            for path, axes in flat_axes:
                name = _path_name(path)
                if name in shapes:
                    views[name] = matrix_view(tuple(shapes[name]), axes)
        parts = [scale_by_muon(cfg.muon_momentum, cfg.muon_ns_steps, views)]
        if cfg.weight_decay > 0:
            parts.append(optax.add_decayed_weights(cfg.weight_decay))
        parts.append(optax.scale(-cfg.muon_lr))
        transforms["muon"] = optax.chain(*parts)
    return optax.partition(transforms, labels)


def group_sizes(params: PyTree, cfg: OptimizerConfig) -> dict[str, int]:
    """Number of scalar parameters in each group (for logs and tests)."""
    sizes: dict[str, int] = {}
    for lab, leaf in zip(jax.tree.leaves(param_labels(params, cfg)), jax.tree.leaves(params), strict=True):
        sizes[lab] = sizes.get(lab, 0) + int(math.prod(jnp.shape(leaf)))
    return sizes
