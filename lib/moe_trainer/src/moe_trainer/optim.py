"""Optimizer and learning-rate schedules: AdamW with parameter groups, Muon, and Marin's MuonH / AdamH.

The optimizer is an optax transformation whose update for each parameter group is already multiplied by
that group's peak learning rate and by the schedule factor, which the train step passes as optax's extra
argument ``lr_factor`` (a function of the *global* training step, see :func:`make_schedule`). Keeping the
schedule outside optax's own step counter matters because a skipped step (see ``health.py``) leaves the
optimizer state untouched: the learning rate must still follow the global step, while Adam's bias
correction counts the updates actually applied. The factor goes *into* the optimizer (rather than being
multiplied onto its output) because the hyperball step of MuonH/AdamH is not linear in the learning rate.

Parameter groups (chosen from the parameter path and rank, see :func:`param_labels`):

- ``decay``: matrices trained by AdamW with decoupled weight decay;
- ``no_decay``: norms, biases, embeddings (and every parameter of rank < 2): AdamW without weight decay;
- ``frozen``: statistics stored among the parameters but never trained (the aux-loss-free ``router_bias``,
  updated by the train step from the expert load): their update is zero and they hold no optimizer state;
- ``muon``: with ``OptimizerConfig.name == "muon"``, the hidden matrices (attention, dense and expert MLPs,
  latent projections) use Muon — Nesterov momentum orthogonalised by a quintic Newton–Schulz iteration —
  scaled so that its RMS matches AdamW's (0.2·sqrt(max(fan_in, fan_out)), Moonshot's convention), so the same
  learning rate and weight decay carry over. Embeddings, the output head and the router stay on AdamW.

Marin's recipe (``name`` muonh or adamh; the update rules are in ``optim_marin.py``):

- ``muonh`` (name muonh): hidden matrices (attention, dense, shared and routed experts, latent projections);
- ``adamh``: the output head (name muonh), or every matrix outside the ``adam`` group (name adamh, the Delphi
  v2 recipe);
- ``adam``: plain Adam, no weight decay, learning rate ``lr``: embeddings, the router, norms, biases and every
  parameter whose matrix view has rank < 2 (the "small parameters" of Marin's masks);
- ``frozen`` as above. No weight decay anywhere: the hyperball groups keep their norms fixed, and Marin's
  plain-Adam group has none.

Muon needs each tensor's matrix view. With the model's logical axes (``param_logical_axes``), leading
``experts`` (and stacked ``layers``) axes are batch axes (one matrix per expert), and a rank-3 projection is
split at its ``embed`` axis: ``wq [embed, heads, head_dim]`` is the matrix [embed, heads·head_dim] and
``wo [heads, head_dim, embed]`` is [heads·head_dim, embed]. Without logical axes, leading axes beyond the
last two are batch axes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from moe_trainer import optim_marin

PyTree = Any

SCHEDULES = ("constant", "cosine", "linear", "wsd")
OPTIMIZERS = ("adamw", "muon", "muonh", "adamh")
HYPERBALL = ("muonh", "adamh")
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
    """Optimizer: AdamW for every group; Muon for hidden matrices plus AdamW; or Marin's MuonH / AdamH."""

    name: str = "adamw"
    """adamw; muon (Muon on hidden matrices, AdamW on embeddings, head, router, norms, biases); muonh (Marin's
    MoE recipe: MuonH on hidden matrices, AdamH on the output head, Adam on small parameters); adamh (Delphi
    v2: AdamH on every matrix but embeddings and router, Adam on the rest). See the module docstring."""
    lr: float = 3e-4
    """Peak learning rate of the AdamW groups (of the plain Adam group with muonh/adamh: Marin's adam_lr)."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.95
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam epsilon (added to the root of the second moment)."""
    weight_decay: float = 0.1
    """Decoupled weight decay for the decay and muon groups (never for norms, biases, embeddings; muonh and
    adamh use none: their matrices keep a fixed norm)."""
    muon_lr: float = 3e-4
    """Peak learning rate of the muon group (its RMS is matched to AdamW's, so lr is a good default)."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    muon_ns_steps: int = 5
    """Newton–Schulz iterations per Muon (and MuonH) update."""
    hyperball_lr: float = 6.3e-3
    """muonh/adamh: peak learning rate of the hyperball groups (MuonH and AdamH), the fraction of a matrix's
    norm moved per step (Marin's learning_rate; 6.3e-3 is Delphi v2's value at its reference scale)."""
    adamh_patterns: tuple[str, ...] = ("lm_head", "unembed", "output")
    """muonh: parameter-path substrings of matrices trained by AdamH instead of MuonH (the output head)."""
    adam_patterns: tuple[str, ...] = ("embed", "router")
    """muonh/adamh: parameter-path substrings of matrices kept on plain Adam (embedding table, router)."""
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
            raise ValueError(f"optimizer.name={self.name!r} is not one of {OPTIMIZERS}: choose one of "
                             f"{', '.join(OPTIMIZERS)}")
        if self.lr <= 0 or self.muon_lr <= 0 or self.hyperball_lr <= 0:
            raise ValueError(f"optimizer lr={self.lr}, muon_lr={self.muon_lr} and hyperball_lr="
                             f"{self.hyperball_lr} must be > 0")
        if self.muon_ns_steps < 1:
            raise ValueError(f"optimizer.muon_ns_steps={self.muon_ns_steps} must be >= 1")
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


def param_labels(params: PyTree, cfg: OptimizerConfig, logical_axes: PyTree | None = None) -> PyTree:
    """Label every parameter with its group: ``decay``/``no_decay``/``muon`` (adamw, muon) or
    ``muonh``/``adamh``/``adam`` (muonh, adamh), and ``frozen``.

    ``logical_axes`` (optional) tells stacked batch axes (layers, experts) from matrix axes, so a stacked norm
    gain [layers, embed] still counts as a vector.
    """
    named = {} if logical_axes is None else {
        _path_name(p): axes for p, axes in
        jax.tree_util.tree_flatten_with_path(logical_axes, is_leaf=lambda x: isinstance(x, tuple))[0]}

    def label(path: tuple[Any, ...], leaf: Any) -> str:
        name = _path_name(path)
        if any(p in name for p in cfg.frozen_patterns):
            return "frozen"
        axes = named.get(name, ())
        n_batch = next((i for i, a in enumerate(axes) if a not in _BATCH_AXES), len(axes))
        small = jnp.ndim(leaf) - n_batch < 2 or any(p in name for p in cfg.no_decay_patterns)
        if cfg.name in HYPERBALL:
            if small or any(p in name for p in cfg.adam_patterns):
                return "adam"
            if cfg.name == "adamh" or any(p in name for p in cfg.adamh_patterns):
                return "adamh"
            return "muonh"
        if small:
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
_BATCH_AXES = ("experts", "layers", "layer", "stage")
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


class ScheduledTransformation(optax.GradientTransformationExtraArgs):  # type: ignore[misc]  # optax: no py.typed
    """An optimizer that applies the schedule itself: ``update(..., lr_factor=schedule(step))``."""

    __slots__ = ()


def _matrix_views(params: PyTree, logical_axes: PyTree | None) -> dict[str, tuple[int, int]]:
    """Parameter path -> :func:`matrix_view`, for the leaves the logical-axes tree names."""
    if logical_axes is None:
        return {}
    shapes = {_path_name(p): tuple(jnp.shape(x)) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    flat_axes = jax.tree_util.tree_flatten_with_path(logical_axes, is_leaf=lambda x: isinstance(x, tuple))[0]
    return {_path_name(p): matrix_view(shapes[_path_name(p)], axes) for p, axes in flat_axes
            if _path_name(p) in shapes}


def build_optimizer(cfg: OptimizerConfig, params: PyTree, logical_axes: PyTree | None = None
                    ) -> ScheduledTransformation:
    """The grouped optimizer: its updates are ``-peak_lr · direction · lr_factor`` (AdamW, Muon) or hyperball
    steps of size ``peak_lr · lr_factor`` (MuonH, AdamH), ``lr_factor`` being the extra update argument.

    ``params`` is used only for its tree structure and shapes (an abstract ``jax.eval_shape`` tree is fine);
    ``logical_axes`` (the model's ``param_logical_axes``) gives Muon/MuonH each tensor's matrix view.
    """
    views = _matrix_views(params, logical_axes)
    labels = param_labels(params, cfg, logical_axes)
    scheduled = optim_marin.scale_by_lr_factor()

    def adamw(weight_decay: float) -> optax.GradientTransformation:
        parts = [optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps)]
        if weight_decay > 0:
            parts.append(optax.add_decayed_weights(weight_decay))
        parts += [optax.scale(-cfg.lr), scheduled]
        return optax.chain(*parts)

    transforms: dict[str, optax.GradientTransformation] = {"frozen": optax.set_to_zero()}
    if cfg.name in HYPERBALL:
        transforms["adam"] = adamw(0.0)
        transforms["adamh"] = optim_marin.adamh(cfg.hyperball_lr, cfg.beta1, cfg.beta2, cfg.eps, views,
                                                _path_name)
        transforms["muonh"] = optim_marin.muonh(cfg.hyperball_lr, cfg.muon_momentum, cfg.muon_ns_steps, views,
                                                _path_name, newton_schulz)
    else:
        transforms.update({"decay": adamw(cfg.weight_decay), "no_decay": adamw(0.0)})
    if cfg.name == "muon":
        parts = [scale_by_muon(cfg.muon_momentum, cfg.muon_ns_steps, views)]
        if cfg.weight_decay > 0:
            parts.append(optax.add_decayed_weights(cfg.weight_decay))
        parts += [optax.scale(-cfg.muon_lr), scheduled]
        transforms["muon"] = optax.chain(*parts)
    tx = optax.partition(transforms, labels)
    return ScheduledTransformation(tx.init, tx.update)


def group_sizes(params: PyTree, cfg: OptimizerConfig) -> dict[str, int]:
    """Number of scalar parameters in each group (for logs and tests)."""
    sizes: dict[str, int] = {}
    for lab, leaf in zip(jax.tree.leaves(param_labels(params, cfg)), jax.tree.leaves(params), strict=True):
        sizes[lab] = sizes.get(lab, 0) + int(math.prod(jnp.shape(leaf)))
    return sizes
