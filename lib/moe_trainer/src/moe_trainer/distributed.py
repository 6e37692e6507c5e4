"""Multi-process JAX: ``jax.distributed`` from a gang's environment, and which process does what.

A gang step runs the same function on N hosts at once (docs/trainer.md "Multi-host"). The engine gives every
member three environment variables and nothing else (it stays free of ML code):

    MARIN_GANG_SIZE     number of processes N
    MARIN_GANG_RANK     this process's rank in [0, N)
    MARIN_COORDINATOR   host:port of rank 0's coordination service (a free port on that host)

``initialize(cfg)`` turns them into ``jax.distributed.initialize(coordinator, N, rank)`` before anything
touches a JAX backend; ``train`` calls it first. Without the variables it does nothing (one process), unless
``cfg.auto_detect`` asks JAX to find the cluster itself (a Cloud TPU slice, SLURM, Open MPI: JAX's own
detection). It is idempotent: a second call in the same process (a resumed ``train``, an operator that
already initialised) checks that the running runtime matches and returns.

Failing fast. JAX waits ``initialization_timeout`` (300 s by default) for a coordinator that is not there and
then aborts the process from C++ with a bare log line. A non-zero rank therefore first waits for the
coordinator's port to accept TCP connections, for at most the same timeout, and raises a ``RuntimeError``
naming the address and the variable if it never does; a dead rank 0 costs seconds, not minutes, when the
timeout is small. Timeouts come from ``DistributedConfig`` fields, else the environment
(``MARIN_GANG_INIT_TIMEOUT_S``, ``MARIN_GANG_HEARTBEAT_TIMEOUT_S``: knobs a launcher can set without touching
a step's identity), else JAX's defaults. The heartbeat timeout bounds how long survivors live on after a
member dies: JAX's coordination service then aborts every process of the gang, which is what a gang
scheduler wants (one dead host must not leave the others hanging).

A coordinator on a loopback host binds to that host only (tests and single-machine gangs open no port to the
network); any other coordinator binds to all interfaces on its port, as JAX does by default.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import time
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Sharding

from moe_trainer.jax_typed import make_array_from_process_local_data

ENV_SIZE = "MARIN_GANG_SIZE"
ENV_RANK = "MARIN_GANG_RANK"
ENV_COORDINATOR = "MARIN_COORDINATOR"
ENV_INIT_TIMEOUT = "MARIN_GANG_INIT_TIMEOUT_S"
ENV_HEARTBEAT_TIMEOUT = "MARIN_GANG_HEARTBEAT_TIMEOUT_S"
JAX_INIT_TIMEOUT_S = 300
JAX_HEARTBEAT_TIMEOUT_S = 100
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
_barriers = itertools.count()


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How a multi-process run joins its gang (the gang itself comes from the MARIN_GANG_* variables)."""

    initialization_timeout_s: int | None = None
    """Seconds to wait for the coordinator and every process to join (None: $MARIN_GANG_INIT_TIMEOUT_S,
    else JAX's 300)."""
    heartbeat_timeout_s: int | None = None
    """Seconds without a heartbeat after which the coordination service declares a process dead and aborts
    the gang (None: $MARIN_GANG_HEARTBEAT_TIMEOUT_S, else JAX's 100)."""
    auto_detect: bool = False
    """Without MARIN_GANG_* variables, call jax.distributed.initialize() and let JAX detect the cluster
    (Cloud TPU slices, SLURM, Open MPI). False: no variables means one process."""

    def __post_init__(self) -> None:
        for name in ("initialization_timeout_s", "heartbeat_timeout_s"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"distributed.{name}={value} must be >= 1 second or null (the default)")


@dataclasses.dataclass(frozen=True)
class Gang:
    """This process's place in a gang, as the engine's environment variables describe it."""

    size: int
    rank: int
    coordinator: str
    """host:port of rank 0's coordination service."""

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.coordinator.rpartition(":")
        return host, int(port)


def gang_from_env(environ: Mapping[str, str] | None = None) -> Gang | None:
    """The gang described by MARIN_GANG_SIZE/RANK and MARIN_COORDINATOR, or None when none of them is set."""
    env = os.environ if environ is None else environ
    raw = {k: env.get(k, "").strip() for k in (ENV_SIZE, ENV_RANK, ENV_COORDINATOR)}
    if not any(raw.values()):
        return None
    missing = [k for k, v in raw.items() if not v]
    if missing:
        present = ", ".join(k for k in raw if k not in missing)
        raise ValueError(f"gang environment incomplete: {', '.join(missing)} unset while {present} set; a "
                         f"gang member needs all three ({ENV_SIZE}=N, {ENV_RANK}=0..N-1, "
                         f"{ENV_COORDINATOR}=host:port of rank 0)")
    try:
        size, rank = int(raw[ENV_SIZE]), int(raw[ENV_RANK])
    except ValueError:
        raise ValueError(f"{ENV_SIZE}={raw[ENV_SIZE]!r} and {ENV_RANK}={raw[ENV_RANK]!r} must be "
                         "integers") from None
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"{ENV_RANK}={rank} must lie in [0, {ENV_SIZE}={size}) and {ENV_SIZE} must be >= 1")
    host, sep, port = raw[ENV_COORDINATOR].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{ENV_COORDINATOR}={raw[ENV_COORDINATOR]!r} must be host:port (e.g. 10.0.0.2:8476)")
    return Gang(size=size, rank=rank, coordinator=raw[ENV_COORDINATOR])


def _timeout(value: int | None, env_name: str, default: int) -> int:
    if value is not None:
        return value
    raw = os.environ.get(env_name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{env_name}={raw!r} must be a whole number of seconds >= 1")
    return int(raw)


def wait_for_coordinator(gang: Gang, timeout_s: float) -> None:
    """Block until rank 0's coordinator accepts TCP connections; RuntimeError after ``timeout_s``."""
    host, port = gang.host_port
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"gang rank {gang.rank}/{gang.size}: no coordinator at "
                    f"{ENV_COORDINATOR}={gang.coordinator} after {timeout_s:g} s ({e}); rank 0 must be "
                    "running and reachable on that port (raise distributed.initialization_timeout_s or "
                    f"{ENV_INIT_TIMEOUT} if it starts slowly)"
                ) from e
            time.sleep(0.05)


def initialize(cfg: DistributedConfig | None = None) -> Gang | None:
    """Join the gang of the environment (see the module docstring); the gang, or None for one process."""
    cfg = cfg or DistributedConfig()
    gang = gang_from_env()
    if jax.distributed.is_initialized():
        if gang is not None and (jax.process_count(), jax.process_index()) != (gang.size, gang.rank):
            raise RuntimeError(f"jax.distributed already runs as process {jax.process_index()} of "
                               f"{jax.process_count()}, but the environment says rank {gang.rank} of "
                               f"{gang.size}")
        return gang
    init_timeout = init_timeout_s(cfg)
    heartbeat = _timeout(cfg.heartbeat_timeout_s, ENV_HEARTBEAT_TIMEOUT, JAX_HEARTBEAT_TIMEOUT_S)
    if gang is None:
        if cfg.auto_detect:
            jax.distributed.initialize(initialization_timeout=init_timeout,
                                       heartbeat_timeout_seconds=heartbeat)
        return None
    if gang.size == 1:
        return gang
    t0 = time.monotonic()
    if gang.rank != 0:
        wait_for_coordinator(gang, init_timeout)
    host, port = gang.host_port
    bind = gang.coordinator if host in LOOPBACK_HOSTS else None
    jax.distributed.initialize(
        coordinator_address=gang.coordinator, num_processes=gang.size, process_id=gang.rank,
        cluster_detection_method="deactivate",
        initialization_timeout=max(1, int(init_timeout - (time.monotonic() - t0))),
        heartbeat_timeout_seconds=heartbeat, coordinator_bind_address=bind)
    return gang


def barrier(name: str, timeout_s: float) -> None:
    """Wait until every process reaches this barrier (the coordination service's, not a device collective).

    Used before the first execution of a freshly compiled program: XLA:CPU's Gloo collectives give a
    communicator 30 s (not configurable in jax 0.10) for all processes to join, so processes whose compiles
    finished far apart would fail their first collective. A no-op on one process."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed as jax_distributed  # the client orbax's barriers also use

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError(f"barrier {name!r}: {jax.process_count()} processes but no jax.distributed client")
    client.wait_at_barrier(f"moe_trainer/{name}/{next(_barriers)}", int(timeout_s * 1000))


def all_processes(flag: bool) -> bool:
    """Whether ``flag`` holds on every process of the run (on one process: ``flag`` itself)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(flag))))


def init_timeout_s(cfg: DistributedConfig) -> int:
    """The initialisation timeout in effect (config, else environment, else JAX's default)."""
    return _timeout(cfg.initialization_timeout_s, ENV_INIT_TIMEOUT, JAX_INIT_TIMEOUT_S)


def is_primary() -> bool:
    """Whether this process writes the run's shared outputs (metrics, W&B, eval.json): process 0.

    Before (or without) ``initialize`` the gang rank of the environment decides, so that code which never
    starts JAX's runtime (an evaluation each member runs on its own) still writes from one member only."""
    if jax.distributed.is_initialized():
        return jax.process_index() == 0
    gang = gang_from_env()
    return gang is None or gang.rank == 0


def process_rows(sharding: Sharding, global_shape: tuple[int, ...]) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a global batch (dimension 0) this process's devices hold under ``sharding``.

    One process: all rows. Several: the union of the row slices of the process's addressable devices, which
    for the trainer's mesh (devices ordered by process, the batch split over the leading mesh axes) is one
    contiguous block of ``B / processes`` rows; a sharding that gives a process scattered rows is refused."""
    b = global_shape[0]
    covered = np.zeros(b, dtype=bool)
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        covered[index[0] if index else slice(None)] = True
    rows = np.flatnonzero(covered)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if len(rows) != hi - lo:
        raise ValueError(f"process {jax.process_index()} holds rows {rows.tolist()} of the batch: not one "
                         "contiguous block; order the mesh's devices by process so the batch splits in "
                         "blocks")
    return lo, hi


def global_batch(local: Mapping[str, np.ndarray], sharding: Sharding,
                 global_shape: tuple[int, ...]) -> dict[str, jax.Array]:
    """Global arrays of ``global_shape`` from this process's rows (``process_rows``) of every batch field.

    Each process passes only the data its devices hold (``jax.make_array_from_process_local_data``); on one
    process this is a plain sharded ``device_put``."""
    b = global_shape[0]
    return {k: make_array_from_process_local_data(sharding, np.asarray(v), (b, *v.shape[1:]))
            for k, v in local.items()}
