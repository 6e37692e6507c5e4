"""Step functions for the gang tests: each member records what it saw, optionally brings up
`jax.distributed` from the MARIN_GANG_* variables, waits, or raises on one rank."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class GangConfig:
    output_path: str
    use_jax: bool = False
    sleep_s: float = 0.0
    fail_rank: int = -1
    release_file: str = ""  # when set, wait (up to sleep_s) until this file exists
    report_progress: bool = False  # rank 0 writes $MARIN_PROGRESS_FILE as a trainer with checkpoints would
    finish_s: float = 0.0  # ranks other than 0 take this long to write their file (a shard still flushing)


def _report_progress() -> None:
    """Progress as a trainer checkpointing every 5 steps reports it: a first attempt reaches step 7 (latest
    checkpoint 5); an attempt that finds that progress resumes from the checkpoint."""
    path = Path(os.environ["MARIN_PROGRESS_FILE"])
    before = json.loads(path.read_text()) if path.exists() else None
    now = time.time()
    if before is None:
        progress = {
            "step": 7,
            "checkpoint_step": 5,
            "checkpoint_time": now,
            "resumed_from": None,
            "first_step_time": now,
            "updated": now,
        }
    else:
        progress = {
            "step": 8,
            "checkpoint_step": before["checkpoint_step"],
            "resumed_from": before["checkpoint_step"],
            "checkpoint_time": before["checkpoint_time"],
            "first_step_time": now,
            "updated": now,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(progress))


def gang_member(config: GangConfig) -> None:
    entered = time.time()
    rank, size = int(os.environ["MARIN_GANG_RANK"]), int(os.environ["MARIN_GANG_SIZE"])
    coordinator = os.environ["MARIN_COORDINATOR"]
    info: dict[str, object] = {
        "rank": rank,
        "size": size,
        "coordinator": coordinator,
        "pid": os.getpid(),
        "node": os.environ.get("MARIN_NODE_TAG", ""),
        "megascale": {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")},
        "tpu_visible_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
        "entered": entered,
    }
    try:
        import ray

        info["node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:  # not inside a Ray worker
        info["node_id"] = None
    if config.use_jax:
        import jax
        import numpy as np
        from jax.experimental import multihost_utils

        jax.distributed.initialize(
            coordinator, num_processes=size, process_id=rank, initialization_timeout=120
        )
        info["process_count"] = jax.process_count()
        info["global_devices"] = jax.device_count()
        info["ranks_seen"] = sorted(int(r) for r in multihost_utils.process_allgather(np.array(rank)))
        info["jax_up"] = time.time()
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    if rank:
        time.sleep(config.finish_s)
    (out / f"rank-{rank}.json").write_text(json.dumps(info))
    print(f"gang member {rank}/{size} on {info['node']} up, coordinator {coordinator}", flush=True)
    if rank == config.fail_rank:
        raise ValueError(f"rank {rank} fails on purpose")
    if rank == 0 and config.report_progress:
        _report_progress()
    deadline = time.time() + config.sleep_s
    while time.time() < deadline and not (config.release_file and Path(config.release_file).exists()):
        time.sleep(0.1)
    if config.use_jax:
        jax.distributed.shutdown()


@dataclasses.dataclass(frozen=True)
class PidConfig:
    output_path: str


def write_pid(config: PidConfig) -> None:
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pid.txt").write_text(f"{os.getpid()} {os.environ.get('MARIN_NODE_TAG', '')}")


@dataclasses.dataclass(frozen=True)
class ScriptedConfig:
    """Attempt k does `plan[k-1]` (the last entry repeats): `kill` (SIGKILL its own worker, as the system
    killing it looks), `raise` (ValueError), `oom` (MemoryError), `ok`."""

    output_path: str
    counter_file: str
    plan: tuple[str, ...] = ("ok",)


def scripted(config: ScriptedConfig) -> None:
    import signal

    counter = Path(config.counter_file)
    attempt = len(counter.read_text().splitlines()) + 1 if counter.exists() else 1
    with open(counter, "a") as f:
        f.write(f"{attempt}\n")
    action = config.plan[min(attempt, len(config.plan)) - 1]
    print(f"attempt {attempt}: {action}", flush=True)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "raise":
        raise ValueError(f"attempt {attempt} raises on purpose")
    if action == "oom":
        raise MemoryError(f"attempt {attempt} ran out of memory")
