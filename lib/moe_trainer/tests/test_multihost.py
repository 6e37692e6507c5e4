"""Multi-host training on one CPU machine: a gang of 2 processes x 2 fake devices against 1 process x 4.

Every run is a plain subprocess (``multihost_worker.py``; no Ray): gang members get MARIN_GANG_SIZE/RANK and
MARIN_COORDINATOR=127.0.0.1:<free port>, and ``train`` joins them with ``jax.distributed`` (Gloo collectives,
loopback only). The runs train the tiny preset for 6 steps of 8 x 64 tokens in fp32 at matmul precision
"highest", so the gang and the single process agree to the tolerance of the single-process sharding test
(test_train.py: 2e-5 relative after four updates); a gang resumed after being killed matches an
uninterrupted gang bit for bit.

Module-scoped fixtures run the reference gang and single-process runs once; each test adds at most two runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from multihost_worker import write_cache

from moe_trainer import distributed
from moe_trainer.checkpoint import CheckpointConfig, Checkpointer

WORKER = Path(__file__).with_name("multihost_worker.py")
RTOL = 2e-5  # test_one_device_and_eight_devices_give_the_same_losses
STEPS = 6
RUN_TIMEOUT_S = 480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_COMPILE_CACHE: dict[str, str] = {}  # the module's persistent compilation cache (set by compile_cache)


def _env(devices: int, gang: tuple[int, int, int] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_GANG") and k != "MARIN_COORDINATOR"}
    # LLVM level 0: as conftest.py sets for every test (compile time)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    # One persistent compilation cache for this module's runs: every test after the reference runs compiles
    # the same programs again (a gang's members, the resumed gangs, the single process) -- JAX writes from
    # process 0 only, and runs in this module are sequential.
    if "dir" in _COMPILE_CACHE:
        env.update(JAX_COMPILATION_CACHE_DIR=_COMPILE_CACHE["dir"],
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if gang is not None:
        size, rank, port = gang
        env.update(MARIN_GANG_SIZE=str(size), MARIN_GANG_RANK=str(rank),
                   MARIN_COORDINATOR=f"127.0.0.1:{port}")
    return env


def _launch(script: list[str], size: int, devices: int, logs: Path) -> list[subprocess.Popen[str]]:
    """``size`` processes of ``script`` (a gang when size > 1), output to files (a pipe could fill up)."""
    port = _free_port()
    procs = []
    for rank in range(size):
        log = (logs / f"rank{rank}.log").open("w")
        env = _env(devices, (size, rank, port) if size > 1 else None)
        procs.append(subprocess.Popen([sys.executable, *script], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
        log.close()
    return procs


def _wait(procs: list[subprocess.Popen[str]], logs: Path) -> list[int]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:  # a member left behind (the other one failed) is killed with its whole session
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _tail(logs: Path) -> str:
    return "\n".join(f"--- {f.name}\n" + f.read_text()[-3000:] for f in sorted(logs.glob("rank*.log")))


def train_run(spec: dict[str, Any], *, processes: int, logs: Path,
              expect_rc: int = 0) -> list[dict[str, Any]]:
    """Run the worker as ``processes`` processes x (4 / processes) devices; every process's printed result."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = _launch([str(WORKER), json.dumps(spec)], processes, 4 // processes, logs)
    rcs = _wait(procs, logs)
    assert rcs == [expect_rc] * processes, f"exit codes {rcs}, expected {expect_rc}\n{_tail(logs)}"
    if expect_rc:
        return []
    out = []
    for rank in range(processes):
        text = (logs / f"rank{rank}.log").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith('{"result"')]
        assert lines, _tail(logs)
        out.append(json.loads(lines[-1]))
    return out


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    steps = [r["step"] for r in train_rows]
    assert steps == sorted(set(steps)), f"one row per step, written once: {steps}"
    return {r["step"]: r["loss"] for r in train_rows}


def _copy_up_to(src: Path, dst: Path, step: int) -> None:
    """A copy of a run directory whose newest checkpoint is ``step`` (later ones removed)."""
    shutil.copytree(src, dst)
    for d in (dst / "checkpoints").iterdir():
        if d.name.isdigit() and int(d.name) > step:
            shutil.rmtree(d)


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A measured 15% of this module's CPU time (275 -> 232 user s) is compiling the same programs again."""
    _COMPILE_CACHE["dir"] = str(tmp_path_factory.mktemp("mh-jax-cache"))
    yield
    _COMPILE_CACHE.clear()


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mh-caches")
    return {"train": write_cache(root / "train", 300, seed=0, domain="synthetic"),
            "val": {"arith": write_cache(root / "val", 20, seed=1, domain="arith")}}


@pytest.fixture(scope="module")
def reference(caches: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same 6-step run (checkpoints at 3 and 6, final evaluation) by a gang and by one process."""
    root = tmp_path_factory.mktemp("mh-ref")
    runs: dict[str, Any] = {}
    for name, processes in (("gang", 2), ("single", 1)):
        spec = {**caches, "out": str(root / name), "num_steps": STEPS, "every": 3}
        results = train_run(spec, processes=processes, logs=root / f"{name}-logs")
        runs[name] = {"out": root / name, "results": results}
    return runs


@pytest.mark.slow
def test_gang_trains_like_one_process(reference: dict[str, Any]) -> None:
    gang, single = reference["gang"], reference["single"]
    layout = [(r["process_index"], r["process_count"], r["devices"], r["local_devices"])
              for r in gang["results"]]
    assert layout == [(0, 2, 4, 2), (1, 2, 4, 2)]
    assert (single["results"][0]["process_count"], single["results"][0]["devices"]) == (1, 4)
    g, s = _losses(gang["out"]), _losses(single["out"])
    assert sorted(g) == sorted(s) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([g[k] for k in sorted(g)], [s[k] for k in sorted(s)], rtol=RTOL)
    # every process returns the same result; the final evaluation matches one process's
    r0, r1 = (r["result"] for r in gang["results"])
    r0.pop("tokens_per_s"), r1.pop("tokens_per_s")  # each process times its own loop
    assert r0 == r1
    ge, se = r0["eval"], single["results"][0]["result"]["eval"]
    assert json.loads((gang["out"] / "eval.json").read_text()) == ge
    for dom in se["domains"]:
        assert ge["domains"][dom]["tokens"] == se["domains"][dom]["tokens"]
        for m in ("loss", "bpb"):
            assert ge["domains"][dom][m] == pytest.approx(se["domains"][dom][m], rel=RTOL)
    # metrics and W&B from process 0 only: one row per step (checked by _losses) and one offline W&B run
    assert len(list((gang["out"] / "wandb").glob("offline-run-*"))) == 1
    assert sorted(p.name for p in (gang["out"] / "checkpoints").iterdir()) == ["3", "6"]


@pytest.mark.slow
def test_checkpoints_move_between_a_gang_and_one_process(reference: dict[str, Any], tmp_path: Path,
                                                         caches: dict[str, Any]) -> None:
    """The gang's step-3 checkpoint continued by one process, and one process's continued by a gang: both
    end where the uninterrupted runs did."""
    g, s = _losses(reference["gang"]["out"]), _losses(reference["single"]["out"])
    for src, processes, name in (("gang", 1, "gang-to-single"), ("single", 2, "single-to-gang")):
        out = tmp_path / name
        _copy_up_to(reference[src]["out"], out, 3)
        spec = {**caches, "val": {}, "out": str(out), "num_steps": STEPS, "every": 3}
        result = train_run(spec, processes=processes, logs=tmp_path / f"{name}-logs")[0]["result"]
        assert result["step"] == STEPS
        resumed = _losses(out)
        assert sorted(resumed) == list(range(1, STEPS + 1))
        ref = g if src == "gang" else s
        assert [resumed[k] for k in (1, 2, 3)] == [ref[k] for k in (1, 2, 3)]  # rows up to the checkpoint
        np.testing.assert_allclose([resumed[k] for k in (4, 5, 6)], [ref[k] for k in (4, 5, 6)], rtol=RTOL)
        np.testing.assert_allclose([resumed[k] for k in (4, 5, 6)], [(s if src == "gang" else g)[k]
                                                                     for k in (4, 5, 6)], rtol=RTOL)


@pytest.mark.slow
def test_killed_gang_resumes_from_its_last_complete_checkpoint_exactly(
        reference: dict[str, Any], tmp_path: Path, caches: dict[str, Any]) -> None:
    """Both members SIGKILL themselves in step 5 (after checkpoint 4 is complete); a new gang resumes from 4
    and its whole loss history equals the uninterrupted gang's, bit for bit."""
    out = tmp_path / "killed"
    spec = {**caches, "val": {}, "out": str(out), "num_steps": STEPS, "every": 2, "die_at": 4}
    train_run(spec, processes=2, logs=tmp_path / "killed-logs", expect_rc=-signal.SIGKILL)
    complete = Checkpointer(str(out / "checkpoints"), CheckpointConfig()).all_steps()
    assert complete == [2, 4], complete
    spec = {**spec, "die_at": None}
    result = train_run(spec, processes=2, logs=tmp_path / "resume-logs")[0]["result"]
    assert result["step"] == STEPS
    assert _losses(out) == _losses(reference["gang"]["out"])


@pytest.mark.slow
def test_a_gang_falls_back_past_a_damaged_checkpoint_together(
        reference: dict[str, Any], tmp_path: Path, caches: dict[str, Any]) -> None:
    """The gang's newest checkpoint (6) is damaged on disk, every array data file cut short: both processes
    agree that it cannot be restored, process 0 moves it aside while the other waits at the barrier, both
    resume from checkpoint 3 and report the same fallback, and the losses equal the uninterrupted gang's,
    bit for bit."""
    out = tmp_path / "damaged"
    shutil.copytree(reference["gang"]["out"], out)
    data = [p for p in (out / "checkpoints/6").rglob("*") if p.parent.name == "d" and p.is_file()]
    assert data, "checkpoint 6 has no array data files to damage"
    for p in data:
        with p.open("r+b") as f:
            f.truncate(100)
    spec = {**caches, "val": {}, "out": str(out), "num_steps": STEPS, "every": 3}
    results = train_run(spec, processes=2, logs=tmp_path / "fallback-logs")
    for r in results:  # the same fallback on every process
        [fallback] = r["result"]["checkpoint_fallbacks"]
        assert (fallback["step"], fallback["resumed_from"], fallback["steps_redone"]) == (6, 3, 3)
        assert fallback["moved_to"].startswith(str(out / "checkpoints/6.corrupt-")) or r["process_index"] == 1
    [aside] = (out / "checkpoints").glob("6.corrupt-*")  # moved once, by process 0; nothing deleted
    assert sorted(q.name for q in aside.rglob("*") if q.parent.name == "d") == sorted(p.name for p in data)
    logged = [json.loads(line) for line in (out / "checkpoint_fallbacks.jsonl").read_text().splitlines()]
    assert [(f["step"], f["resumed_from"]) for f in logged] == [(6, 3)]  # written once (process 0)
    assert results[0]["result"]["step"] == STEPS
    assert _losses(out) == _losses(reference["gang"]["out"])


GANG_CRASHING_SAVER = textwrap.dedent(
    """
    import os, sys, time
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from moe_trainer import distributed
    from moe_trainer.checkpoint import CheckpointConfig, Checkpointer
    distributed.initialize(distributed.DistributedConfig(initialization_timeout_s=60, heartbeat_timeout_s=10))
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    sh = NamedSharding(mesh, P("d"))
    def state(n, v):
        return {"w": jax.make_array_from_callback((n,), sh, lambda i: np.full((n,), v, np.float32)[i]),
                "step": jax.make_array_from_callback((), NamedSharding(mesh, P()), lambda i: np.int32(v))}
    ckpt = Checkpointer(sys.argv[1], CheckpointConfig(keep=3, async_save=True))
    ckpt.save(1, state(8, 1.0), {"step": 1})
    ckpt.wait()
    # the whole gang dies (a preemption) as soon as the partial step-2 directory exists, long before the
    # background writes of 120 MB can be committed
    ckpt.save(2, state(30_000_000, 2.0), {"step": 2})
    deadline = time.time() + 60
    while time.time() < deadline:
        if any(n.startswith("2") and "tmp" in n for n in os.listdir(sys.argv[1])):
            os._exit(0)
        time.sleep(0.001)
    os._exit(3)
    """
)


def test_a_gang_killed_mid_save_leaves_no_restore_point(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    procs = _launch(["-c", GANG_CRASHING_SAVER, str(directory)], 2, 2, tmp_path)
    assert _wait(procs, tmp_path) == [0, 0], _tail(tmp_path)
    leftovers = [p.name for p in directory.iterdir() if p.name.startswith("2")]
    assert leftovers and all("tmp" in n for n in leftovers), leftovers
    ckpt = Checkpointer(str(directory), CheckpointConfig(keep=3, async_save=False))
    assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
    import jax
    import jax.numpy as jnp

    abstract = {"w": jax.ShapeDtypeStruct((8,), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
    state, meta = ckpt.restore(1, abstract)  # written by two processes, read by one
    assert meta == {"step": 1} and np.asarray(state["w"]).tolist() == [1.0] * 8
    ckpt.close()


DEAD_COORDINATOR = textwrap.dedent(
    """
    from moe_trainer import distributed
    distributed.initialize(distributed.DistributedConfig(initialization_timeout_s=2))
    """
)


def test_a_missing_coordinator_fails_in_seconds_with_a_clear_error(tmp_path: Path) -> None:
    port = _free_port()  # nobody listens there: rank 0 is dead
    out = subprocess.run([sys.executable, "-c", DEAD_COORDINATOR], env=_env(1, (2, 1, port)),
                         capture_output=True, text=True, timeout=90)  # JAX alone: 300 s, then abort
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"no coordinator at MARIN_COORDINATOR=127.0.0.1:{port} after 2 s" in out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize(("env", "message"), [
    ({"MARIN_GANG_SIZE": "2", "MARIN_GANG_RANK": "0"}, "MARIN_COORDINATOR unset"),
    ({"MARIN_GANG_SIZE": "2", "MARIN_GANG_RANK": "2", "MARIN_COORDINATOR": "h:1"},
     "must lie in [0, MARIN_GANG_SIZE=2)"),
    ({"MARIN_GANG_SIZE": "two", "MARIN_GANG_RANK": "0", "MARIN_COORDINATOR": "h:1"}, "must be integers"),
    ({"MARIN_GANG_SIZE": "2", "MARIN_GANG_RANK": "0", "MARIN_COORDINATOR": "h"}, "must be host:port"),
], ids=["incomplete", "rank-out-of-range", "not-a-number", "no-port"])
def test_bad_gang_environment_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        distributed.gang_from_env(env)


def test_gang_environment_parses_and_one_process_holds_every_row() -> None:
    gang = distributed.gang_from_env({"MARIN_GANG_SIZE": "4", "MARIN_GANG_RANK": "3",
                                      "MARIN_COORDINATOR": "10.0.0.2:8476"})
    assert gang == distributed.Gang(size=4, rank=3, coordinator="10.0.0.2:8476")
    assert gang.host_port == ("10.0.0.2", 8476) and distributed.gang_from_env({}) is None
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    assert distributed.process_rows(NamedSharding(mesh, PartitionSpec("d")), (16, 4)) == (0, 16)
