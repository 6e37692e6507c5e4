"""Throughput of the MoE dispatch backends on whatever device JAX sees; prints one JSON object.

    python lib/moe_trainer/benchmarks/dispatch_throughput.py [--tokens 4096 --d-model 256 --d-ff 256
        --experts 8 --top-k 2 --iters 10]

For each single-device backend ("dense" oracle, "ragged" with ragged_dot, with the blocked grouped matmul and
with the slot tensors of expert_slots.py) it times the jitted forward and forward+backward (gradients with
respect to tokens and expert weights) and reports seconds per call (wall and process CPU time) and the
achieved expert FLOP rate (routed work only: 2 * 3 * tokens * top_k * d_model * d_ff FLOPs forward, 3x that
for forward+backward).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from moe_trainer.dispatch import run_dispatch


def _time(fn: Callable, *args: jax.Array, iters: int) -> dict[str, float]:
    jax.block_until_ready(fn(*args))  # compile + warm up
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(iters):
        jax.block_until_ready(fn(*args))
    return {"wall_s": (time.perf_counter() - w0) / iters, "cpu_s": (time.process_time() - c0) / iters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()

    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (a.tokens, a.d_model))
    top, ids = jax.lax.top_k(jax.random.normal(keys[1], (a.tokens, a.experts)), a.top_k)
    weights = jax.nn.softmax(top, axis=-1)
    valid = jnp.ones((a.tokens,), bool)
    scale = a.d_model**-0.5
    experts = {"w_gate": scale * jax.random.normal(keys[2], (a.experts, a.d_model, a.d_ff)),
               "w_up": scale * jax.random.normal(keys[3], (a.experts, a.d_model, a.d_ff)),
               "w_down": scale * jax.random.normal(keys[4], (a.experts, a.d_ff, a.d_model))}
    fwd_flops = 2 * 3 * a.tokens * a.top_k * a.d_model * a.d_ff

    results = {}
    for label, name, matmul in [("dense", "dense", "auto"), ("ragged/ragged_dot", "ragged", "ragged_dot"),
                                ("ragged/blocked", "ragged", "blocked"), ("ragged/slots", "ragged", "slots")]:
        def out(x: jax.Array, ex: dict, name: str = name, matmul: str = matmul) -> jax.Array:
            return run_dispatch(name, x, ids, weights, valid, ex, capacity=None, matmul=matmul)[0]

        fwd = _time(jax.jit(out), x, experts, iters=a.iters)
        grad_fn = jax.jit(jax.grad(lambda x, ex, out=out: jnp.sum(out(x, ex) ** 2), argnums=(0, 1)))
        both = _time(grad_fn, x, experts, iters=a.iters)
        results[label] = {"forward": fwd, "forward_backward": both,
                          "expert_gflops_per_s_fwd_bwd": 3 * fwd_flops / both["wall_s"] / 1e9}
    print(json.dumps({"device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
                      "shape": vars(a), "results": results}, indent=1))


if __name__ == "__main__":
    main()
