"""The per-shard pieces of expert dispatch that dispatch.py and dispatch_ep.py share.

- The capacity rule (`queue_positions`, `kept_assignments`, `count_dropped`; semantics in dispatch.py's
  docstring): which assignments each (token group, expert) queue keeps.
- The local expert compute (`sorted_expert_compute` and the grouped matmuls under it): run the kept
  assignments of one shard through its SwiGLU experts and scatter-add the weighted results.

dispatch.py (the backend entry `run_dispatch`) and dispatch_ep.py (the shard_map backends) both build on this
module, which imports neither of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moe_trainer.expert_slots import slots_expert_compute
from moe_trainer.layers import Params, cast


def queue_positions(expert_ids: jax.Array, valid: jax.Array, n_experts: int, n_groups: int) -> jax.Array:
    """Arrival index of every assignment in its (group, expert) queue: int32 [T, k].

    A stable sort on (group, expert) keeps (token, slot) order inside each queue, so the position is the rank
    of the assignment minus the first rank of its queue. Invalid tokens go to a trailing dummy expert.
    """
    t, k = expert_ids.shape
    if t % n_groups:
        raise ValueError(f"{t} tokens cannot be split into n_groups={n_groups} equal token groups")
    group = (jnp.arange(t, dtype=jnp.int32) // (t // n_groups))[:, None]
    e = jnp.where(valid[:, None], expert_ids, n_experts)
    key = (group * (n_experts + 1) + e).reshape(-1)
    order = jnp.argsort(key, stable=True)
    sorted_key = key[order]
    counts = jnp.bincount(key, length=n_groups * (n_experts + 1))
    starts = jnp.cumsum(counts) - counts
    pos_sorted = jnp.arange(t * k, dtype=jnp.int32) - starts[sorted_key].astype(jnp.int32)
    return jnp.zeros((t * k,), jnp.int32).at[order].set(pos_sorted).reshape(t, k)


def kept_assignments(
    expert_ids: jax.Array, valid: jax.Array, n_experts: int, capacity: int | None, n_groups: int
) -> tuple[jax.Array, jax.Array]:
    """(keep bool [T, k], queue positions int32 [T, k]) under the capacity rule of the module docstring."""
    keep = jnp.broadcast_to(valid[:, None], expert_ids.shape)
    if capacity is None:
        return keep, jnp.zeros(expert_ids.shape, jnp.int32)
    pos = queue_positions(expert_ids, valid, n_experts, n_groups)
    return keep & (pos < capacity), pos


def count_dropped(keep: jax.Array, valid: jax.Array) -> jax.Array:
    """Number of routed (valid) assignments that did not fit: int32 scalar."""
    return jnp.sum(valid[:, None] & ~keep, dtype=jnp.int32)


GROUPED_MATMULS: tuple[str, ...] = ("auto", "ragged_dot", "blocked", "slots")


def resolve_grouped_matmul(name: str) -> str:
    """"auto" -> "slots" on CPU and "ragged_dot" elsewhere.

    XLA:CPU lowers ragged_dot about as slowly as a dense matmul over every expert; the blocked form took ~4x
    less CPU time there (benchmarks/dispatch_throughput.py) and the slot tensors of expert_slots.py ~3x less
    than blocked (docs/benchmarks/trainer.md). GPU/TPU keep ragged_dot (their grouped-GEMM kernels).
    """
    if name == "auto":
        return "slots" if jax.default_backend() == "cpu" else "ragged_dot"
    if name not in GROUPED_MATMULS:
        raise ValueError(f"unknown grouped matmul {name!r}: choose one of {list(GROUPED_MATMULS)}")
    return name


def block_rows(m: int, g: int) -> int:
    """Rows per block of the blocked grouped matmul for m rows in g groups.

    The static padded size is (ceil(m / b) + g) * b rows, so smaller blocks waste less (at 4096 rows in 8
    groups: b=128 computes 5120 rows, b=64 4608) while too small ones starve the GEMM; 64 measured best
    on XLA:CPU for the tiny preset's 128-wide experts (docs/benchmarks/trainer.md).
    """
    return int(min(64, max(8, m // g)))


def _block_layout(group_sizes: jax.Array, m: int, b: int
                  ) -> tuple[jax.Array, jax.Array, int, jax.Array, jax.Array]:
    """Padded-block layout of m rows grouped by `group_sizes` (each group padded to whole blocks of b rows).

    Returns (src [n_blocks*b]: the row each slot reads, m for padding; block_group [n_blocks]; n_blocks =
    ceil(m / b) + G, enough for any group sizes summing to at most m; pad_start [G]: first slot of each group;
    start [G]: first row of each group).
    """
    g = group_sizes.shape[0]
    n_blocks = -(-m // b) + g
    padded = ((group_sizes + b - 1) // b) * b
    pad_end = jnp.cumsum(padded)
    pad_start, start = pad_end - padded, jnp.cumsum(group_sizes) - group_sizes
    slot = jnp.arange(n_blocks * b)
    slot_group = jnp.minimum(jnp.searchsorted(pad_end, slot, side="right"), g - 1)
    within = slot - pad_start[slot_group]
    src = jnp.where(within < group_sizes[slot_group], start[slot_group] + within, m)  # m = out of range -> 0
    return src, slot_group.reshape(n_blocks, b)[:, 0], n_blocks, pad_start, start


def blocked_grouped_matmul(xs: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """ragged_dot semantics (lhs [M, K] rows grouped by `group_sizes`, rhs [G, K, N]) with plain batched
    matmuls.

    Each group is padded to a multiple of a block of b rows; every block multiplies the weight of its group.
    Static shapes: at most ceil(M/b) + G blocks. Rows past sum(group_sizes) come out zero.
    """
    m, g = xs.shape[0], w.shape[0]
    src, block_group, n_blocks, pad_start, start = _block_layout(group_sizes, m, block_rows(m, g))
    xp = jnp.take(xs, src, axis=0, mode="fill", fill_value=0).reshape(n_blocks, -1, xs.shape[1])
    yp = jnp.einsum("nbk,nkf->nbf", xp, w[block_group]).reshape(src.shape[0], -1)
    row = jnp.arange(m)
    row_group = jnp.minimum(jnp.searchsorted(jnp.cumsum(group_sizes), row, side="right"), g - 1)
    out = yp[pad_start[row_group] + row - start[row_group]]
    return jnp.where((row < jnp.sum(group_sizes))[:, None], out, 0).astype(xs.dtype)


def grouped_swiglu(xs: jax.Array, group_sizes: jax.Array, experts: Params, matmul: str = "auto") -> jax.Array:
    """SwiGLU of expert-sorted rows xs [M, D]; rows past sum(group_sizes) come out zero.

    matmul: "ragged_dot" (jax.lax.ragged_dot, fast on GPU/TPU), "blocked" (see blocked_grouped_matmul) or
    "auto" (by platform; "slots" has no row-wise form and takes "blocked" here).
    """
    dt = xs.dtype
    mm = jax.lax.ragged_dot if resolve_grouped_matmul(matmul) == "ragged_dot" else blocked_grouped_matmul
    gate = mm(xs, cast(experts["w_gate"], dt), group_sizes)
    up = mm(xs, cast(experts["w_up"], dt), group_sizes)
    return mm(jax.nn.silu(gate) * up, cast(experts["w_down"], dt), group_sizes)


def blocked_expert_compute(
    x: jax.Array, local_ids: jax.Array, weights: jax.Array, local: jax.Array, experts: Params
) -> jax.Array:
    """The blocked grouped-matmul SwiGLU experts, gathering straight from x and scattering straight into the
    output: float32 [T, D]. Same semantics as `sorted_expert_compute`.

    Assignments are sorted by expert and each expert's queue is padded to whole blocks of b rows (static
    ceil(T*k / b) + E blocks; see `blocked_grouped_matmul`). Every padded slot knows its token and combine
    weight (0 for padding), so one gather of x fills the blocks and one weighted scatter-add writes the
    result: no [T*k, D] sorted copies in between. Gate and up projections run as one [D, 2F] matmul.
    """
    t, k = local_ids.shape
    n_local = experts["w_gate"].shape[0]
    m = t * k
    flat = jnp.where(local, local_ids, n_local).reshape(-1)  # non-local / dropped -> trailing dummy group
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=n_local + 1)[:n_local].astype(jnp.int32)
    src, block_group, n_blocks, _, _ = _block_layout(group_sizes, m, block_rows(m, n_local))
    used = src < m
    assignment = order[jnp.where(used, src, 0)]  # index into the flat [T*k] assignments
    slot_token = jnp.where(used, assignment // k, t)  # t = out of range: gathers 0, the scatter drops it
    slot_weight = jnp.where(used, weights.reshape(-1)[assignment], 0.0)
    dt = x.dtype
    w_gu = cast(jnp.concatenate([experts["w_gate"], experts["w_up"]], axis=-1), dt)[block_group]  # (n, D, 2F)
    # (n,b,D)
    xp = jnp.take(x, slot_token, axis=0, mode="fill", fill_value=0).reshape(n_blocks, -1, x.shape[1])
    gate, up = jnp.split(jnp.einsum("nbd,ndf->nbf", xp, w_gu), 2, axis=-1)
    yp = jnp.einsum("nbf,nfd->nbd", jax.nn.silu(gate) * up, cast(experts["w_down"], dt)[block_group])
    contrib = yp.reshape(slot_token.shape[0], -1).astype(jnp.float32) * slot_weight[:, None]
    return jnp.zeros((t, x.shape[1]), jnp.float32).at[slot_token].add(contrib, mode="drop")


def sorted_expert_compute(
    x: jax.Array, local_ids: jax.Array, weights: jax.Array, local: jax.Array, experts: Params,
    matmul: str = "auto",
) -> jax.Array:
    """Sort + ragged_dot + scatter-add for the assignments flagged `local` (ids index `experts`).

    x [T, D], local_ids/weights/local [T, k]. Returns float32 [T, D]. Shared by "ragged" and "ep_allgather".
    The "blocked" grouped matmul takes the fused path of `blocked_expert_compute`, "slots" the slot tensors of
    `expert_slots.slots_expert_compute`.
    """
    kind = resolve_grouped_matmul(matmul)
    if kind == "slots":
        return slots_expert_compute(x, local_ids, weights, local, experts)
    if kind == "blocked":
        return blocked_expert_compute(x, local_ids, weights, local, experts)
    t, k = local_ids.shape
    n_local = experts["w_gate"].shape[0]
    flat = jnp.where(local, local_ids, n_local).reshape(-1)  # non-local / dropped -> trailing dummy group
    order = jnp.argsort(flat, stable=True)
    token = order // k
    group_sizes = jnp.bincount(flat, length=n_local + 1)[:n_local].astype(jnp.int32)
    ys = grouped_swiglu(x[token], group_sizes, experts, matmul)  # (M, D)
    w = jnp.where(local, weights, 0.0).reshape(-1)[order]
    return jnp.zeros((t, x.shape[1]), jnp.float32).at[token].add(ys.astype(jnp.float32) * w[:, None])
