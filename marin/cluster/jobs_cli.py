"""`marin jobs list [--format json] | logs JOB [--follow] | stop JOB [--cluster ADDRESS]`.

JOB is a submission id (`marin-exp12_x-1a2b3c4d-1`) or an experiment id (its newest driver job). `logs` prints
the driver's output; with `--steps` it also prints the output of the experiment's running steps, read from
their attempt logs under the prefix (each line prefixed with the step's name), which is where a step's own
prints go. `stop` stops the driver job (SIGTERM: running steps are recorded PREEMPTED and their leases
released) and any supervisor of the experiment, so nothing is resubmitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from marin.cluster import jobs


def _list(client: Any, fmt: str = "table") -> int:
    rows = jobs.marin_jobs(client)
    if fmt == "json":  # every field but the runtime env (it names the sealed credentials' package)
        shown = [{k: v for k, v in dataclasses.asdict(r).items() if k != "runtime_env"} for r in rows]
        print(json.dumps(shown, indent=1))
        return 0
    if not rows:
        print("no marin jobs on this cluster")
        return 0
    print(f"{'JOB':<60} {'KIND':<10} {'STATE':<10} {'STARTED':<21} {'ISSUE':<20} EXPERIMENT")
    for r in rows:
        print(
            f"{r.submission_id:<60} {r.kind:<10} {r.status:<10} {jobs.format_time(r.start_time):<21} "
            f"{r.issue or '-':<20} {r.experiment}"
        )
    return 0


class StepLogFollower:
    """Prints new lines of the running steps' attempt logs of one experiment, read from the prefix."""

    def __init__(
        self, prefix: str, experiment_id: str, write: Callable[[str], object] = sys.stdout.write
    ) -> None:
        from marin.storage import storage_for

        self.prefix, self.experiment_id, self.write = prefix, experiment_id, write
        self.storage = storage_for(prefix)
        self.offsets: dict[str, int] = {}

    def poll(self) -> None:
        from marin.status import files as sf
        from marin.status.files import read_record
        from marin.status.live_log import read_log
        from marin.status.manifest import manifest_path

        data = read_record(self.storage, manifest_path(self.prefix, self.experiment_id)) or {}
        for step in data.get("steps", []):
            status = sf.read_status(self.storage, step["output_path"]) or {}
            attempt = int(status.get("attempt") or 0)
            if status.get("status") != sf.RUNNING and step["output_path"] not in self.offsets or not attempt:
                continue
            path = sf.log_path(step["output_path"], attempt)
            text = read_log(self.storage, path) or ""  # on an object store: the chunks shipped so far
            seen = self.offsets.get(path, 0)
            if len(text) > seen:
                for line in text[seen:].splitlines(keepends=True):
                    self.write(f"[{step['name']}] {line}")
                self.offsets[path] = len(text)
            self.offsets.setdefault(step["output_path"], 0)


def _logs(client: Any, name: str, follow: bool, steps: bool) -> int:
    row = jobs.resolve(client, name)
    if not follow:
        sys.stdout.write(client.get_job_logs(row.submission_id))
        if steps and row.prefix:
            StepLogFollower(row.prefix, row.experiment).poll()
        return 0
    stop = threading.Event()
    if steps and row.prefix:
        follower = StepLogFollower(row.prefix, row.experiment)

        def poll_steps() -> None:
            while not stop.is_set():
                follower.poll()
                stop.wait(1.0)

        threading.Thread(target=poll_steps, name="marin-step-logs", daemon=True).start()
    try:
        jobs.follow_logs(client, row.submission_id)
    finally:
        stop.set()
    return 0


def _stop(client: Any, name: str) -> int:
    row = jobs.resolve(client, name)
    for sup in jobs.marin_jobs(client, row.experiment, jobs.SUPERVISOR):
        if sup.live:
            client.stop_job(sup.submission_id)
    stopped = client.stop_job(row.submission_id)
    deadline = time.monotonic() + 60
    while jobs.resolve(client, row.submission_id).live and time.monotonic() < deadline:
        time.sleep(0.5)
    final = jobs.resolve(client, row.submission_id)
    print(f"marin jobs: {row.submission_id} {'stopped' if stopped else 'was not running'}: {final.status}")
    return 0


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="marin jobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", help="the head's Jobs API address, http://HEAD:8265 (default: $RAY_ADDRESS)")
    sub = p.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every job marin submitted, with its experiment, issue, state and "
                             "start time")
    listing.add_argument("--format", choices=("table", "json"), default="table",
                         help="output format (default: table)")
    logs = sub.add_parser("logs", help="a job's driver output (and its running steps' output with --steps)")
    logs.add_argument("job")
    logs.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--steps", action="store_true", help="also print the running steps' own output")
    stop = sub.add_parser("stop", help="stop a job (and its experiment's supervisor)")
    stop.add_argument("job")
    for parser in (listing, logs, stop):
        parser.add_argument("--cluster", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ns = p.parse_args(list(argv))
    try:
        client = jobs.client(ns.cluster)
        if ns.command == "list":
            return _list(client, ns.format)
        if ns.command == "logs":
            return _logs(client, ns.job, ns.follow, ns.steps)
        return _stop(client, ns.job)
    except (KeyError, ValueError, ConnectionError) as e:
        print(f"marin jobs: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
