"""Cost of issue-tracker publishing for a large run: API calls made and time taken from the executor's thread.

Replays the state transitions of a 1,000-step fan-out (WAITING -> RUNNING -> SUCCESS for every step: 2,000
transitions, each followed by ``publish(view, final=False)`` as the executor does, with a short pause
between transitions standing in for step work) into an IssuePublisher, against the fake GitHub API server
(tests/fakes/github_api.py, PyGithub's pauses off) and against the local SQLite tracker, then publishes the
final view. Prints JSON: API calls by method, comment edits, publish() latency in the caller's thread
(p50/p99/max, microseconds) and the wall time of the final, synchronous publish.

    PYTHONPATH=. python benchmarks/tracker_publish.py [--steps 1000] [--interval 0.5] [--pause-ms 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marin.status.publisher import RunView, StepView  # noqa: E402
from marin.tracking.base import Tracker  # noqa: E402
from marin.tracking.github import GitHubTracker  # noqa: E402
from marin.tracking.local import LocalTracker  # noqa: E402
from marin.tracking.publisher import IssuePublisher  # noqa: E402
from tests.fakes.github_api import FakeGitHub  # noqa: E402


def replay(tracker: Tracker, prefix: str, steps: int, interval: float, pause_s: float) -> dict[str, Any]:
    views = [StepView(f"fan/s{i:04d}", f"{i:064x}", f"{prefix}/fan/s{i:04d}-{i:08x}", "WAITING", 0, None,
                      None,
                      None, None, ()) for i in range(steps)]
    t0 = time.time()
    run = RunView("bench-0a1b2c3d", "run-1", "benchmarks/tracker_publish.py", "publisher benchmark",
                  f"{tracker.repo}#1", prefix, "RUNNING", t0, None, tuple(views))
    pub = IssuePublisher(tracker, 1, min_interval_s=interval)
    latencies = []
    for i in range(steps):
        for status in ("RUNNING", "SUCCESS"):
            now = time.time()
            views[i] = dataclasses.replace(views[i], status=status, attempt=1,
                                           started=views[i].started or now,
                                           ended=now if status == "SUCCESS" else None)
            run = dataclasses.replace(run, steps=tuple(views))
            start = time.perf_counter()
            pub.publish(run, final=False)
            latencies.append((time.perf_counter() - start) * 1e6)
            time.sleep(pause_s)
    replay_s = time.time() - t0
    start = time.perf_counter()
    pub.publish(dataclasses.replace(run, status="SUCCESS", ended=time.time()), final=True)
    final_s = time.perf_counter() - start
    latencies.sort()
    return {"transitions": len(latencies), "replay_s": round(replay_s, 2), "flushes": pub.api_flushes,
            "publish_us": {"p50": round(statistics.median(latencies), 1),
                           "p99": round(latencies[int(len(latencies) * 0.99)], 1),
                           "max": round(latencies[-1], 1)},
            "final_publish_s": round(final_s, 3), "errors": pub.errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=0.5, help="debounce interval (s)")
    parser.add_argument("--pause-ms", type=float, default=1.0, help="pause between transitions (ms)")
    args = parser.parse_args()
    out: dict[str, Any] = {"steps": args.steps, "interval_s": args.interval, "pause_ms": args.pause_ms}
    with FakeGitHub() as server, tempfile.TemporaryDirectory() as tmp:
        server.add_repo("lab/bench")
        server.add_issue("lab/bench", "benchmark")
        tracker = GitHubTracker("lab/bench", server.token, api_url=server.base_url, throttle=False)
        result = replay(tracker, tmp, args.steps, args.interval, args.pause_ms / 1000)
        by_method: dict[str, int] = {}
        for request in server.requests:
            by_method[request.method] = by_method.get(request.method, 0) + 1
        result["api_calls"] = {"total": len(server.requests), **by_method}
        result["comment_chars"] = len(server.issue_comments("lab/bench", 1)[0]["body"])
        out["github_fake"] = result
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalTracker(tmp)
        local.create_issue("benchmark", "")
        out["local"] = replay(local, tmp, args.steps, args.interval, args.pause_ms / 1000)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
