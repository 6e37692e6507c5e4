"""Every dispatch backend against the dense oracle: values, gradients, padding, capacity drops (8 CPU
devices)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_trainer.dispatch import run_dispatch
from moe_trainer.dispatch_local import queue_positions
from moe_trainer.sharding import make_mesh

T, D, E, K, F = 32, 16, 8, 2, 12  # F divisible by the model axis: EP backends split expert hidden units
GROUPS = 4  # data * expert of the (2, 2, 2) mesh
# (backend, grouped matmul): both grouped-matmul implementations are checked wherever they are used
# ("@mesh": the data-parallel shard_map path "ragged" takes when given a mesh)
BACKENDS = ["ragged:ragged_dot", "ragged:blocked", "ragged:slots", "ragged@mesh:blocked", "ragged@mesh:slots",
            "ep_allgather:ragged_dot", "ep_allgather:blocked", "ep_allgather:slots", "ep_alltoall:auto"]


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    assert jax.device_count() == 8, "the root conftest must give JAX 8 fake CPU devices"
    return make_mesh(data=2, expert=2, model=2)


@pytest.fixture(scope="module")
def inputs() -> dict:
    kx, kl, kg, ku, kd, kc = jax.random.split(jax.random.key(0), 6)
    logits = jax.random.normal(kl, (T, E))
    # Skew routing towards expert 0 so small capacities really drop.
    logits = logits.at[:, 0].add(1.5)
    top, ids = jax.lax.top_k(jax.nn.softmax(logits), K)
    valid = jnp.ones((T,), bool).at[jnp.array([3, 17, 30])].set(False)
    return {
        "x": jax.random.normal(kx, (T, D)),
        "ids": ids.astype(jnp.int32),
        "w": top / top.sum(-1, keepdims=True),
        "valid": valid,
        "experts": {
            "w_gate": 0.3 * jax.random.normal(kg, (E, D, F)),
            "w_up": 0.3 * jax.random.normal(ku, (E, D, F)),
            "w_down": 0.3 * jax.random.normal(kd, (E, F, D)),
        },
        "cot": jax.random.normal(kc, (T, D)),
    }


@functools.cache
def _value_and_grads(backend: str, capacity: int | None, mesh: jax.sharding.Mesh | None) -> object:
    """Jitted (out, dropped, grads wrt x, weights, experts) for one "backend:matmul"; cached across tests."""
    name, _, matmul = backend.partition(":")
    name = name.removesuffix("@mesh")

    def run(x: jax.Array, ids: jax.Array, w: jax.Array, valid: jax.Array, ex: dict, cot: jax.Array) -> tuple:
        def loss(x: jax.Array, w: jax.Array, ex: dict) -> tuple:
            out, dropped = run_dispatch(name, x, ids, w, valid, ex, capacity=capacity, n_groups=GROUPS,
                                        mesh=mesh,
                                        matmul=matmul or "auto")
            return jnp.sum(out * cot), (out, dropped)

        grads, (out, dropped) = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(x, w, ex)
        return out, dropped, grads

    return jax.jit(run)


def _call(name: str, capacity: int | None, mesh: jax.sharding.Mesh | None, inp: dict) -> tuple:
    fn = _value_and_grads(name, capacity, mesh if name.startswith("ep_") or "@mesh" in name else None)
    return fn(inp["x"], inp["ids"], inp["w"], inp["valid"], inp["experts"], inp["cot"])


def _expected_drops(ids: np.ndarray, valid: np.ndarray, capacity: int) -> int:
    """Independent count: per (group, expert), assignments beyond the capacity."""
    drops = 0
    for g in np.split(np.arange(T), GROUPS):
        counts = np.bincount(ids[g][valid[g]].reshape(-1), minlength=E)
        drops += int(np.maximum(counts - capacity, 0).sum())
    return drops


@pytest.mark.parametrize("capacity", [None, 3, 1], ids=["dropless", "cap3", "cap1"])
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_oracle(name: str, capacity: int | None, mesh: jax.sharding.Mesh,
                                inputs: dict) -> None:
    out_ref, drop_ref, g_ref = _call("dense", capacity, mesh, inputs)
    out, drop, g = _call(name, capacity, mesh, inputs)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert int(drop) == int(drop_ref)
    expected = 0 if capacity is None else _expected_drops(np.asarray(inputs["ids"]),
                                                          np.asarray(inputs["valid"]),
                                                          capacity)
    assert int(drop_ref) == expected
    if capacity == 1:
        assert expected > 0, "the skewed routing must make capacity 1 drop something"


@pytest.mark.parametrize("name", ["dense", *BACKENDS])
def test_padding_tokens_give_zero_output_and_gradient(name: str, mesh: jax.sharding.Mesh,
                                                      inputs: dict) -> None:
    out, _, (gx, gw, _) = _call(name, None, mesh, inputs)
    pad = ~np.asarray(inputs["valid"])
    assert np.all(np.asarray(out)[pad] == 0.0)
    assert np.all(np.asarray(gx)[pad] == 0.0) and np.all(np.asarray(gw)[pad] == 0.0)
    assert np.abs(np.asarray(out)[~pad]).min(axis=-1).max() > 0


def test_dropped_assignments_contribute_nothing(mesh: jax.sharding.Mesh, inputs: dict) -> None:
    """With capacity 1 the oracle equals a dropless run in which the dropped weights are zeroed by hand."""
    ids, valid = np.asarray(inputs["ids"]), np.asarray(inputs["valid"])
    w = np.asarray(inputs["w"]).copy()
    for g in np.split(np.arange(T), GROUPS):
        seen: set[int] = set()
        for t in g:
            for j in range(K):
                if not valid[t]:
                    continue
                if ids[t, j] in seen:
                    w[t, j] = 0.0
                seen.add(int(ids[t, j]))
    out_cap, _, _ = _call("dense", 1, mesh, inputs)
    out_manual, _, _ = _call("dense", None, mesh, {**inputs, "w": jnp.asarray(w)})
    np.testing.assert_allclose(out_cap, out_manual, rtol=1e-6, atol=1e-6)


def test_queue_positions_follow_token_order() -> None:
    ids = jnp.array([[0, 1], [1, 2], [0, 1], [2, 0]], jnp.int32)
    valid = jnp.array([True, True, False, True])
    pos = np.asarray(queue_positions(ids, valid, n_experts=3, n_groups=1))
    np.testing.assert_array_equal(pos[[0, 1, 3]], [[0, 0], [1, 0], [1, 1]])
    pos2 = np.asarray(queue_positions(ids, valid, n_experts=3, n_groups=2))
    np.testing.assert_array_equal(pos2[[0, 1, 3]], [[0, 0], [1, 0], [0, 0]])


def test_ep_backend_without_mesh_is_refused(inputs: dict) -> None:
    with pytest.raises(ValueError, match="needs a mesh"):
        run_dispatch("ep_alltoall", inputs["x"], inputs["ids"], inputs["w"], inputs["valid"],
                     inputs["experts"],
                     capacity=None)


def test_blocked_grouped_matmul_equals_ragged_dot() -> None:
    """Empty groups, a group larger than a block, and trailing rows outside every group (which come out 0)."""
    from moe_trainer.dispatch_local import blocked_grouped_matmul

    xs = jax.random.normal(jax.random.key(5), (40, 6))
    w = jax.random.normal(jax.random.key(6), (5, 6, 7))
    sizes = jnp.array([0, 21, 0, 9, 3], jnp.int32)  # sum 33 < 40

    def both(xs: jax.Array, w: jax.Array) -> tuple:
        return jax.lax.ragged_dot(xs, w, sizes), blocked_grouped_matmul(xs, w, sizes)

    ref, got = jax.jit(both)(xs, w)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[33:] == 0.0)
    g_ref = jax.grad(lambda a, b: jnp.sum(jnp.sin(jax.lax.ragged_dot(a, b, sizes))), argnums=(0, 1))(xs, w)
    g_got = jax.grad(lambda a, b: jnp.sum(jnp.sin(blocked_grouped_matmul(a, b, sizes))), argnums=(0, 1))(xs,
                                                                                                         w)
    for a, b in zip(g_got, g_ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_slots_overflow_blocks_cover_every_overflow_slot_once() -> None:
    """The overflow blocks of all loop trips, live ones only, are exactly expert e's slots [c0, count_e) cut
    into blocks of c1, for loads below, at and far above the first chunk (numpy reference)."""
    from moe_trainer.expert_slots import _overflow_blocks, _overflow_steps

    c0, c1, g = 16, 8, 4
    counts = np.array([0, 16, 17, 40, 3, 100, 24, 25], np.int32)
    want = [(e, s) for e, n in enumerate(counts) for s in range(c0, int(n), c1)]
    steps = int(_overflow_steps(jnp.asarray(counts), c0, c1, g))
    got = []
    for i in range(steps):
        e, first, live = (np.asarray(a) for a in _overflow_blocks(jnp.asarray(counts), c0, c1, jnp.int32(i),
                                                                  g))
        got += [(int(a), int(b)) for a, b, ok in zip(e, first, live, strict=True) if ok]
    assert got == want and steps == -(-len(want) // g)


@pytest.mark.parametrize("skew", [0.0, 1.5, 50.0], ids=["random", "skewed", "one_expert"])
def test_slots_handle_any_load(skew: float) -> None:
    """The slot chunks are sized for the mean load: a skewed or fully collapsed routing (every token on expert
    0, several loop trips of overflow blocks) must still equal the oracle in values and gradients, at a shape
    where the first chunk (16 slots per expert here, then overflow blocks of 8) is far from enough."""
    from moe_trainer.dispatch import dense_dispatch
    from moe_trainer.expert_slots import chunk_sizes, slots_expert_compute

    t, d, e, k, f = 64, 8, 8, 2, 6
    kx, kl, kg, ku, kd, kc = jax.random.split(jax.random.key(7), 6)
    logits = jax.random.normal(kl, (t, e)).at[:, 0].add(skew).at[:, 3].add(skew / 2)
    top, ids = jax.lax.top_k(jax.nn.softmax(logits), k)
    w = top / top.sum(-1, keepdims=True)
    keep = jnp.ones((t, k), bool).at[5].set(False)
    x = jax.random.normal(kx, (t, d))
    ex = {"w_gate": jax.random.normal(kg, (e, d, f)), "w_up": jax.random.normal(ku, (e, d, f)),
          "w_down": jax.random.normal(kd, (e, f, d))}
    cot = jax.random.normal(kc, (t, d))
    c0, c1 = chunk_sizes(t * k, e)
    max_load = int(jnp.max(jnp.bincount(jnp.where(keep, ids, e).reshape(-1), length=e + 1)[:e]))
    if skew:
        assert max_load > c0 + 2 * c1, f"routing not skewed enough to need several extra chunks: {max_load}"

    def value_and_grads(fn: object) -> tuple:
        def loss(x: jax.Array, w: jax.Array, ex: dict) -> jax.Array:
            return jnp.sum(fn(x, ids, w, keep, ex) * cot)  # type: ignore[operator]
        return jax.jit(lambda x, w, ex: (fn(x, ids, w, keep, ex), jax.grad(loss, (0, 1, 2))(x, w, ex)))(x, w,
                                                                                                        ex)  # type: ignore[operator]

    out_ref, g_ref = value_and_grads(dense_dispatch)
    out, g = value_and_grads(slots_expert_compute)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
