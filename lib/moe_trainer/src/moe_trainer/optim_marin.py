"""Marin's hyperball optimizers, MuonH and AdamH, as update rules on stacked matrices.

Read in marin-community/marin (the maths is the same there; this code is our own):
``lib/levanter/src/levanter/optim/muonh.py`` (``scale_with_muonh``),
``lib/levanter/src/levanter/optim/adamh.py`` (``scale_by_adamh``) and
``experiments/grug/moe_hero_ep/optimizer.py`` (the hero's MuonH recipe, which keeps one radius per matrix of a
stacked tensor).

**The hyperball step.** A matrix W keeps the Frobenius norm R = ||W||_F it had at initialisation. Given a
direction U from a base rule and the learning rate η (peak rate times the schedule factor):

    W' = W - η · R · U / max(||U||_F, 1e-10)        a step of length η·R along U
    W_new = R · W' / max(||W'||_F, 1e-10)            projected back onto the sphere of radius R

and the update is W_new - W. The step is scale-free: only U's direction matters, η is the fraction of the
radius moved per step, and no weight decay is needed because norms cannot grow. Marin's rule for the
learning rate of a hyperball group is sqrt(lr · weight_decay) of the decoupled-decay optimizer it replaces.

- **MuonH**: U = Newton–Schulz-orthogonalised Nesterov momentum (buffer m ← μ·m + g; U = NS5(μ·m + g)).
- **AdamH**: U = m̂ / (sqrt(v̂) + ε), Adam's bias-corrected direction (β1, β2, ε), then the same projection.

**Batch axes.** Every rule works on the last two axes of a ``(..., rows, cols)`` array: leading axes (a
stacked layer axis, an expert axis, or both) are batch axes, so each expert of each layer has its own
radius and its own orthogonalisation. A tensor whose matrix is spread over more axes (``wq [embed, heads,
head_dim]``) is reshaped to its matrix view first (``view`` = (leading batch axes, row axes), see
``optim.matrix_view``), so R is the norm of the whole projection, as Levanter's 2-D ``Linear`` weight has.

**The schedule.** W_new is not linear in η, so the schedule factor cannot be multiplied onto the update
afterwards (as the train step does for AdamW): these transforms take it as optax's extra argument
``lr_factor`` and step with η = lr · lr_factor. A step with η = 0 leaves W exactly as it was.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

PyTree = Any
View = tuple[int, int]  # (number of leading batch axes, number of row axes) of a tensor's matrix view
_TINY = 1e-10


def to_matrices(x: jax.Array, view: View) -> jax.Array:
    """Reshape ``x`` to ``(*batch, rows, cols)`` following its matrix view."""
    n_batch, n_rows = view
    shape = x.shape
    rows = math.prod(shape[n_batch:n_batch + n_rows])
    cols = math.prod(shape[n_batch + n_rows:])
    return x.reshape(*shape[:n_batch], rows, cols)


def _fro(x: jax.Array) -> jax.Array:
    # Sum of squares in fp32 rather than jnp.linalg.norm: Marin saw the latter mis-lowered on sharded
    # matrices (marin #8073); the reduction here is over the last two axes only.
    x = x.astype(jnp.float32)
    return jnp.sqrt(jnp.sum(x * x, axis=(-2, -1), keepdims=True))


def hyperball_step(w: jax.Array, u: jax.Array, lr: jax.Array | float) -> jax.Array:
    """The update ``W_new - W`` of a hyperball step on ``(..., rows, cols)`` arrays, one radius per matrix."""
    w32, u32 = w.astype(jnp.float32), u.astype(jnp.float32)
    radius = _fro(w32)
    moved = w32 - lr * u32 * radius / jnp.maximum(_fro(u32), _TINY)
    new = moved * (radius / jnp.maximum(_fro(moved), _TINY))
    return (new - w32).astype(w.dtype)


def _hyperball_tree(params: PyTree, directions: PyTree, lr: jax.Array, views: PyTree) -> PyTree:
    def one(w: jax.Array, u: jax.Array, view: View) -> jax.Array:
        return hyperball_step(to_matrices(w, view), to_matrices(u, view), lr).reshape(w.shape)

    return jax.tree.map(one, params, directions, views)


def _views_for(params: PyTree, views: dict[str, View], path_name: Any) -> PyTree:
    def pick(path: tuple[Any, ...], leaf: Any) -> View:
        return views.get(path_name(path), (max(jnp.ndim(leaf) - 2, 0), 1))

    return jax.tree_util.tree_map_with_path(pick, params)


def _lr_of(lr: float, extra: dict[str, Any]) -> jax.Array:
    return lr * jnp.asarray(extra.get("lr_factor", 1.0), jnp.float32)


class MuonHState(NamedTuple):
    momentum: PyTree


def muonh(lr: float, momentum: float, ns_steps: int, views: dict[str, View], path_name: Any,
          orthogonalise: Any) -> optax.GradientTransformationExtraArgs:
    """MuonH: Nesterov momentum -> Newton–Schulz on each matrix -> hyperball step of size lr · lr_factor.

    ``views`` maps parameter paths (``path_name(path)``) to matrix views; ``orthogonalise(m, steps)``
    orthogonalises the last two axes of ``m`` (``optim.newton_schulz``).
    """

    def init(params: PyTree) -> MuonHState:
        return MuonHState(jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params))

    def update(grads: PyTree, state: MuonHState, params: PyTree = None, **extra: Any
               ) -> tuple[PyTree, MuonHState]:
        if params is None:
            raise ValueError("MuonH needs the parameters (the hyperball step keeps each matrix's norm)")
        buf = jax.tree.map(lambda m, g: momentum * m + g.astype(jnp.float32), state.momentum, grads)
        nesterov = jax.tree.map(lambda m, g: momentum * m + g.astype(jnp.float32), buf, grads)
        leaf_views = _views_for(params, views, path_name)
        directions = jax.tree.map(
            lambda u, v: orthogonalise(to_matrices(u, v), ns_steps).reshape(u.shape), nesterov, leaf_views)
        return _hyperball_tree(params, directions, _lr_of(lr, extra), leaf_views), MuonHState(buf)

    return optax.GradientTransformationExtraArgs(init, update)


class AdamHState(NamedTuple):
    updates: jax.Array  # updates applied so far (Adam's bias correction)
    mu: PyTree
    nu: PyTree


def adamh(lr: float, beta1: float, beta2: float, eps: float, views: dict[str, View], path_name: Any
          ) -> optax.GradientTransformationExtraArgs:
    """AdamH: Adam's bias-corrected direction m̂/(sqrt(v̂)+ε) -> hyperball step of size lr · lr_factor."""

    def init(params: PyTree) -> AdamHState:
        zeros = jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params)
        return AdamHState(jnp.zeros([], jnp.int32), zeros, jax.tree.map(jnp.zeros_like, zeros))

    def update(grads: PyTree, state: AdamHState, params: PyTree = None, **extra: Any
               ) -> tuple[PyTree, AdamHState]:
        if params is None:
            raise ValueError("AdamH needs the parameters (the hyperball step keeps each matrix's norm)")
        count = state.updates + 1
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        mu = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state.mu, g32)
        nu = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state.nu, g32)
        c1 = 1 - beta1 ** count.astype(jnp.float32)
        c2 = 1 - beta2 ** count.astype(jnp.float32)
        directions = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        leaf_views = _views_for(params, views, path_name)
        return _hyperball_tree(params, directions, _lr_of(lr, extra), leaf_views), AdamHState(count, mu, nu)

    return optax.GradientTransformationExtraArgs(init, update)


def scale_by_lr_factor() -> optax.GradientTransformationExtraArgs:
    """Multiply updates by the extra argument ``lr_factor`` (the schedule), 1 when it is not given."""

    def update(updates: PyTree, state: optax.EmptyState, params: PyTree = None, **extra: Any
               ) -> tuple[PyTree, optax.EmptyState]:
        del params
        if "lr_factor" not in extra:
            return updates, state
        factor = jnp.asarray(extra["lr_factor"])
        return jax.tree.map(lambda u: u * factor.astype(u.dtype), updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
