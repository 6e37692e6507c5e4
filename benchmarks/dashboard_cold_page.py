"""The experiments list's cold pages beside a busy interpreter: wall and CPU of computing the verdicts and
headlines of pages of 25 experiments (marin/dashboard/results.py `numbers`, nothing cached) while one other
thread spins, as a request rendering a page does in the server.

    PYTHONPATH=. python benchmarks/dashboard_cold_page.py --prefix /tmp/compare-bench [--pages 12] [--no-busy]

The prefix is one `benchmarks/dashboard_load.py --prefix` wrote. Prints one JSON object: the median wall and
CPU (this thread's) ms per page, and each page's wall. A page's CPU is a few tens of ms; its wall beside the
busy thread is several times that, because each of its ~1,900 system calls gives up the interpreter lock and
waits to get it back. Run before/after trees alternately (`PYTHONPATH=TREE`): CPU compares across a busy
machine, wall less so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marin.dashboard import results  # noqa: E402
from marin.dashboard.context import Dashboard  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefix", required=True)
    p.add_argument("--pages", type=int, default=12)
    p.add_argument("--no-busy", action="store_true", help="no spinning thread beside the pages")
    args = p.parse_args()
    dash = Dashboard.open(args.prefix, cache_ttl=600)
    ids = [s.id for s in dash.experiments.query(limit=1 << 30).items]
    results.numbers(dash, ids[0])  # the step table and the index: built once, not part of a page
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(10000))

    busy = None if args.no_busy else threading.Thread(target=spin, daemon=True)
    if busy is not None:
        busy.start()
    walls, cpus = [], []
    for k in range(args.pages):
        page = ids[25 + 25 * k: 50 + 25 * k]
        w, c = time.perf_counter(), time.thread_time()
        for experiment_id in page:
            results.numbers(dash, experiment_id)
        walls.append(1000 * (time.perf_counter() - w))
        cpus.append(1000 * (time.thread_time() - c))
    stop.set()
    print(json.dumps({"code": str(Path(results.__file__).resolve().parents[2]), "pages": args.pages,
                      "busy_thread": busy is not None, "median_wall_ms": round(statistics.median(walls), 1),
                      "median_cpu_ms": round(statistics.median(cpus), 1),
                      "walls_ms": [round(x) for x in walls]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
