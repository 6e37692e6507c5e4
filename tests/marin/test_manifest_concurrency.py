"""The experiment manifest is updated by compare-and-swap: concurrent runs of one experiment all land."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path

from marin.status.manifest import end_run, manifest_path, start_run
from marin.storage.fs import storage_for


def _start(prefix: str, run_id: str) -> None:
    start_run(storage_for(prefix), prefix, "exp1_demo-0123abcd", script="experiments/exp1_demo.py",
              description="",
              issue=None, provenance={"user": "u", "host": "h", "git_commit": None}, steps=[], run_id=run_id,
              args=[])


def _start_and_end(prefix: str, run_id: str) -> None:
    _start(prefix, run_id)
    end_run(storage_for(prefix), prefix, "exp1_demo-0123abcd", run_id, "SUCCESS", [])


def _runs(prefix: str) -> dict[str, str]:
    text = storage_for(prefix).read_text(manifest_path(prefix, "exp1_demo-0123abcd"))
    assert text is not None
    return {r["run_id"]: r["status"] for r in json.loads(text)["runs"]}


def test_runs_started_and_ended_by_many_threads_at_once_all_land(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    barrier = threading.Barrier(12)

    def go(i: int) -> None:
        barrier.wait()
        _start_and_end(prefix, f"run-{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _runs(prefix) == {f"run-{i}": "SUCCESS" for i in range(12)}
    assert sorted(p.name for p in (tmp_path / "experiments").iterdir()) == [
        "exp1_demo-0123abcd.json"]  # no temporary file left behind


def test_runs_started_by_several_processes_at_once_all_land(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_start, args=(prefix, f"proc-{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert _runs(prefix) == {f"proc-{i}": "RUNNING" for i in range(4)}
