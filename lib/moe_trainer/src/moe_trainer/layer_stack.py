"""Running the transformer blocks: an unrolled loop, or `jax.lax.scan` over stacked runs of identical layers.

The parameter tree keeps one dict per layer (`params["layers"][i]`, what checkpoints, `hf.py`, the optimizers
and the sharding rules see). With `ModelConfig.scan_layers` the forward pass cuts the layer sequence into
*segments*: a unit of p consecutive layers repeated r times, where every layer's kind (dense or MoE MLP, local
or global attention) repeats with the unit, so the p layers of each repetition have identical parameter
shapes and code. The r copies of each unit position are stacked (`jnp.stack`, inside the jitted function) and
one `lax.scan` runs the unit r times: XLA compiles the unit once, so compile time no longer grows with depth.
The gradient of the stacking is the slicing back into per-layer leaves, so the optimizer sees the usual tree.
Layers that start no repetition (r = 1) run unrolled. Examples: 16 dense layers -> one segment (p 1, r 16);
`first_k_dense=1, moe_every=2` over 9 layers -> [dense] + (dense, MoE) x 4; `nope_every=4` over 16 layers ->
(local x 3, global) x 4.

Cost of stacking inside the step instead of storing stacked parameters: one copy of the layer weights
forward (fused with the cast to the compute dtype where XLA can) and one of their gradients backward (not
isolated in a measurement yet; docs/benchmarks/trainer-accel.md has the whole-step figures).

Remat (`ModelConfig.remat` on, `remat_policy` choosing what is kept for the backward pass): "full" saves
nothing inside a block (`jax.checkpoint`'s default: the block is recomputed), "dots" keeps every matmul output
(`checkpoint_policies.dots_saveable`), "dots_no_batch" keeps matmul outputs without batch dims
(`dots_with_no_batch_dims_saveable`: the projections, not the attention scores). The policy applies per block
in both the scanned and the unrolled form, so both compute the same values (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from moe_trainer.config import ModelConfig
from moe_trainer.layers import Params

Block = Callable[[Params, jax.Array, int], tuple[jax.Array, Any]]
LayerFn = Callable[[Params, jax.Array], tuple[jax.Array, Any]]  # one layer's block, its index bound

__all__ = ["layer_segments", "run_layers"]

MAX_UNIT = 8
"""Longest repeating unit searched for (layer kinds with a longer period run unrolled)."""


def _kind(cfg: ModelConfig, i: int) -> tuple[bool, bool]:
    return cfg.is_moe_layer(i), cfg.is_global_layer(i)


def layer_segments(cfg: ModelConfig) -> list[tuple[int, int, int]]:
    """(first layer, unit length p, repetitions r) covering layers 0..n-1 in order (see the module docstring).

    Greedy from the first layer: the unit (p <= MAX_UNIT) whose repetitions cover the most layers, the
    shortest such unit on ties; a layer that starts no repetition is its own segment (p 1, r 1).
    """
    n = cfg.n_layers
    kinds = [_kind(cfg, i) for i in range(n)]
    segments = []
    i = 0
    while i < n:
        best = (1, 1)  # (p, r)
        for p in range(1, min(MAX_UNIT, n - i) + 1):
            r = 1
            while i + (r + 1) * p <= n and kinds[i + r * p:i + (r + 1) * p] == kinds[i:i + p]:
                r += 1
            if r > 1 and p * r > best[0] * best[1]:
                best = (p, r)
        segments.append((i, *best))
        i += best[0] * best[1]
    return segments


def remat_policy(cfg: ModelConfig) -> Callable[..., Any] | None:
    """The `jax.checkpoint` policy named by `cfg.remat_policy` (None = save nothing)."""
    policies = jax.checkpoint_policies
    by_name: dict[str, Callable[..., Any] | None] = {
        "full": None,
        "dots": policies.dots_saveable,
        "dots_no_batch": policies.dots_with_no_batch_dims_saveable,
    }
    return by_name[cfg.remat_policy]


def _wrap(block: Block, cfg: ModelConfig, i: int) -> LayerFn:
    def run(lp: Params, x: jax.Array) -> tuple[jax.Array, Any]:
        return block(lp, x, i)

    return jax.checkpoint(run, policy=remat_policy(cfg)) if cfg.remat else run


def run_layers(layers: list[Params], x: jax.Array, block: Block, cfg: ModelConfig
               ) -> tuple[jax.Array, dict[int, Any]]:
    """Apply `block(layer_params, x, layer_index) -> (x, stats or None)` for every layer in order.

    Returns the final x and {layer index: stats} for the layers whose block returned stats. Scanned segments
    and the unrolled loop give the same values (up to float reassociation inside XLA).
    """
    if len(layers) != cfg.n_layers:
        raise ValueError(f"params has {len(layers)} layers but ModelConfig.n_layers={cfg.n_layers}")
    stats: dict[int, Any] = {}
    segments = layer_segments(cfg) if cfg.scan_layers else [(i, 1, 1) for i in range(cfg.n_layers)]
    for start, p, r in segments:
        if r == 1:
            for i in range(start, start + p):
                x, st = _wrap(block, cfg, i)(layers[i], x)
                if st is not None:
                    stats[i] = st
            continue
        # unit position j of repetition t is layer start + t*p + j; every repetition has the same kinds
        stacked = [jax.tree.map(lambda *a: jnp.stack(a), *[layers[start + t * p + j] for t in range(r)])
                   for j in range(p)]
        fns = [_wrap(block, cfg, start + j) for j in range(p)]

        def body(x: jax.Array, unit: list[Params], fns: list[LayerFn] = fns) -> tuple[jax.Array, list[Any]]:
            outs = []
            for fn, lp in zip(fns, unit, strict=True):
                x, st = fn(lp, x)
                outs.append(st)
            return x, outs

        x, ys = jax.lax.scan(body, x, stacked)
        for j, st in enumerate(ys):
            if st is not None:
                for t in range(r):
                    stats[start + t * p + j] = jax.tree.map(lambda a, t=t: a[t], st)
    return x, stats
