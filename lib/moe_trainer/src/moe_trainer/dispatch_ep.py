"""Sharded dispatch under `jax.shard_map` over the mesh axes ("data", "expert", "model").

Layout inside the shard_map: tokens are split over ("data", "expert") (each device holds one token group),
experts are split over "expert" (device i along that axis owns experts [i*E_l, (i+1)*E_l)), and when the
expert hidden width divides the "model" axis each expert's hidden units are split over "model" too (tensor
parallel inside the expert; the down projection is then summed over "model"). Each "data" row is an
independent replica.

- "ep_allgather" (ring style): all-gather the tokens, expert ids and weights of the ep peers, keep only the
  assignments to local experts, run them with ragged_dot, then reduce-scatter (psum_scatter) the partial
  outputs back to their owners. Static shapes; traffic grows with the ep size.
- "ep_alltoall": pack each assignment into a fixed [ep, E_l, capacity, D] send buffer (slot = its queue
position
  in its (group, expert) queue), exchange with `all_to_all`, run the experts as a batched matmul over the
  capacity slots, exchange back and gather each token's results. Dropless (capacity=None) uses capacity = all
  tokens of the group, correct but memory-hungry ([E, T_local, D] buffers). `jax.lax.ragged_all_to_all` would
  avoid that on GPU/TPU but has no CPU lowering, so it is not offered here.

"ragged" with a mesh also runs here, data-parallel: each token shard sorts and multiplies its own tokens with
all experts (weights gathered over "expert"/"data" by XLA, hidden units split over "model" as above), so no
token leaves its device; XLA's automatic partitioning of the sort/gather/scatter would otherwise replicate it.

All three apply exactly the capacity rule of dispatch.py with one group per token shard, so they equal the
"dense" oracle run with n_groups = data * expert.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from moe_trainer.dispatch_local import count_dropped, kept_assignments, sorted_expert_compute
from moe_trainer.jax_typed import P, all_to_all, psum, psum_scatter
from moe_trainer.layers import Params, cast

TOKEN_AXES = ("data", "expert")


def _expert_specs(experts: Params, mesh: Mesh, expert_axis: str | None
                  ) -> tuple[dict[str, PartitionSpec], bool]:
    """PartitionSpecs of the expert weights inside the shard_map, and whether hidden units split over
    model."""
    hidden = experts["w_gate"].shape[2]
    split = mesh.shape["model"] > 1 and hidden % mesh.shape["model"] == 0
    m = "model" if split else None
    e = expert_axis
    return {"w_gate": P(e, None, m), "w_up": P(e, None, m), "w_down": P(e, m, None)}, split


def _ragged_local(
    x: jax.Array, ids: jax.Array, w: jax.Array, valid: jax.Array, experts: Params,
    *, capacity: int | None, n_experts: int, split_model: bool, matmul: str,
) -> tuple[jax.Array, jax.Array]:
    """Data-parallel MoE: every token shard runs its own tokens through all (gathered) experts."""
    keep, _ = kept_assignments(ids, valid, n_experts, capacity, n_groups=1)
    out = sorted_expert_compute(x, ids, w, keep, experts, matmul)
    if split_model:
        out = psum(out, "model")
    return out, psum(count_dropped(keep, valid), TOKEN_AXES)


def _allgather_local(
    x: jax.Array, ids: jax.Array, w: jax.Array, valid: jax.Array, experts: Params,
    *, capacity: int | None, n_experts: int, split_model: bool, matmul: str,
) -> tuple[jax.Array, jax.Array]:
    ep = jax.lax.axis_size("expert")
    me = jax.lax.axis_index("expert")
    n_local = n_experts // ep
    xg, idg, wg, vg = (jax.lax.all_gather(a, "expert", tiled=True) for a in (x, ids, w, valid))
    keep, _ = kept_assignments(idg, vg, n_experts, capacity, n_groups=ep)
    mine = (idg // n_local) == me
    # (ep*T_l, D) partial
    out = sorted_expert_compute(xg, idg - me * n_local, wg, keep & mine, experts, matmul)
    if split_model:
        out = psum(out, "model")
    out = psum_scatter(out, "expert", scatter_dimension=0, tiled=True)
    dropped = psum(count_dropped(keep | ~mine, vg), TOKEN_AXES)
    return out, dropped


def _alltoall_local(
    x: jax.Array, ids: jax.Array, w: jax.Array, valid: jax.Array, experts: Params,
    *, capacity: int | None, n_experts: int, split_model: bool, matmul: str,
) -> tuple[jax.Array, jax.Array]:
    del matmul  # fixed capacity slots make the expert compute a plain batched matmul
    ep = jax.lax.axis_size("expert")
    n_local = n_experts // ep
    t, k = ids.shape
    cap = t if capacity is None else capacity
    # Dropless still needs distinct slots per expert: capacity = every token of the group, so all fit.
    keep, pos = kept_assignments(ids, valid, n_experts, cap, n_groups=1)
    dest, local_e = ids // n_local, ids % n_local
    slot = jnp.where(keep, pos, cap)  # out of range -> dropped by the scatter below
    token = jnp.broadcast_to(jnp.arange(t)[:, None], (t, k))
    send = jnp.zeros((ep, n_local, cap, x.shape[1]), x.dtype)
    send = send.at[dest, local_e, slot].set(x[token], mode="drop")
    recv = all_to_all(send, "expert", 0, 0, tiled=True)  # (source shard, E_l, cap, D)
    dt = x.dtype
    gate = jnp.einsum("secd,edf->secf", recv, cast(experts["w_gate"], dt))
    up = jnp.einsum("secd,edf->secf", recv, cast(experts["w_up"], dt))
    y = jnp.einsum("secf,efd->secd", jax.nn.silu(gate) * up, cast(experts["w_down"], dt))
    if split_model:
        y = psum(y, "model")
    back = all_to_all(y, "expert", 0, 0, tiled=True)  # (dest shard, E_l, cap, D)
    rows = back[dest, local_e, jnp.where(keep, pos, 0)].astype(jnp.float32)  # (T, k, D)
    out = jnp.einsum("tkd,tk->td", rows, jnp.where(keep, w, 0.0))
    dropped = psum(count_dropped(keep, valid), TOKEN_AXES)
    return out, dropped


def ep_dispatch(
    name: str, x: jax.Array, expert_ids: jax.Array, weights: jax.Array, valid: jax.Array, experts: Params,
    *, capacity: int | None, mesh: Mesh, matmul: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    """Run a backend under shard_map; returns (float32 out [T, D], dropped int32). See the module
    docstring."""
    for axis in ("data", "expert", "model"):
        if axis not in mesh.shape:
            raise ValueError(f"dispatch={name!r} needs a mesh with axes data, expert, model (make_mesh); "
                             f"got axes {tuple(mesh.shape)}")
    n_experts = experts["w_gate"].shape[0]
    ep, shards = mesh.shape["expert"], mesh.shape["data"] * mesh.shape["expert"]
    if n_experts % ep and name != "ragged":
        raise ValueError(f"n_experts={n_experts} must be divisible by the mesh's expert axis ({ep}) for "
                         f"{name}")
    if x.shape[0] % shards:
        raise ValueError(f"{x.shape[0]} tokens cannot be split over data*expert={shards} shards for {name}: "
                         "make batch*seq divisible by it")
    if name == "ragged":
        specs, split_model = _expert_specs(experts, mesh, None)
        local = _ragged_local
    else:
        specs, split_model = _expert_specs(experts, mesh, "expert")
        local = _allgather_local if name == "ep_allgather" else _alltoall_local

    def body(x: jax.Array, ids: jax.Array, w: jax.Array, valid: jax.Array, ex: Params
             ) -> tuple[jax.Array, jax.Array]:
        return local(x, ids, w, valid, ex, capacity=capacity, n_experts=n_experts, split_model=split_model,
                     matmul=matmul)

    tok = P(TOKEN_AXES)
    ex = {k: experts[k] for k in ("w_gate", "w_up", "w_down")}
    fn = jax.shard_map(body, mesh=mesh, in_specs=(tok, tok, tok, tok, specs), out_specs=(tok, P()))
    return fn(x, expert_ids, weights, valid, ex)
