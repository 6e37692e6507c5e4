"""What `marin submit` costs over `marin run` with RAY_ADDRESS, what the code package costs, and how late a
step's output shows through `marin jobs logs` (issue 14). Prints JSON. Run inside the private network
namespace, with the venv first on PATH (moto_server must be the venv's):

    PATH=$PWD/.venv/bin:$PATH scripts/netns .venv/bin/python benchmarks/submit_overhead.py [--pairs 3]

One local cluster (tests/fakes/ray_cluster.py, as tests/cluster/test_submit.py starts it): a head with the
Jobs API and no CPUs, one worker node with two CPUs. The experiment is the submit tests' demo (three steps in
a chain, tests/cluster/demo_repo) in a throw-away git repository.

- `start`: `--pairs` pairs, alternating `marin submit SCRIPT` and `RAY_ADDRESS=<gcs> marin run SCRIPT` (each
  with a fresh prefix, so every step runs): from the command's start to the first step's RUNNING event (its
  own timestamp in events.jsonl). For submit also when it printed "submitted job" (describe, package check,
  upload done). Median and range of each, and of the difference within each pair.
- `package`: `check_working_dir` (marin/cluster/package.py: the walk with Ray's ignore rules) on this
  repository and on the demo repository, and Ray's own zip of the same tree (`create_package`, what the
  upload sends): seconds, files, bytes.
- `log_delay`: the demo's gated middle step prints "waiting at <time>" every 0.2 s; `marin jobs logs JOB
  --follow --steps` runs beside it and each such line's arrival time minus its printed time is its delay
  (median, p90, max), with the prefix on local disk and on the s3:// emulator (moto_server on loopback; the
  worker ships the log in chunks, marin/status/live_log.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.test_submit import make_repo  # noqa: E402
from tests.fakes.ray_cluster import LocalRayCluster, free_port  # noqa: E402

SCRIPT = "exp14_submit_demo.py"


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": [round(v, 3) for v in values],
    }


class Command:
    """A subprocess whose output lines are kept with the time each arrived."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.started = time.time()
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    def wait(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(30)
        if rc != 0:
            raise RuntimeError(f"{self.proc.args} exited {rc}:\n{''.join(t for _, t in self.lines)[-4000:]}")
        return rc

    def first(self, text: str) -> tuple[float, str]:
        return next((t, line) for t, line in self.lines if text in line)


def _marin(*args: str) -> list[str]:
    return [sys.executable, "-m", "marin", *args]


def _first_running(prefix: str, step: str = "first") -> float:
    """The timestamp of the step's first RUNNING event (read through the platform's own storage)."""
    from marin.status import files as sf
    from marin.storage import storage_for

    storage = storage_for(prefix)
    [output] = [p for p in storage.listdir(f"{prefix}/demo") or [] if p.startswith(f"{step}-")]
    events = sf.read_events(storage, f"{prefix}/demo/{output}")
    return float(next(e["ts"] for e in events if e["event"] == "RUNNING"))


def _one_submit(cluster: LocalRayCluster, repo: Path, prefix: str, env: dict[str, str]) -> dict[str, float]:
    cmd = Command(
        _marin("submit", str(repo / SCRIPT), "--prefix", prefix, "--cluster", cluster.dashboard_url,
               "--env", "DEMO_COUNTER_DIR"),
        env,
        repo,
    )
    cmd.wait()
    submitted, _ = cmd.first("submitted job ")
    running = _first_running(prefix)
    return {"to_running_s": running - cmd.started, "client_side_s": submitted - cmd.started}


def _one_run(cluster: LocalRayCluster, repo: Path, prefix: str, env: dict[str, str]) -> dict[str, float]:
    run_env = {**env, "RAY_ADDRESS": cluster.address, "PYTHONPATH": f"{repo}{os.pathsep}{ROOT}"}
    cmd = Command(_marin("run", str(repo / SCRIPT), "--prefix", prefix), run_env, repo)
    cmd.wait()
    return {"to_running_s": _first_running(prefix) - cmd.started}


def start_overhead(cluster: LocalRayCluster, repo: Path, work: Path, pairs: int) -> dict[str, Any]:
    env = _env(work)
    submits, runs = [], []
    for i in range(pairs):
        # alternate which goes first, so a warming cluster favours neither
        order = [("submit", _one_submit), ("run", _one_run)]
        for kind, fn in order if i % 2 == 0 else order[::-1]:
            row = fn(cluster, repo, str(work / f"prefix-{kind}-{i}"), env)
            (submits if kind == "submit" else runs).append(row)
    return {
        "submit_to_first_running_s": _spread([r["to_running_s"] for r in submits]),
        "submit_client_side_s": _spread([r["client_side_s"] for r in submits]),
        "run_to_first_running_s": _spread([r["to_running_s"] for r in runs]),
        "submit_minus_run_s": _spread(
            [s["to_running_s"] - r["to_running_s"] for s, r in zip(submits, runs, strict=True)]
        ),
        "target_s": 5.0,
    }


def _env(work: Path, **extra: str) -> dict[str, str]:
    counters = work / "counters"
    counters.mkdir(exist_ok=True)
    return {**os.environ, "DEMO_COUNTER_DIR": str(counters), "MARIN_TRACKER": "local", **extra}


def package(repo: Path) -> dict[str, Any]:
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import create_package

    from marin.cluster.package import ALWAYS_EXCLUDED, check_working_dir

    out: dict[str, Any] = {}
    for name, root in (("this_repository", ROOT), ("demo_repository", repo)):
        t0 = time.perf_counter()
        info = check_working_dir(root)
        walked = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "pkg.zip"
            excludes = [*ray_constants.get_runtime_env_default_excludes(), *ALWAYS_EXCLUDED]
            t0 = time.perf_counter()
            create_package(str(root), target, include_gitignore=True, excludes=excludes)
            zipped = time.perf_counter() - t0
            zip_bytes = target.stat().st_size
        out[name] = {
            "check_s": walked,
            "files": info.files,
            "bytes": info.bytes,
            "ray_zip_s": zipped,
            "zip_bytes": zip_bytes,
            "largest": [list(x) for x in info.largest[:3]],
        }
    return out


def log_delay(cluster: LocalRayCluster, repo: Path, prefix: str, env: dict[str, str], watch_s: float) -> Any:
    gate = Path(env["DEMO_GATE"])
    sub = Command(
        _marin("submit", str(repo / SCRIPT), "--prefix", prefix, "--cluster", cluster.dashboard_url,
               "--env", "DEMO_COUNTER_DIR", "--env", "DEMO_GATE", "--no-wait"),
        env,
        repo,
    )
    sub.wait()
    job = sub.first("submitted job ")[1].split("submitted job ")[1].split()[0]
    logs = Command(_marin("jobs", "logs", job, "--follow", "--steps", "--cluster", cluster.dashboard_url),
                   env, repo)
    deadline = time.time() + 300
    while not any("waiting at" in line for _, line in logs.lines):
        if time.time() > deadline:
            raise RuntimeError("no step output arrived through marin jobs logs in 300 s")
        time.sleep(0.2)
    time.sleep(watch_s)
    gate.write_text("go")
    logs.wait()
    delays = [
        arrived - float(line.rsplit("waiting at ", 1)[1].split()[0])
        for arrived, line in logs.lines
        if line.startswith("[demo/slow]") and "waiting at " in line
    ]
    delays.sort()
    return {
        "lines": len(delays),
        "median_s": statistics.median(delays),
        "p90_s": delays[int(0.9 * (len(delays) - 1))],
        "max_s": delays[-1],
        "min_s": delays[0],
        "target_s": 5.0,
    }


@contextlib.contextmanager
def moto(work: Path) -> Iterator[dict[str, str]]:
    """moto_server on loopback and the environment that points fsspec's s3 at it (as tests/conftest.py)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}
    with open(work / "moto.log", "wb") as log:
        proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
        try:
            _make_bucket(endpoint, "bench")
            yield env
        finally:
            proc.terminate()
            proc.wait(30)


def _make_bucket(endpoint: str, bucket: str, timeout_s: float = 60) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test")
    deadline = time.time() + timeout_s
    while True:
        try:
            fs.mkdir(bucket)
            return
        except Exception:  # the server is still starting
            if time.time() > deadline:
                raise
            time.sleep(0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--watch-s", type=float, default=15.0, help="how long to watch the step's output")
    parser.add_argument("--skip", nargs="*", default=[], choices=["start", "package", "local", "s3"])
    args = parser.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="submit-overhead-") as tmp:
        work = Path(tmp)
        repo = make_repo(work, "bench")
        if "package" not in args.skip:
            result["package"] = package(repo)
        with moto(work) as s3_env:
            bin_dir = str(Path(sys.executable).parent)
            cluster = LocalRayCluster(
                work, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **s3_env}
            )
            os.environ.update(s3_env)  # for this process's own reads, and the commands it starts
            try:
                cluster.head(num_cpus=0, dashboard=True)
                cluster.add_node("worker", num_cpus=2)
                if "start" not in args.skip:
                    result["start"] = start_overhead(cluster, repo, work, args.pairs)
                delays = {}
                for store in ("local", "s3"):
                    if store in args.skip:
                        continue
                    prefix = str(work / "prefix-logs") if store == "local" else "s3://bench/prefix-logs"
                    env = _env(work, DEMO_GATE=str(work / f"gate-{store}"))
                    delays[store] = log_delay(cluster, repo, prefix, env, args.watch_s)
                result["log_delay"] = delays
            finally:
                cluster.shutdown()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
