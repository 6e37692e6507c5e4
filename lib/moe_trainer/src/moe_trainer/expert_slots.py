"""Dropless expert compute as per-expert slot tensors: the grouped matmul "slots" (the CPU default).

Assignments are sorted by expert and laid out as a slot tensor [E, C, D] (expert e's i-th assignment in slot
(e, i)), so every expert matmul is one plain batched GEMM `[E, C, D] x [E, D, 2F]` against the stacked weights
and every weight gradient is one batched GEMM `[E, D, C] x [E, C, 2F]`: no per-block copy of the weights and
no scatter-add of per-block weight gradients (what the "blocked" grouped matmul pays). C must be static, yet
routing is dropless, so the slots come in two parts: a first chunk of `c0` slots per expert (the mean load,
rounded up; no weight copies) and then *overflow blocks* of `c1` slots, each belonging to one expert: expert e
gets ceil((count_e - c0) / c1) of them. A `fori_loop` whose trip count is data dependent processes E blocks
per trip as one batched GEMM against the blocks' gathered expert weights (`w[e_block]`), and scatter-adds the
blocks' weight gradients back per expert. Balanced routing runs no trip; a skewed one runs one trip per E
overflow blocks, and a collapsed one (every token on one expert) many, and all stay exact.

Why blocks and not whole chunks: the first version ran each extra chunk over every expert (E * c1 slots, one
block per expert), so the rows computed were E times the *largest* load. At the benchmark's start (random
tokens, initial router) the largest load of a layer is 1.1-2.1x the mean, and those mostly-padding chunks cost
about as much as the first chunk; per-expert blocks compute only the overflow (rounded up to c1 per
expert). The gathered weights cost a copy per block, paid only on overflow rows. In the tiny preset's train
step: ~10 ms (~5%) less per step, bit-identical loss (same per-token summation order).

The forward and backward passes are written by hand (`jax.custom_vjp`): autodiff of a `fori_loop` is not
possible, and the hand-written backward needs neither stored activations (it recomputes the gate/up GEMM, the
only forward GEMM it needs; the combine-weight gradient <y, dy> is taken as <h, dy W_down^T>, which the
backward computes anyway) nor a copy of any [E, C, *] tensor in the residuals.

At the tiny preset's shape (2048 tokens, top-2 of 8 experts, d 128, expert width 128) one layer's expert
forward + backward took ~10 ms on the 2-core CPU against ~27-31 ms for "blocked" (docs/benchmarks/trainer.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moe_trainer.layers import Params, cast

# (x, combine weights [T*k], w_gu [E, D, 2F], w_down [E, F, D], order [T*k], counts [E], starts [E])
_Res = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def chunk_sizes(m: int, n_experts: int) -> tuple[int, int]:
    """(c0, c1): slots per expert of the first chunk (mean load of m assignments, rounded up to 8) and rows of
    each overflow block (an eighth of that, at least 8)."""
    c0 = _round_up(max(-(-m // n_experts), 1), 8)
    return c0, _round_up(max(c0 // 8, 8), 8)


def _slots(res: _Res, k: int, experts: jax.Array, offsets: jax.Array | int, c: int,
           live: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Slots [offset, offset + c) of each listed expert (rows of the result follow `experts` [G]): (used bool
    [G, c], flat assignment index, token index; T for unused slots, which gathers zeros and is dropped by the
    scatters). `live` [G] marks blocks that exist (the padding blocks of the last overflow step do not)."""
    x, _, _, _, order, counts, starts = res
    slot = jnp.asarray(offsets, jnp.int32).reshape(-1, 1) + jnp.arange(c, dtype=jnp.int32)[None, :]
    used = slot < counts[experts][:, None]
    if live is not None:
        used = used & live[:, None]
    a = order[jnp.where(used, starts[experts][:, None] + slot, 0)]
    return used, a, jnp.where(used, a // k, x.shape[0])


def _overflow_blocks(counts: jax.Array, c0: int, c1: int, step: jax.Array, g: int
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Overflow blocks step*g .. step*g+g-1: (expert [g], first slot [g], live [g]).

    Expert e's assignments past the first chunk, slots [c0, counts[e]), are cut into blocks of c1 slots; the
    blocks of all experts are numbered expert by expert. Blocks past the last one are not live (they read
    expert E-1's slots, all masked out)."""
    n_blocks = jnp.maximum(0, counts - c0 + c1 - 1) // c1  # (E,)
    end = jnp.cumsum(n_blocks)
    j = step * g + jnp.arange(g, dtype=jnp.int32)
    expert = jnp.minimum(jnp.sum(end[None, :] <= j[:, None], axis=1), counts.shape[0] - 1).astype(jnp.int32)
    first = c0 + (j - (end - n_blocks)[expert]) * c1
    return expert, first, j < end[-1]


def _overflow_steps(counts: jax.Array, c0: int, c1: int, g: int) -> jax.Array:
    """Loop trips over the overflow blocks, g blocks per trip (0 when no expert has more than c0
    assignments)."""
    total = jnp.sum(jnp.maximum(0, counts - c0 + c1 - 1) // c1)
    return (total + g - 1) // g


def _forward_chunk(res: _Res, k: int, experts: jax.Array, offsets: jax.Array | int, c: int,
                   live: jax.Array | None, w_gu: jax.Array, w_down: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(token index [G*c], weighted expert output float32 [G*c, D]) of G blocks of c slots; w_gu [G, D, 2F]
    and w_down [G, F, D] are the blocks' expert weights."""
    x, wflat = res[:2]
    used, a, tok = _slots(res, k, experts, offsets, c, live)
    xp = jnp.take(x, tok, axis=0, mode="fill", fill_value=0)  # (G, c, D)
    gate, up = jnp.split(jnp.einsum("ecd,edf->ecf", xp, w_gu), 2, axis=-1)
    y = jnp.einsum("ecf,efd->ecd", jax.nn.silu(gate) * up, w_down).astype(jnp.float32)
    y = y * jnp.where(used, wflat[a], 0.0)[..., None]
    return tok.reshape(-1), y.reshape(-1, x.shape[1])


def _backward_chunk(res: _Res, ct: jax.Array, k: int, experts: jax.Array, offsets: jax.Array | int, c: int,
                    live: jax.Array | None, w_gu: jax.Array, w_down: jax.Array) -> tuple[jax.Array, ...]:
    """G blocks' (token index, dx rows, assignment index, d combine weight, d w_gu [G, D, 2F], d w_down)."""
    x, wflat = res[:2]
    dt = x.dtype
    used, a, tok = _slots(res, k, experts, offsets, c, live)
    sw = jnp.where(used, wflat[a], 0.0)[..., None]  # (G, c, 1) float32
    xp = jnp.take(x, tok, axis=0, mode="fill", fill_value=0)
    gate, up = jnp.split(jnp.einsum("ecd,edf->ecf", xp, w_gu).astype(jnp.float32), 2, axis=-1)
    sig = jax.nn.sigmoid(gate)
    h = gate * sig * up  # (G, c, F)
    dy = jnp.take(ct, tok, axis=0, mode="fill", fill_value=0)  # (G, c, D) float32, before the combine weight
    dh_unweighted = jnp.einsum("ecd,efd->ecf", dy.astype(dt), w_down).astype(jnp.float32)
    d_weight = jnp.sum(h * dh_unweighted, axis=-1)  # <y, dy> = <h, dy W_down^T>
    d_w_down = jnp.einsum("ecf,ecd->efd", (h * sw).astype(dt), dy.astype(dt))
    dh = dh_unweighted * sw
    d_gu = jnp.concatenate([dh * up * sig * (1 + gate * (1 - sig)), dh * gate * sig], axis=-1).astype(dt)
    d_w_gu = jnp.einsum("ecd,ecf->edf", xp, d_gu)
    dxp = jnp.einsum("ecf,edf->ecd", d_gu, w_gu)
    a_or_drop = jnp.where(used, a, wflat.shape[0])
    return (tok.reshape(-1), dxp.reshape(-1, x.shape[1]), a_or_drop.reshape(-1), d_weight.reshape(-1),
            d_w_gu, d_w_down)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _expert_slots(x: jax.Array, wflat: jax.Array, w_gu: jax.Array, w_down: jax.Array, order: jax.Array,
                  counts: jax.Array, starts: jax.Array, k: int, c0: int, c1: int) -> jax.Array:
    res = (x, wflat, w_gu, w_down, order, counts, starts)
    n_e = w_gu.shape[0]
    all_experts = jnp.arange(n_e, dtype=jnp.int32)
    tok, y = _forward_chunk(res, k, all_experts, 0, c0, None, w_gu, w_down)
    out = jnp.zeros((x.shape[0], x.shape[1]), jnp.float32).at[tok].add(y, mode="drop")

    def extra(i: jax.Array, out: jax.Array) -> jax.Array:
        e, first, live = _overflow_blocks(counts, c0, c1, i, n_e)
        tok, y = _forward_chunk(res, k, e, first, c1, live, w_gu[e], w_down[e])
        return out.at[tok].add(y, mode="drop")

    total: jax.Array = jax.lax.fori_loop(0, _overflow_steps(counts, c0, c1, n_e), extra, out)  # typed Any
    return total


def _expert_slots_fwd(x: jax.Array, wflat: jax.Array, w_gu: jax.Array, w_down: jax.Array, order: jax.Array,
                      counts: jax.Array, starts: jax.Array, k: int, c0: int, c1: int) -> tuple[jax.Array,
                                                                                               _Res]:
    res = (x, wflat, w_gu, w_down, order, counts, starts)
    return _expert_slots(*res, k, c0, c1), res


def _expert_slots_bwd(k: int, c0: int, c1: int, res: _Res, ct: jax.Array) -> tuple[jax.Array | None, ...]:
    x, wflat, w_gu, w_down, _, counts, _ = res
    n_e = w_gu.shape[0]
    dx = jnp.zeros(x.shape, jnp.float32)
    dw = jnp.zeros(wflat.shape, jnp.float32)
    tok, dxp, a, d_weight, d_gu, d_down = _backward_chunk(res, ct, k, jnp.arange(n_e, dtype=jnp.int32), 0, c0,
                                                          None, w_gu, w_down)
    carry = (dx.at[tok].add(dxp.astype(jnp.float32), mode="drop"), dw.at[a].add(d_weight, mode="drop"), d_gu,
             d_down)

    def extra(i: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        dx, dw, d_gu, d_down = carry
        e, first, live = _overflow_blocks(counts, c0, c1, i, n_e)
        tok, dxp, a, d_weight, d_gu_c, d_down_c = _backward_chunk(res, ct, k, e, first, c1, live, w_gu[e],
                                                                  w_down[e])
        return (dx.at[tok].add(dxp.astype(jnp.float32), mode="drop"), dw.at[a].add(d_weight, mode="drop"),
                d_gu.at[e].add(d_gu_c), d_down.at[e].add(d_down_c))

    carry = jax.lax.fori_loop(0, _overflow_steps(counts, c0, c1, n_e), extra, carry)
    dx, dw, d_gu, d_down = carry
    return dx.astype(x.dtype), dw.astype(wflat.dtype), d_gu, d_down, None, None, None


_expert_slots.defvjp(_expert_slots_fwd, _expert_slots_bwd)


def _vary_alike(*arrays: jax.Array) -> list[jax.Array]:
    """Under shard_map, mark every array as varying over the union of the arrays' varying manual axes.

    A custom_vjp's backward must return cotangents typed like its inputs; the output (and so its cotangent)
    varies over every axis any input varies over, so the inputs are cast up front and autodiff of the cast
    adds the psums a mixed-type product would have needed. Outside shard_map this is the identity.
    """
    def varying(a: jax.Array) -> frozenset[str]:
        axes: frozenset[str] = jax.typeof(a).mat.varying  # the aval is typed Any; our mesh axis names are str
        return axes

    union = frozenset().union(*(varying(a) for a in arrays))
    return [jax.lax.pcast(a, tuple(sorted(union - varying(a))), to="varying") if union - varying(a) else a
            for a in arrays]


def slots_expert_compute(
    x: jax.Array, local_ids: jax.Array, weights: jax.Array, local: jax.Array, experts: Params
) -> jax.Array:
    """SwiGLU experts over per-expert slot tensors for the assignments flagged `local`: float32 [T, D].

    x [T, D] (compute dtype), local_ids int32 / weights float32 / local bool [T, k]; same semantics as
    `dispatch_local.sorted_expert_compute` (ids index `experts`, unflagged assignments contribute nothing).
    """
    t, k = local_ids.shape
    n_local = experts["w_gate"].shape[0]
    flat = jnp.where(local, local_ids, n_local).reshape(-1)  # non-local / dropped -> trailing dummy expert
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    counts = jnp.bincount(flat, length=n_local + 1)[:n_local].astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    dt = x.dtype
    w_gu = cast(jnp.concatenate([experts["w_gate"], experts["w_up"]], axis=-1), dt)  # gate/up as one GEMM
    c0, c1 = chunk_sizes(t * k, n_local)
    x, wflat, w_gu, w_down = _vary_alike(x, weights.reshape(-1).astype(jnp.float32), w_gu,
                                         cast(experts["w_down"], dt))
    return _expert_slots(x, wflat, w_gu, w_down, order, counts, starts, k, c0, c1)
