"""Load benchmark of the dashboard: 1,000 experiments x 20 steps, 8 concurrent clients, latency percentiles.

    PYTHONPATH=. python benchmarks/dashboard_load.py [--experiments 1000] [--clients 8] [--requests 480]

Writes a synthetic prefix in the real on-storage format (tests.fakes.synthetic_prefix; kept in --prefix when
given, else a temporary directory), starts `marin dashboard` with uvicorn in a subprocess on 127.0.0.1, and
for each target (experiments list, experiment page, step page — the HTML pages and the JSON API calls behind
them) sends `--requests` requests from `--clients` threads, each with its own keep-alive connection and random
experiments/steps/list pages, and the compare view (page and API) of 4 training runs of `--compare-rows`
(10,000) logged steps each, written as 4 more experiments whose train steps log that many rows (their curves
are downsampled on the server). Prints one JSON object: p50/p95/p99/mean latency in ms, errors, throughput
and the server's CPU ms per request (from /proc, for side-by-side runs on a busy machine) per target, plus
the first (cold-cache) request of each kind. The first target, `experiments_list_page_after_start`, is timed
right after the first list request, while the background warm-up it started computes every experiment's
verdict and headline (marin/dashboard/results.py): its pages are the ones a request computes itself.
Target on a 2-core machine: p95 <= 200 ms, 0 errors. The load generator runs on the same machine as the
server and takes CPU from it: the figures are pessimistic.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.synthetic_prefix import write_experiment, write_prefix  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(prefix: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "marin.dashboard.cli",
        "--prefix",
        prefix,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("dashboard exited: "
                                   f"{proc.stderr.read().decode() if proc.stderr else ''}") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"dashboard did not listen on port {port} within 60 s")


def get(conn: http.client.HTTPConnection, url: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn.request("GET", url)
    resp = conn.getresponse()
    resp.read()
    return resp.status, (time.perf_counter() - t0) * 1000


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the server process has used so far: less disturbed by the machine's
    load than latency, so before/after runs on a busy machine compare by it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_target(port: int, urls: list[str], clients: int, pid: int) -> dict[str, float | int | None]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    chunks = [urls[i::clients] for i in range(clients)]

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for url in mine:
            try:
                status, ms = get(conn, url)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with lock:
                    errors.append(f"{url}: {e}")
                continue
            with lock:
                latencies.append(ms)
                if status != 200:
                    errors.append(f"{url}: HTTP {status}")
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
    cpu0 = server_cpu_s(pid)
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu_ms = (server_cpu_s(pid) - cpu0) * 1000
    qs = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    return {
        "requests": len(urls),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": round(qs[49], 1),
        "p95_ms": round(qs[94], 1),
        "p99_ms": round(qs[98], 1),
        "mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "rps": round(len(latencies) / wall, 1),
        # the server's CPU per request (background work during the target, such as the warm-up, included)
        "server_cpu_ms_per_request": round(cpu_ms / len(urls), 2) if urls else None,
    }


def _manifests(prefix: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(Path(prefix, "experiments").glob("*.json"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefix", default=None, help="where to write (or reuse) the synthetic prefix")
    p.add_argument("--experiments", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=480, help="requests per target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare-rows", type=int, default=10000, help="logged steps of each compared run")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="seconds to wait after the cold requests (the list's warm-up) before timing")
    args = p.parse_args()
    rng = random.Random(args.seed)

    tmp = None if args.prefix else tempfile.TemporaryDirectory(prefix="marin-dash-bench-")
    prefix = os.path.abspath(args.prefix or tmp.name)  # type: ignore[union-attr]
    t0 = time.perf_counter()
    if not os.path.isdir(os.path.join(prefix, "experiments")):
        write_prefix(prefix, args.experiments)
        long_ids = [write_experiment(prefix, args.experiments + k, args.compare_rows) for k in range(4)]
    else:
        long_ids = [m["id"] for m in _manifests(prefix) if m["runs"][0]["run_id"] in
                    {f"run-{args.experiments + k:06d}" for k in range(4)}]
    generate_s = time.perf_counter() - t0
    manifests = [m for m in _manifests(prefix) if m["id"] not in long_ids]
    exp_ids = [m["id"] for m in manifests]
    step_paths = [os.path.relpath(s["output_path"], prefix) for m in manifests for s in m["steps"]]
    long_trains = [os.path.relpath(s["output_path"], prefix) for m in _manifests(prefix)
                   if m["id"] in long_ids for s in m["steps"] if "/train/" in s["name"]][::5][:4]
    compare_query = "&".join(f"runs={quote(p)}" for p in long_trains)

    port = free_port()
    t0 = time.perf_counter()
    server = start_server(prefix, port)
    start_s = time.perf_counter() - t0
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        n = args.requests
        pages = max(1, len(exp_ids) // 25)
        cold = {"experiments_list": get(conn, "/")[1]}
        conn.close()
        # at once, while the warm-up the first list request started runs: pages computed by the request
        after_start = run_target(port, [f"/?offset={25 * rng.randrange(pages)}&limit=25" for _ in range(n)],
                                 args.clients, server.pid)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)  # the server closes an idle one
        cold.update({
            "experiment_page": get(conn, "/experiments/" + quote(exp_ids[0]))[1],
            "step_page": get(conn, "/steps/" + quote(step_paths[7]))[1],
            "compare_page": get(conn, "/compare?" + compare_query)[1],
        })
        conn.close()
        time.sleep(args.settle_s)  # let the background warm-up the first list request started finish
        states = ["", "&state=FAILED", "&state=RUNNING", "&author=bob", "&q=sweep+1"]

        def list_url(api: bool) -> str:
            base = "/api/experiments?" if api else "/?"
            state = rng.choice(states) if rng.random() < 0.3 else ""
            return f"{base}offset={25 * rng.randrange(pages)}&limit=25{state}"

        targets = {
            "experiments_list_page": [list_url(False) for _ in range(n)],
            "experiments_list_api": [list_url(True) for _ in range(n)],
            "experiment_page": ["/experiments/" + quote(rng.choice(exp_ids)) for _ in range(n)],
            "experiment_api": ["/api/experiments/" + quote(rng.choice(exp_ids)) for _ in range(n)],
            "step_page": ["/steps/" + quote(rng.choice(step_paths)) for _ in range(n)],
            "step_api": ["/api/steps/" + quote(rng.choice(step_paths)) for _ in range(n)],
            "compare_page": [f"/compare?{compare_query}&smooth={rng.choice(['0', '0.9'])}" for _ in range(n)],
            "compare_api": [f"/api/compare?{compare_query}&x={rng.choice(['step', 'flops'])}"
                            for _ in range(n)],
        }
        results = {"experiments_list_page_after_start": after_start}
        for name, urls in targets.items():
            results[name] = run_target(port, urls, args.clients, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
        if tmp is not None:
            tmp.cleanup()
    met = all(r["p95_ms"] <= 200 and r["errors"] == 0 for r in results.values())
    print(
        json.dumps(
            {
                "experiments": len(exp_ids),
                "compared_runs": len(long_trains),
                "compared_rows_per_run": args.compare_rows,
                "steps": len(step_paths),
                "clients": args.clients,
                "requests_per_target": args.requests,
                "cpus": os.cpu_count(),
                "generate_s": round(generate_s, 1),
                "server_start_s": round(start_s, 2),
                "cold_first_request_ms": {k: round(v, 1) for k, v in cold.items()},
                "results": results,
                "target": "p95 <= 200 ms and 0 errors per target",
                "target_met": met,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
