"""What one storage call costs on fake-gcs-server, with no latency added: the engine's CPU per call (gcsfs and
google-cloud-storage paths of `GcsStorage`), and the server's CPU and wall per write as the bucket fills up,
written by 1, 4 and 16 threads at once; prints one JSON object.

    scripts/netns .venv/bin/python benchmarks/store_op_cost.py --objects 0 8000

Why: the 1,000-step run of `cloud_latency.py` leaves about 5 objects a step in one bucket, and
fake-gcs-server's in-memory backend takes its writes one at a time, each costing more the fuller the bucket
is. That server time is a floor under the run's wall time on this machine (the run's `cpu_s.run_server`),
which a real object store would not put on the engine's machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cloud_latency as cl  # noqa: E402  (the same servers and settings as the latency benchmark)


def engine_cpu_ms(fn: Callable[[int], Any], n: int) -> float:
    """The calling process's CPU milliseconds per call of `fn(i)`, over `n` calls one after another."""
    fn(-1)  # connections and clients made outside the count
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(n):
        fn(i)
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    return round(1000 * (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime) / n, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", nargs="+", type=int, default=[0, 8000], help="bucket sizes to measure at")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    out: dict[str, Any] = {"load_before": os.getloadavg(), "engine_cpu_ms": {}, "server": {}}
    with cl.server("gs") as (port, pid):
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(cl.store_env("gs", endpoint))
        cl.configure_fsspec("gs", endpoint)
        cl.make_bucket("gs", endpoint)
        from marin.storage.fs import storage_for

        st = storage_for(f"gs://{cl.BUCKET}/x")
        base, n = f"gs://{cl.BUCKET}/cost", args.calls
        cost = out["engine_cpu_ms"]
        cost["write_text (gcsfs)"] = engine_cpu_ms(lambda i: st.write_text(f"{base}/w{i}.json", "{}"), n)
        cost["read_text (gcsfs)"] = engine_cpu_ms(lambda i: st.read_text(f"{base}/w{i}.json"), n)
        cost["create_versioned (google-cloud-storage)"] = engine_cpu_ms(
            lambda i: st.create_versioned(f"{base}/c{i}.json", "x"), n)
        cost["read_versioned (google-cloud-storage)"] = engine_cpu_ms(
            lambda i: st.read_versioned(f"{base}/c{i}.json"), n)
        tokens = {i: st.read_versioned(f"{base}/c{i}.json").token for i in range(-1, n)}  # type: ignore[union-attr]
        cost["replace_if (google-cloud-storage)"] = engine_cpu_ms(
            lambda i: st.replace_if(f"{base}/c{i}.json", "y", tokens[i]), n)
        filled = 0
        for size in sorted(args.objects):
            with ThreadPoolExecutor(16) as pool:  # the bucket filled as a run fills it: small records
                list(pool.map(lambda i: st.write_text(f"{base}/fill/s{i // 8}/f{i % 8}.json", "{}"),
                              range(filled, size)))
            filled = max(filled, size)
            for threads in (1, 4, 16):
                s0, t0 = cl.process_cpu(pid), time.perf_counter()
                folder = f"{base}/t{size}-{threads}"
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda i, d=folder: st.write_text(f"{d}/{i}.json", "{}"), range(n)))
                out["server"][f"{size} objects, {threads} thread(s)"] = {
                    "wall_ms_per_write": round(1000 * (time.perf_counter() - t0) / n, 2),
                    "server_cpu_ms_per_write": round(1000 * (cl.process_cpu(pid) - s0) / n, 2)}
            s0 = cl.process_cpu(pid)
            for i in range(n):
                st.list_files(f"{base}/fill/s{i}")
            out["server"][f"{size} objects, listing one step's folder"] = {
                "server_cpu_ms": round(1000 * (cl.process_cpu(pid) - s0) / n, 2)}
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
