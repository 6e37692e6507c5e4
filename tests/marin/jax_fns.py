"""A step that computes with JAX (jit and lowering included), for the fork-hazard tests of the local
backend (tests/marin/test_start_method.py)."""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class JaxSumConfig:
    output_path: str
    n: int = 8


def jax_sum(config: JaxSumConfig) -> None:
    """Write sum(x * x for x in range(n)), computed by a jitted JAX function, and this process's id."""
    import jax
    import jax.numpy as jnp

    total = jax.jit(lambda x: (x * x).sum())(jnp.arange(config.n, dtype=jnp.float32))
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "sum.json"), "w") as f:
        json.dump({"sum": float(total), "pid": os.getpid()}, f)
