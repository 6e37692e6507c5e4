"""A watchdog that ends an embedded Ray's processes when the driver that started it dies.

`ray.init()` without a cluster starts a private Ray - GCS, raylet, and the raylet's agents and workers - as
the driver's descendants. Ray ends them when the driver exits normally, and its reaper ends the GCS and the
raylet within a second of a driver SIGKILL; but the raylet's agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) were seen to outlive a SIGKILLed driver by one to two minutes (issue 32). The kernel's
parent-death signal (`prctl(PR_SET_PDEATHSIG)`) cannot end them: a process sets it for itself, it is cleared
in every forked child, and the agents are children of the raylet, started by Ray's C++ code.

So `start()`, called by `ensure_ray` after it started an embedded Ray, launches this file as a process of its
own session (`python -I -S .../ray_watchdog.py DRIVER_PID PID:START...`, standard library only, so it starts
in tens of milliseconds). The watchdog waits on the driver (a pidfd where Linux has one, else a 0.5 s poll of
/proc) and, while it waits, records every descendant of the Ray processes it was given, with its start time,
once a second for the node's first 30 s and every 10 s after (one scan of /proc costs a few milliseconds) - so
it still knows the agents after the raylet's death re-parents them. When the driver is gone it sends SIGTERM
to each recorded process that still exists as the same process (same pid and start time: a reused pid is never
signalled), SIGKILL to any left after `GRACE_S`, and exits. When every recorded process ended while the driver
lives (`ray.shutdown()`), it exits without signalling anything. Linux only (it reads /proc); elsewhere `start`
does nothing.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

SCAN_S = (1.0, 10.0)
"""Seconds between two scans of /proc: the first while the node starts its agents (`FAST_S`), then the second
(workers need no recording: they die with their raylet)."""
FAST_S = 30.0
GRACE_S = 3.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _processes() -> dict[int, tuple[int, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                table[int(entry)] = stat
    return table


def alive(tracked: dict[int, int]) -> dict[int, int]:
    """The processes of `tracked` (pid -> start time) that still exist as the same process, and every live
    descendant of them, pid -> start time."""
    table = _processes()
    found = {pid: start for pid, start in tracked.items() if pid in table and table[pid][1] == start}
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _) in table.items():
        children[ppid].append(pid)
    stack = list(found)
    while stack:
        for child in children[stack.pop()]:
            if child not in found:
                found[child] = table[child][1]
                stack.append(child)
    return found


def _wait_for_exit(driver: int, start: int, fd: int | None, timeout: float) -> bool:
    """Whether the driver is gone, waiting up to `timeout` seconds for it to go."""
    if fd is not None:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = _stat(driver)
        if stat is None or stat[1] != start:
            return True
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    stat = _stat(driver)
    return stat is None or stat[1] != start


def _end(tracked: dict[int, int]) -> None:
    """SIGTERM to the tracked processes that still exist (and their descendants), SIGKILL after GRACE_S."""
    targets = alive(tracked)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + GRACE_S
        while sig == signal.SIGTERM and targets and time.monotonic() < deadline:
            time.sleep(0.2)
            targets = alive(targets)


def watch(driver: int, roots: dict[int, int]) -> int:
    """Wait for `driver` to die, then end the Ray processes `roots` and their descendants (see above)."""
    start = (_stat(driver) or (0, -1))[1]
    try:
        fd: int | None = os.pidfd_open(driver)
    except (AttributeError, OSError):
        fd = None
    tracked = alive(roots)
    began = time.monotonic()
    while tracked:
        interval = SCAN_S[0] if time.monotonic() - began < FAST_S else SCAN_S[1]
        if start == -1 or _wait_for_exit(driver, start, fd, interval):
            _end(tracked)
            return 0
        tracked = alive(tracked)
    return 0  # Ray ended while the driver lives: nothing to guard


def start(roots: dict[int, int] | None = None) -> subprocess.Popen[bytes] | None:
    """Launch the watchdog for this process and its embedded Ray (`roots`, pid -> start time; default: the
    processes the running embedded Ray node started). None where it cannot run (not Linux, no node)."""
    if not sys.platform.startswith("linux"):
        return None
    if roots is None:
        roots = {}
        try:
            import ray

            node: Any = ray._private.worker._global_node  # the node `ray.init()` started in this process
            pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
        except AttributeError:
            return None
        for pid in pids:
            stat = _stat(pid)
            if stat is not None:
                roots[pid] = stat[1]
    args = [f"{pid}:{started}" for pid, started in roots.items()]
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, str(os.getpid()), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )
    threading.Thread(target=proc.wait, name="marin-ray-watchdog-reaper", daemon=True).start()
    return proc


if __name__ == "__main__":
    pairs = [arg.split(":") for arg in sys.argv[2:]]
    raise SystemExit(watch(int(sys.argv[1]), {int(pid): int(started) for pid, started in pairs}))
