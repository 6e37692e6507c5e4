"""Storage on object stores against real servers on loopback: S3 conditional writes (moto) for leases, and a
whole run under an s3:// prefix; gs:// basic operations against the GCS emulator (which ignores preconditions;
the GCS lease races are proven against fake-gcs-server in test_gcs_preconditions.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from marin.storage.fs import FsspecStorage, storage_for
from marin.storage.lease import LeaseInfo, LeaseManager
from tests.marin.fns import FsCopyConfig, FsWriteConfig, fs_copy_upper, fs_write
from tests.marin.gcs_env import free_port, gcs_emulator


def _wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def test_s3_conditional_writes_back_leases(s3_bucket: str) -> None:
    storage = storage_for(s3_bucket)
    assert isinstance(storage, FsspecStorage) and storage.protocol == "s3"
    path = f"{s3_bucket}/leases/a/.marin/lease.json"
    assert storage.create_exclusive(path, "first")
    assert not storage.create_exclusive(path, "second")  # If-None-Match: * refused the overwrite
    current = storage.read_versioned(path)
    assert current is not None and current.text == "first"
    assert storage.replace_if(path, "third", current.token)
    assert not storage.replace_if(path, "stale writer", current.token)  # If-Match on the old ETag fails
    assert not storage.delete_if(path, current.token)
    assert storage.read_text(path) == "third"
    fresh = storage.read_versioned(path)
    assert fresh is not None and storage.delete_if(path, fresh.token) and storage.read_text(path) is None


def test_s3_heartbeat_of_a_lease_its_worker_released_reports_it_gone(s3_bucket: str) -> None:
    storage = storage_for(s3_bucket)
    path = f"{s3_bucket}/leases/released/.marin/lease.json"
    lost: list[str] = []
    manager = LeaseManager(storage, "exec-1", timeout_s=60, on_lost=lost.append)
    try:
        assert manager.try_acquire(path, attempt=1).ok
        current = storage.read_versioned(path)
        assert current is not None and storage.delete_if(path, current.token)  # what the worker does
        assert not storage.replace_if(path, "x", current.token) and not storage.delete_if(path, current.token)
        manager.renew_all()  # a missing object is "not ours any more", not an error
        assert lost == [path] and storage.read_text(path) is None
    finally:
        manager.stop()


def test_s3_stale_lease_takeover_has_one_winner(s3_bucket: str) -> None:
    storage = storage_for(s3_bucket)
    path = f"{s3_bucket}/leases/b/.marin/lease.json"
    old = LeaseInfo("dead-executor", time.time() - 600, time.time() - 600, 60, 1)
    assert storage.create_exclusive(path, old.to_json())
    managers = [LeaseManager(storage, f"m{i}", timeout_s=60) for i in range(4)]
    results = [m.try_acquire(path, attempt=2) for m in managers]
    assert [r.ok for r in results] == [True, False, False, False]
    assert results[0].previous_owner == "dead-executor"
    assert results[1].holder and results[1].holder.owner == "m0"
    assert managers[0].release(path) and storage.read_text(path) is None
    for m in managers:
        m.stop()


def test_a_whole_run_under_an_s3_prefix(s3_bucket: str) -> None:
    prefix = f"{s3_bucket}/runs"
    first = Step(name="s3/first", fn=fs_write,
                 config=FsWriteConfig(output_path=this_output_path(), text="abc"))
    second = Step(name="s3/second", fn=fs_copy_upper, config=FsCopyConfig(
        input_path=output_path_of(first, "out.txt"), output_path=this_output_path()))
    result = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="tests/s3.py")
    assert result.status == "SUCCESS"
    storage = storage_for(prefix)
    out = result.output_path("s3/second")
    assert out.startswith(f"{prefix}/s3/second-") and storage.read_text(f"{out}/out.txt") == "ABC"
    status = json.loads(storage.read_text(f"{out}/.marin/status.json") or "{}")
    assert status["status"] == "SUCCESS" and storage.read_text(f"{out}/.marin/lease.json") is None
    log = storage.read_text(f"{result.output_path('s3/first')}/.marin/logs/attempt-1.log") or ""
    assert "wrote s3://marin-test/runs/s3/first-" in log
    events = (storage.read_text(f"{out}/.marin/events.jsonl") or "").splitlines()
    assert [json.loads(e)["event"] for e in events] == ["RUNNING", "SUCCESS"]
    again = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                           script="tests/s3.py")
    assert [e.action for e in again.plan.entries] == ["skip", "skip"]


@pytest.fixture(scope="module")
def gcs_bucket() -> Iterator[str]:
    exe = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).with_name("gcp-storage-emulator"))
    if not os.path.exists(exe):
        pytest.skip("gcp-storage-emulator is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory",
                             "--default-bucket=marin-gcs"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        with gcs_emulator(f"http://127.0.0.1:{port}"):
            _wait_port(port)
            yield "gs://marin-gcs"
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_whole_run_under_a_gs_prefix(gcs_bucket: str) -> None:
    prefix = f"{gcs_bucket}/runs"
    first = Step(name="gs/first", fn=fs_write,
                 config=FsWriteConfig(output_path=this_output_path(), text="xyz"))
    second = Step(name="gs/second", fn=fs_copy_upper, config=FsCopyConfig(
        input_path=output_path_of(first, "out.txt"), output_path=this_output_path()))
    result = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="tests/gs.py")
    assert result.status == "SUCCESS", result.summary
    storage = storage_for(prefix)
    out = result.output_path("gs/second")
    assert storage.read_text(f"{out}/out.txt") == "XYZ"
    assert json.loads(storage.read_text(f"{out}/.marin/status.json") or "{}")["status"] == "SUCCESS"
    assert storage.read_text(f"{out}/.marin/lease.json") is None
    manifest = storage.read_text(f"{prefix}/experiments/{result.experiment_id}.json")
    assert manifest and json.loads(manifest)["runs"][-1]["status"] == "SUCCESS"
    again = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                           script="tests/gs.py")
    assert [e.action for e in again.plan.entries] == ["skip", "skip"]


def test_runs_of_one_experiment_started_at_once_on_s3_all_land_in_its_manifest(s3_bucket: str) -> None:
    """The manifest is updated by compare-and-swap (If-None-Match / If-Match): no run entry is lost."""
    import threading

    from marin.status.manifest import end_run, manifest_path, start_run

    storage = storage_for(s3_bucket)
    barrier = threading.Barrier(6)

    def go(i: int) -> None:
        barrier.wait()
        start_run(storage, s3_bucket, "exp1_demo-0123abcd", script="experiments/exp1_demo.py", description="",
                  issue=None, provenance={}, steps=[], run_id=f"run-{i}", args=[])
        end_run(storage, s3_bucket, "exp1_demo-0123abcd", f"run-{i}", "SUCCESS", [])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = storage.read_text(manifest_path(s3_bucket, "exp1_demo-0123abcd"))
    assert text is not None
    runs = {r["run_id"]: r["status"] for r in json.loads(text)["runs"]}
    assert runs == {f"run-{i}": "SUCCESS" for i in range(6)}


# ----- leases taken off the executor's loop (executor.py `_start_ready`) ---------------------------------
def test_a_lease_slow_to_take_holds_up_no_other_step(s3_bucket: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`slow`'s lease is taken only once the executor has started `after`, a step that can start only when
    `first` has finished and the loop has handled it: taking leases on the loop's own thread would wait for
    `slow` first, and the run would never get there."""
    import threading

    from marin.execution.step_leases import StepLeases

    asked_for_after = threading.Event()
    take = StepLeases.acquire

    def acquire(self: StepLeases, st: Any, attempt: int) -> Any:
        if st.node.name == "pipe/after":
            asked_for_after.set()
        if st.node.name == "pipe/slow":
            assert asked_for_after.wait(60), "the loop waited for a lease instead of starting other steps"
        return take(self, st, attempt=attempt)

    monkeypatch.setattr(StepLeases, "acquire", acquire)
    first = Step(name="pipe/first", fn=fs_write,
                 config=FsWriteConfig(output_path=this_output_path(), text="a"))
    slow = Step(name="pipe/slow", fn=fs_write,
                config=FsWriteConfig(output_path=this_output_path(), text="b"))
    after = Step(name="pipe/after", fn=fs_copy_upper, config=FsCopyConfig(
        input_path=output_path_of(first, "out.txt"), output_path=this_output_path()))
    result = run_experiment([first, slow, after], ExecutorMainConfig(prefix=f"{s3_bucket}/pipelined",
                                                                      backend="local", max_concurrent=4),
                            verbose=False, script="tests/s3.py")
    assert {n: result.status_of(n) for n in ("pipe/first", "pipe/slow", "pipe/after")} == {
        "pipe/first": "SUCCESS", "pipe/slow": "SUCCESS", "pipe/after": "SUCCESS"}
    assert storage_for(s3_bucket).read_text(f"{result.output_path('pipe/after')}/out.txt") == "A"


def test_a_lease_that_cannot_be_taken_stops_the_run_and_gives_back_the_others(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store fails while one ready step's lease is taken: the run stops with that error, the leases
    taken meanwhile for the others are released, and no step is left RUNNING."""
    from marin.errors import StorageError
    from marin.execution.step_leases import StepLeases

    take = StepLeases.acquire

    def acquire(self: StepLeases, st: Any, attempt: int) -> Any:
        if st.node.name == "fail/b3":
            time.sleep(0.5)  # the others' leases are taken (and some steps launched) meanwhile
            raise StorageError("s3://marin-test/...: the store refused the lease (test)")
        return take(self, st, attempt=attempt)

    monkeypatch.setattr(StepLeases, "acquire", acquire)
    steps = [Step(name=f"fail/b{i}", fn=fs_write, config=FsWriteConfig(output_path=this_output_path(),
                                                                       text=str(i)))
             for i in range(6)]
    prefix = f"{s3_bucket}/lease-failure"
    with pytest.raises(StorageError, match="the store refused the lease"):
        run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local", max_concurrent=6),
                       verbose=False, script="tests/s3.py")
    storage = storage_for(prefix)
    listing = storage.list_files(f"{prefix}/fail") or {}
    assert not [name for name in listing if name.endswith(".marin/lease.json")], sorted(listing)
    statuses = [json.loads(storage.read_text(f"{prefix}/fail/{name}") or "{}")["status"]
                for name in listing if name.endswith(".marin/status.json")]
    assert "RUNNING" not in statuses, statuses
