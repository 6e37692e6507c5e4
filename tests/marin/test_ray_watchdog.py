"""Embedded Ray's processes end with the driver that started them, even when it is SIGKILLed (issue 32: the
raylet's DashboardAgent and RuntimeEnvAgent outlived such a driver by one to two minutes). A real driver
with a real embedded Ray, in its own session, killed for real; run inside scripts/netns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.execution import ray_watchdog

DRIVER = (
    "from marin.execution.ray_backend import ensure_ray\n"
    "import ray, sys, time\n"
    "ensure_ray(None)\n"
    "assert ray.get(ray.remote(lambda: 1).remote()) == 1\n"
    "print('RAN', flush=True)\n"
    "if sys.argv[1] == 'exit':\n"
    "    ray.shutdown()\n"
    "else:\n"
    "    time.sleep(600)\n"
)


def _session(sid: int) -> dict[int, str]:
    """pid -> command line of the live processes of session `sid`."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out[int(entry)] = cmd.strip()
    return out


def _watchdogs(driver: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(args) > 4 and args[3].endswith(b"ray_watchdog.py") and args[4] == str(driver).encode():
            found.append(int(entry))
    return found


def _gone(pids: list[int]) -> bool:
    return all(ray_watchdog._stat(p) is None for p in pids)


def _start_driver(mode: str, tries: int = 3) -> subprocess.Popen[str]:
    """A driver that started its embedded Ray and ran a task. Ray gives its node a fixed time to start, which
    a loaded 2-core machine can miss: such a start is retried (as tests/fakes/ray_cluster.py does)."""
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if "RAN" in line:
                return proc
        err = proc.stderr.read()
        proc.wait()
        _wait(lambda: not _session(proc.pid), 30)  # noqa: B023 - waited for before the next try
        if "timed out during startup" not in err:
            break
    raise AssertionError(f"the driver ended before running its task (exit {proc.returncode}):\n{err[-3000:]}")


def _wait(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return bool(predicate())


@pytest.mark.ray
@pytest.mark.slow
def test_the_agents_of_a_sigkilled_drivers_embedded_ray_end_within_seconds() -> None:
    driver = _start_driver("sleep")
    try:
        agents = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
        assert _wait(lambda: agents <= set(_session(driver.pid).values()), 60), _session(driver.pid)
        watchdogs = _watchdogs(driver.pid)
        assert len(watchdogs) == 1
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        # without the watchdog the two agents were still there after 60 s
        assert _wait(lambda: not _session(driver.pid), 20), _session(driver.pid)
        assert _wait(lambda: _gone(watchdogs), 10)
    finally:
        for pid in _session(driver.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.ray
@pytest.mark.slow
def test_after_a_normal_shutdown_the_watchdog_exits_and_signals_nothing() -> None:
    driver = _start_driver("exit")
    watchdogs = _watchdogs(driver.pid)
    assert driver.wait(60) == 0 and len(watchdogs) <= 1
    assert _wait(lambda: _gone(watchdogs), 20)
    assert _wait(lambda: not _session(driver.pid), 20), _session(driver.pid)


def test_a_reused_pid_is_never_taken_for_a_tracked_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        me = ray_watchdog._stat(os.getpid())
        assert me is not None
        tracked = ray_watchdog.alive({os.getpid(): me[1]})
        assert os.getpid() in tracked and child.pid in tracked  # a descendant, found by parent pid
        assert ray_watchdog.alive({os.getpid(): me[1] + 1}) == {}  # same pid, another start time: not ours
        assert ray_watchdog.alive({child.pid + 10**7: 0}) == {}
    finally:
        child.kill()
        child.wait()
