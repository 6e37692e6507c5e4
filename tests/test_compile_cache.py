"""The suite's one persistent JAX compilation cache (the root conftest.py): set in the environment before JAX
is imported, so every test process, and every subprocess they start (which inherits the environment), reads
and writes the same directory, and a program compiled once in a run is loaded from it afterwards."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def write_every_program() -> Iterator[None]:
    """JAX writes only programs that took 1 s to compile; this test's program takes milliseconds."""
    import jax

    was = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", was)


def test_the_suite_shares_one_jax_compilation_cache(write_every_program: None) -> None:
    import jax
    import jax.numpy as jnp

    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert Path(cache).is_dir() and jax.config.jax_compilation_cache_dir == cache
    before = set(os.listdir(cache))
    # a program no other test compiled (a new cache entry); below 2**23 every sum is exact in float32
    offset = float(secrets.randbelow(2**22))
    assert float(jax.jit(lambda x: x * 2.0 + offset)(jnp.float32(1.0))) == 2.0 + offset
    assert set(os.listdir(cache)) - before, f"nothing was written to {cache}"
