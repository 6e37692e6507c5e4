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


def gang_member(config: GangConfig) -> None:
    rank, size = int(os.environ["MARIN_GANG_RANK"]), int(os.environ["MARIN_GANG_SIZE"])
    coordinator = os.environ["MARIN_COORDINATOR"]
    info: dict[str, object] = {"rank": rank, "size": size, "coordinator": coordinator, "pid": os.getpid(),
                               "node": os.environ.get("MARIN_NODE_TAG", ""),
                               "megascale": {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")},
                               "tpu_visible_chips": os.environ.get("TPU_VISIBLE_CHIPS")}
    try:
        import ray

        info["node_id"] = ray.get_runtime_context().get_node_id()
    except Exception:  # not inside a Ray worker
        info["node_id"] = None
    if config.use_jax:
        import jax
        import numpy as np
        from jax.experimental import multihost_utils

        jax.distributed.initialize(coordinator, num_processes=size, process_id=rank, initialization_timeout=120)
        info["process_count"] = jax.process_count()
        info["global_devices"] = jax.device_count()
        info["ranks_seen"] = sorted(int(r) for r in multihost_utils.process_allgather(np.array(rank)))
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(info))
    print(f"gang member {rank}/{size} on {info['node']} up, coordinator {coordinator}", flush=True)
    if rank == config.fail_rank:
        raise ValueError(f"rank {rank} fails on purpose")
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
