"""A real multi-node Ray cluster on loopback for tests: every node a `ray start --block` process of its own.

Each node runs in its own session, so `kill_node` can SIGKILL the whole node (raylet, object store, workers)
the way a preempted VM vanishes, without touching any other Ray on the machine (never `ray stop`). Tests run
inside the private network namespace (dev.py / scripts/netns), where Ray binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
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

COMMON = ["--memory=1000000000", "--object-store-memory=100000000", "--disable-usage-stats"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


class LocalRayCluster:
    """`head()` first (optionally with the dashboard the Jobs API needs), then `add_node()` per worker
    node."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port()
        self.dashboard_port: int | None = None
        # Ray's socket paths must stay under 107 bytes: its session directory cannot live in pytest's tmp_path
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        assert self.dashboard_port is not None, "the head was started without its dashboard"
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, name: str, args: list[str], env: dict[str, str], tries: int = 3) -> None:
        """Start a node and wait until it says it runs. Ray gives a raylet a fixed 30 s to register with the
        GCS, which a loaded 2-core machine can miss: such a start is retried (a fresh process, same flags)."""
        for attempt in range(1, tries + 1):
            log = self.workdir / f"{name}.{attempt}.log"
            # every node of one machine needs its own agent ports: on the shared defaults the second node's
            # dashboard agent cannot listen, and the Jobs API then fails on a driver placed there
            ports = [f"--dashboard-agent-listen-port={free_port()}",
                     f"--dashboard-agent-grpc-port={free_port()}",
                     f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [_ray_bin(), "start", "--block", *args, *ports, *COMMON],
                    env={**self.env, **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.time() + 300
            while "Ray runtime started" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.time() > deadline:
                    self._kill(proc)
                    if attempt == tries:
                        raise RuntimeError(
                            f"ray node {name} did not come up in {tries} tries:\n"
                            f"{log.read_text(errors='replace')[-3000:]}"
                        )
                    break
                time.sleep(0.2)
            else:
                time.sleep(3)  # a head can say it started and then lose a sub-process (its client server)
                if proc.poll() is None:
                    self.nodes[name] = proc
                    return
                if attempt == tries:
                    raise RuntimeError(
                        f"ray node {name} exited after starting:\n{log.read_text(errors='replace')[-3000:]}"
                    )

    def head(
        self,
        num_cpus: int = 1,
        dashboard: bool = False,
        resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        args = ["--head", f"--port={self.port}", f"--num-cpus={num_cpus}", f"--temp-dir={self.temp_dir}"]
        if dashboard:
            self.dashboard_port = free_port()
            args += [
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
            ]
        else:
            args.append("--include-dashboard=false")
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        self._start("head", args, env or {})

    def add_node(
        self,
        name: str,
        num_cpus: int = 1,
        resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        args = [f"--address={self.address}", f"--num-cpus={num_cpus}"]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        self._start(name, args, env or {})

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of the node's session: no drain, no goodbye."""
        self._kill(self.nodes.pop(name))

    def shutdown(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + (["head"] if "head" in self.nodes else []):
            proc = self.nodes.pop(name)
            proc.send_signal(signal.SIGTERM)  # `ray start --block` tears its node down on SIGTERM
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                self._kill(proc)
            # workers the node started live in its session: make sure none outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
