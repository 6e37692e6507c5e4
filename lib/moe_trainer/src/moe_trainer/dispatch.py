"""Expert dispatch: send each token's top-k assignments to their experts, run the SwiGLU experts, combine.

One interface, four backends (`run_dispatch(name, ...)`):
- "dense": every expert runs on every token and a [tokens, experts] combine matrix zeroes what was not routed.
  Obviously correct, cost grows with the number of experts: the test oracle.
- "ragged": sort assignments by expert, gather rows, grouped matmuls, weighted scatter-add back. The default.
  The grouped matmul is `jax.lax.ragged_dot` off CPU; on CPU per-expert slot tensors and plain batched GEMMs
  ("slots", expert_slots.py; ~3x less time than the padded-block form "blocked", itself ~4x faster than
  ragged_dot on XLA:CPU).
  Given a mesh it runs data-parallel under shard_map (each token shard locally, see dispatch_ep.py).
- "ep_allgather" / "ep_alltoall": expert parallelism under `jax.shard_map` (see dispatch_ep.py).

Capacity semantics, shared by every backend so they agree exactly even when dropping: the T tokens are split
into `n_groups` contiguous groups (one per token shard of the mesh, 1 without a mesh). Within a group each
expert accepts at most `capacity` assignments, first come first served in (token, k-slot) order; the rest are
dropped (contribute nothing). `capacity=None` is dropless. Padding tokens (`valid=False`) are never routed:
they neither take capacity nor count as assignments, and their output is zero.

The capacity rule and the per-shard expert compute (sort, grouped matmuls, scatter-add) live in
dispatch_local.py, which dispatch_ep.py builds on too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from moe_trainer.dispatch_ep import ep_dispatch
from moe_trainer.dispatch_local import count_dropped, kept_assignments, sorted_expert_compute
from moe_trainer.layers import Params, cast


def dense_dispatch(
    x: jax.Array, expert_ids: jax.Array, weights: jax.Array, keep: jax.Array, experts: Params
) -> jax.Array:
    """Oracle: run all experts on all tokens, combine with a [T, E] weight matrix. Returns float32 [T, D]."""
    dt = x.dtype
    t = x.shape[0]
    n_experts = experts["w_gate"].shape[0]
    combine = jnp.zeros((t, n_experts), jnp.float32)
    combine = combine.at[jnp.arange(t)[:, None], expert_ids].add(jnp.where(keep, weights, 0.0))
    gate = jnp.einsum("td,edf->tef", x, cast(experts["w_gate"], dt))
    up = jnp.einsum("td,edf->tef", x, cast(experts["w_up"], dt))
    y = jnp.einsum("tef,efd->ted", jax.nn.silu(gate) * up, cast(experts["w_down"], dt))
    return jnp.einsum("ted,te->td", y.astype(jnp.float32), combine)


def ragged_dispatch(
    x: jax.Array, expert_ids: jax.Array, weights: jax.Array, keep: jax.Array, experts: Params,
    matmul: str = "auto",
) -> jax.Array:
    """Sort assignments by expert and run grouped matmuls. Returns float32 [T, D]."""
    return sorted_expert_compute(x, expert_ids, weights, keep, experts, matmul)


def run_dispatch(
    name: str,
    x: jax.Array,
    expert_ids: jax.Array,
    weights: jax.Array,
    valid: jax.Array,
    experts: Params,
    *,
    capacity: int | None,
    n_groups: int = 1,
    mesh: Mesh | None = None,
    matmul: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    """Route x [T, D] (compute dtype) through the experts; returns (out [T, D] in x.dtype, dropped int32).

    expert_ids int32 [T, k] and weights float32 [T, k] come from the router; valid bool [T] marks real tokens;
    experts holds w_gate/w_up [E, D, F] and w_down [E, F, D]; capacity is slots per expert per token group
    (None = dropless); n_groups is the number of token groups (the mesh's token shards for the EP backends);
    matmul picks the grouped matmul of "ragged" and "ep_allgather" (see dispatch_local.grouped_swiglu).
    """
    if name == "dense" or (name == "ragged" and mesh is None):
        n_experts = experts["w_gate"].shape[0]
        keep, _ = kept_assignments(expert_ids, valid, n_experts, capacity, n_groups)
        if name == "dense":
            out = dense_dispatch(x, expert_ids, weights, keep, experts)
        else:
            out = ragged_dispatch(x, expert_ids, weights, keep, experts, matmul)
        return out.astype(x.dtype), count_dropped(keep, valid)
    if name in ("ragged", "ep_allgather", "ep_alltoall"):
        if mesh is None:
            raise ValueError(
                f"dispatch={name!r} runs expert parallelism and needs a mesh: pass mesh=make_mesh(...) to "
                "forward, or choose dispatch='ragged' on a single device"
            )
        out, dropped = ep_dispatch(name, x, expert_ids, weights, valid, experts, capacity=capacity, mesh=mesh,
                                   matmul=matmul)
        return out.astype(x.dtype), dropped
    raise ValueError(f"unknown dispatch backend {name!r}: choose dense, ragged, ep_allgather or ep_alltoall")
