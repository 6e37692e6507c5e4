"""A multi-node Ray cluster on loopback for tests (run inside scripts/netns), whose nodes can die for real.

Each node is a `ray start --block` process in its own session: `stop()` sends SIGTERM (Ray tears the node
down), `kill()` SIGKILLs every process of the node's session (raylet, object store, workers) - a hard node
death with no drain, as a lost VM looks to Ray. Never `ray stop`: it would stop every Ray process on the
machine, other users' included. Nodes get fake resources and labels (a TPU slice on CPU machines works the
way research/cluster-ops.md verified: `TPU`, the slice-name resource, `TPU-<type>-head` on worker 0 and the
`ray.io/tpu-*` labels).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--memory=800000000", "--object-store-memory=80000000", "--disable-usage-stats"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_env() -> dict[str, str]:
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "JAX_PLATFORMS": "cpu",
        # LLVM level 0, as conftest.py sets for every test (compile time)
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: the session id
            out.append(int(entry))
    return out


@dataclasses.dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL every process of this node's session at once: a hard node death."""
        self.kill_session()
        self.proc.wait(30)

    def kill_session(self) -> None:
        for pid in _session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()


class LocalCluster:
    """`head()` first, then `add(...)` per worker node; `close()` stops every node it started."""

    def __init__(self, temp: Path) -> None:
        self.temp = temp
        self.ray_temp = tempfile.mkdtemp(prefix="rg", dir="/tmp")  # AF_UNIX socket paths must stay short
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, Node] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))

    def _start(self, name: str, args: list[str], env: dict[str, str], tries: int = 5) -> Node:
        """Start a node, again if it timed out: on a loaded machine a raylet can miss Ray's fixed 30 s window
        to register with the GCS."""
        for attempt in range(tries):
            log = self.temp / f"{name}.{attempt}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [self.ray_bin, "start", "--block", *args, *COMMON],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            node = Node(name, proc, log)
            deadline = time.time() + 240
            while "Ray runtime started" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.time() > deadline:
                    break
                time.sleep(0.2)
            else:
                self.nodes[name] = node
                return node
            if proc.poll() is None:
                node.kill()
            else:
                node.kill_session()
        raise RuntimeError(f"ray start {name} did not come up:\n{log.read_text(errors='replace')[-3000:]}")

    def head(self, resources: dict[str, float] | None = None) -> Node:
        return self._start(
            "head",
            [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.ray_temp}",
                "--num-cpus=1",
                f"--resources={json.dumps(resources or {})}",
            ],
            {**node_env(), "MARIN_NODE_TAG": "head"},
        )

    def add(
        self,
        name: str,
        *,
        cpus: int = 1,
        gpus: int = 0,
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Node:
        self.specs[name] = {"cpus": cpus, "gpus": gpus, "resources": resources, "labels": labels, "env": env}
        args = [
            f"--address={self.address}",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(resources or {})}",
        ]
        if gpus:
            args.append(f"--num-gpus={gpus}")
        if labels:
            args.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        return self._start(name, args, {**node_env(), "MARIN_NODE_TAG": name, **(env or {})})

    def replace(self, name: str) -> Node:
        """Start a fresh node like `name` (after it was killed), as an autoscaler would."""
        self.nodes.pop(name, None)
        return self.add(name, **self.specs[name])

    def drain(
        self, node_id: str, reason: str = "DRAIN_NODE_REASON_PREEMPTION", deadline_s: float = 30
    ) -> None:
        """Ask the GCS to drain a node (as a cloud's preemption notice does through the autoscaler)."""
        from ray._raylet import GcsClient
        from ray.core.generated import autoscaler_pb2

        accepted, message = GcsClient(address=self.address).drain_node(
            node_id,
            autoscaler_pb2.DrainNodeReason.Value(reason),
            "preemption notice (test)",
            int((time.time() + deadline_s) * 1000),
        )
        if not accepted:
            raise RuntimeError(f"drain of {node_id} rejected: {message}")

    def close(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + (["head"] if "head" in self.nodes else []):
            self.nodes[name].stop()
        shutil.rmtree(self.ray_temp, ignore_errors=True)


def tpu_host(slice_name: str, pod_type: str, worker_id: int, chips: int = 4) -> dict[str, object]:
    """The `add()` arguments that make a CPU node look like host `worker_id` of a TPU slice to Ray."""
    resources: dict[str, float] = {"TPU": chips, slice_name: 1}
    if worker_id == 0:
        resources[f"TPU-{pod_type}-head"] = 1
    return {
        "resources": resources,
        "env": {"TPU_NAME": slice_name, "TPU_WORKER_ID": str(worker_id)},
        "labels": {
            "ray.io/tpu-slice-name": slice_name,
            "ray.io/tpu-worker-id": str(worker_id),
            "ray.io/tpu-pod-type": pod_type,
        },
    }
