"""CPU of the Ray backend's result watcher when many attempts are queued; prints one JSON object.

    scripts/netns python benchmarks/result_watcher_cost.py [--queued 10000] [--seconds 3]

`--queued` tasks wait behind one long-running task (as attempts queued behind a running step do) while a
stream of 2 ms tasks finishes one after another for `--seconds`. Reported for the watcher as shipped and with
its CPU floor switched off (`COST_FACTOR = 0`): the share of a core its thread used, and how many of the short
tasks' results it had delivered 0.3 s after the stream ended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from marin.execution.ray_backend import _ResultWatcher, ensure_ray  # noqa: E402


def thread_cpu_s(native_id: int) -> float:
    with open(f"/proc/{os.getpid()}/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(ray: Any, cost_factor: float, queued: int, seconds: float) -> dict[str, Any]:
    blocker = ray.remote(num_cpus=0, max_retries=0)(lambda: time.sleep(3600)).remote()
    behind = ray.remote(num_cpus=1)(lambda *deps: None)
    short = ray.remote(num_cpus=1)(lambda: time.sleep(0.002))
    delivered: list[str] = []
    _ResultWatcher.COST_FACTOR = cost_factor
    watcher = _ResultWatcher(ray, lambda task, value: delivered.append(task))  # type: ignore[arg-type]
    try:
        for i in range(queued):
            watcher.watch(behind.remote(blocker), f"queued-{i}")  # type: ignore[arg-type]
        time.sleep(0.5)
        assert watcher._thread.native_id is not None
        cpu0, t0, sent = thread_cpu_s(watcher._thread.native_id), time.time(), 0
        while time.time() - t0 < seconds:
            watcher.watch(short.remote(), f"short-{sent}")  # type: ignore[arg-type]
            sent += 1
            time.sleep(0.002)
        time.sleep(0.3)
        cpu = thread_cpu_s(watcher._thread.native_id) - cpu0
        wall = time.time() - t0
        got = sum(1 for task in delivered if task.startswith("short-"))
    finally:
        ray.cancel(blocker, force=True)
        watcher.close()
    return {"cost_factor": cost_factor, "watcher_core_share": round(cpu / wall, 3), "short_sent": sent,
            "short_delivered": got}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    import ray

    ensure_ray(None)
    shipped = _ResultWatcher.COST_FACTOR
    try:
        out = {"queued": args.queued, "shipped": measure(ray, shipped, args.queued, args.seconds),
               "no_floor": measure(ray, 0.0, args.queued, args.seconds)}
    finally:
        _ResultWatcher.COST_FACTOR = shipped
        ray.shutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
