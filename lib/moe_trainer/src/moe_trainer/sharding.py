"""Meshes and the one logical-axis rules table that maps parameter and activation axes to mesh axes.

The mesh always has three named axes ("data", "expert", "model"); any may have size 1. "data" doubles as the
FSDP axis: parameters are sharded over it along their `embed` dimension and gathered by XLA where used.
Tokens (the batch) are split over ("data", "expert"); experts over "expert"; heads, MLP hidden units and the
vocabulary over "model" (tensor parallelism).

A logical axis maps to its mesh axes only when the dimension divides evenly (and the mesh axes are not already
used by an earlier dimension of the same array); otherwise that dimension stays replicated. So any config runs
on any mesh, just with less sharding where shapes do not divide.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from moe_trainer.config import ModelConfig
from moe_trainer.jax_typed import P, SpecEntry, with_sharding_constraint
from moe_trainer.layers import Params
from moe_trainer.params import init_params, is_axes_leaf, param_logical_axes

MESH_AXES = ("data", "expert", "model")

# logical axis -> mesh axes (MaxText style); absent or None means replicated.
LOGICAL_RULES: dict[str, tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "expert"),
    "seq": None,
    "act_embed": None,
    "act_vocab": ("model",),
    # parameters
    "vocab": ("model",),
    "embed": ("data",),
    "heads": ("model",),
    "kv_heads": ("model",),
    "head_dim": None,
    "mlp": ("model",),
    "experts": ("expert",),
    "experts_router": None,
    "expert_embed": ("data",),
    "expert_mlp": ("model",),
    "latent": None,
    "norm": None,
}


def make_mesh(data: int = 1, expert: int = 1, model: int = 1, devices: list[jax.Device] | None = None
              ) -> Mesh:
    """A (data, expert, model) mesh over the first data*expert*model devices (all JAX sees by default)."""
    devs = list(devices if devices is not None else jax.devices())
    n = data * expert * model
    if n > len(devs) or min(data, expert, model) < 1:
        raise ValueError(f"make_mesh(data={data}, expert={expert}, model={model}) needs {n} devices; "
                         f"JAX sees {len(devs)} (on CPU set "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    grid = np.array(devs[:n]).reshape(data, expert, model)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dims carry the logical `axes` (see the rules table)."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {axes} do not match an array of rank {len(shape)} (shape {shape})")
    used: set[str] = set()
    spec: list[SpecEntry] = []
    for name, dim in zip(axes, shape, strict=True):
        if name is not None and name not in LOGICAL_RULES:
            raise ValueError(f"logical axis {name!r} has no rule; known axes: {sorted(LOGICAL_RULES)}")
        mesh_axes = tuple(a for a in (LOGICAL_RULES.get(name) or ()) if mesh.shape.get(a, 1) > 1) \
            if name is not None else ()
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or used & set(mesh_axes) or dim % size:
            spec.append(None)
            continue
        used |= set(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return P(*spec)


def constrain(x: jax.Array, axes: tuple[str | None, ...], mesh: Mesh | None) -> jax.Array:
    """with_sharding_constraint by logical axes; a no-op without a mesh."""
    if mesh is None:
        return x
    return with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh)))


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict[str, Any]:
    """NamedSharding for every parameter of `init_params(cfg, ...)` (shapes come from jax.eval_shape)."""
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    axes = param_logical_axes(cfg)
    shardings: dict[str, Any] = jax.tree_util.tree_map(  # tree_map is typed Any: same tree as axes
        lambda a, s: NamedSharding(mesh, logical_to_spec(a, s.shape, mesh)), axes, shapes,
        is_leaf=is_axes_leaf
    )
    return shardings


def shard_params(params: Params, cfg: ModelConfig, mesh: Mesh) -> Params:
    """Place an existing parameter tree on the mesh according to the rules."""
    placed: Params = jax.device_put(params, param_shardings(cfg, mesh))  # device_put is typed Any
    return placed

