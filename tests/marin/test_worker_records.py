"""The worker writes an attempt's records for the executor holding the lease, and never SUCCESS without it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from marin.execution import worker
from marin.execution.attempt import AttemptResult, Outcome, StepRecord
from marin.execution.local_backend import LocalBackend
from marin.execution.worker import execute_step
from marin.status import files as sf
from marin.storage.fs import storage_for
from marin.storage.lease import LeaseInfo, LeaseManager
from tests.marin.fns import WriteConfig, write_numbers


def _numbers_attempt(out: Path, record: StepRecord, *dependencies: AttemptResult) -> AttemptResult:
    """Attempt 1 of a step writing three numbers to `out`, run in this process with `record`."""
    return execute_step(write_numbers, WriteConfig(output_path=str(out), n=3), sf.log_path(str(out), 1), {},
                        record,
                        *dependencies)


def _attempt_under_lease(root: Path, out: Path) -> AttemptResult:
    """`_numbers_attempt` for executor exec-1, which holds the step's lease while it runs."""
    leases = LeaseManager(storage_for(str(root)), "exec-1", 60)
    assert leases.try_acquire(sf.lease_path(str(out)), attempt=1).ok
    try:
        return _numbers_attempt(out, _record(out, "exec-1"))
    finally:
        leases.stop()


def _record(out: Path, executor: str) -> StepRecord:
    return StepRecord(output_path=str(out), name="w/numbers", hash="ab" * 32, attempt=1, run_id="run-1",
                      executor=executor, created=None, step_json='{"name":"w/numbers"}\n')


def test_the_worker_writes_step_json_running_and_success_under_its_executors_lease(tmp_path: Path) -> None:
    out = tmp_path / "w" / "numbers-abababab"
    result = _attempt_under_lease(tmp_path, out)
    assert result.ok and result.started is not None and result.ended is not None
    assert result.started <= result.ended
    # released once SUCCESS was written
    assert result.lease_released and not (out / ".marin/lease.json").exists()
    status = json.loads((out / ".marin/status.json").read_text())
    assert (status["status"], status["attempt"], status["executor"]) == ("SUCCESS", 1, "exec-1")
    assert status["started"] == result.started and status["ended"] == result.ended
    events = [json.loads(line) for line in (out / ".marin/events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["RUNNING", "SUCCESS"]
    assert (out / ".marin/step.json").read_text() == '{"name":"w/numbers"}\n'
    assert "writing 3 numbers" in (out / ".marin/logs/attempt-1.log").read_text()


def test_a_worker_whose_executor_lost_the_lease_while_it_ran_does_not_write_success(tmp_path: Path) -> None:
    out = tmp_path / "w" / "numbers-abababab"
    lease = sf.lease_path(str(out))
    leases = LeaseManager(storage_for(str(tmp_path)), "exec-1", 60)
    assert leases.try_acquire(lease, attempt=1).ok

    def taken_over_while_running(cfg: WriteConfig) -> None:
        write_numbers(cfg)
        Path(lease).write_text(LeaseInfo("exec-2", time.time(), time.time(), 60, 1).to_json())  # a takeover

    try:
        result = execute_step(taken_over_while_running, WriteConfig(output_path=str(out), n=3),
                              sf.log_path(str(out), 1), {}, _record(out, "exec-1"))
    finally:
        leases.stop()
    assert not result.ok and result.outcome is Outcome.LEASE_LOST and result.error_type == "LeaseLost"
    assert json.loads((out / ".marin/status.json").read_text())["status"] == "RUNNING"
    assert [json.loads(line)["event"] for line in (out / ".marin/events.jsonl").read_text().splitlines()] == [
        "RUNNING"]
    assert LeaseInfo.parse((out / ".marin/lease.json").read_text()).owner == "exec-2"  # type: ignore[union-attr]


def test_an_attempt_whose_lease_went_to_another_executor_before_it_started_does_not_run(
    tmp_path: Path,
) -> None:
    out = tmp_path / "w" / "numbers-abababab"
    other = LeaseManager(storage_for(str(tmp_path)), "exec-2", 60)
    assert other.try_acquire(sf.lease_path(str(out)), attempt=1).ok  # e.g. taken over while it was queued
    try:
        result = _numbers_attempt(out, _record(out, "exec-1"))
    finally:
        other.stop()
    assert not result.ok and result.outcome is Outcome.LEASE_LOST and "did not run" in result.message
    assert sorted(p.name for p in (out / ".marin").iterdir()) == ["lease.json"]  # no step.json, status or log
    assert not (out / "numbers.txt").exists()


def test_a_rerun_of_an_attempt_that_already_recorded_success_returns_it_without_running(
    tmp_path: Path,
) -> None:
    # Ray re-runs a task whose worker died after writing SUCCESS and releasing the lease, before its reply
    # reached the driver: the recorded result stands, fn is not called again and nothing is rewritten.
    out = tmp_path / "w" / "numbers-abababab"
    first = _attempt_under_lease(tmp_path, out)
    assert first.ok and first.lease_released
    before = {p.name: p.stat().st_mtime_ns for p in (out / ".marin").iterdir()}
    (out / "numbers.txt").unlink()
    again = _numbers_attempt(out, _record(out, "exec-1"))
    assert (again.outcome, again.lease_released, again.started, again.ended) == (
        Outcome.SUCCESS, True, first.started, first.ended)
    assert again.error == {"type": "", "message": "", "traceback": ""} and again.exception is None
    assert not (out / "numbers.txt").exists()  # fn did not run
    assert {p.name: p.stat().st_mtime_ns for p in (out / ".marin").iterdir()} == before


def test_an_attempt_queued_behind_a_failed_one_does_not_call_fn(tmp_path: Path) -> None:
    out = tmp_path / "w" / "numbers-abababab"
    result = _numbers_attempt(out, _record(out, "exec-1"), AttemptResult(Outcome.SUCCESS),
                              AttemptResult(Outcome.FAILED, message="ValueError: boom"))
    assert result.outcome is Outcome.SKIPPED and not result.ok and "boom" in result.message
    assert not out.exists()  # nothing written: not the output, not a status, not a log


def test_a_lease_renewed_while_success_is_written_is_left_for_the_executor_to_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "w" / "numbers-abababab"
    lease = sf.lease_path(str(out))
    leases = LeaseManager(storage_for(str(tmp_path)), "exec-1", 60)
    assert leases.try_acquire(lease, attempt=1).ok
    write_status = sf.write_status

    def renew_then_write(*args: object, **kwargs: object) -> object:
        if kwargs.get("status") == sf.SUCCESS:
            time.sleep(0.01)  # a later heartbeat timestamp, so the renewed lease's text differs
            leases.renew_all()  # the executor's heartbeat, between the worker's lease check and its release
        return write_status(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(worker.sf, "write_status", renew_then_write)
    try:
        result = _numbers_attempt(out, _record(out, "exec-1"))
        assert result.ok and result.lease_released is False
        assert json.loads((out / ".marin/status.json").read_text())["status"] == "SUCCESS"
        assert leases.holds(lease)  # the renewed lease is still there, and still the executor's
        assert leases.release(lease) and not (out / ".marin/lease.json").exists()
    finally:
        leases.stop()


def test_a_heartbeat_that_finds_the_lease_released_by_the_worker_is_not_a_lost_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The attempt's result reaches the executor only after several heartbeats, each of which finds the lease
    # gone (the worker released it after SUCCESS); the executor must still count the step as run by itself.
    collect = LocalBackend._collect

    def late_collect(self: LocalBackend, w: object) -> None:
        time.sleep(0.6)
        collect(self, w)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalBackend, "_collect", late_collect)
    step = Step(name="w/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=3))
    result = run_experiment([step],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               lease_timeout_s=0.4),
                            verbose=False)
    assert result.status == "SUCCESS"
    (state,) = result.steps.values()
    assert (state.status, state.note, state.attempt) == ("SUCCESS", "ran", 1)
    events = sf.read_events(storage_for(state.path), state.path)
    assert [e["event"] for e in events] == ["RUNNING", "SUCCESS"]
    assert not Path(sf.lease_path(state.path)).exists()


def test_a_rerun_while_the_lease_is_still_held_returns_the_recorded_success_and_leaves_the_lease(
        tmp_path: Path) -> None:
    # The worker wrote SUCCESS but died before releasing the lease (or a heartbeat had renewed it): Ray's
    # re-run
    # must not run fn again nor overwrite SUCCESS with RUNNING; the executor releases the lease itself.
    out = tmp_path / "w" / "numbers-abababab"
    lease = sf.lease_path(str(out))
    leases = LeaseManager(storage_for(str(tmp_path)), "exec-1", 60)
    try:
        assert leases.try_acquire(lease, attempt=1).ok
        record = dataclasses.replace(_record(out, "exec-1"), lease_acquired=leases.acquired_at(lease))
        held = Path(lease).read_text()
        first = _numbers_attempt(out, record)
        assert first.ok and first.lease_released
        Path(lease).write_text(held)  # as if the release had not happened
        (out / "numbers.txt").unlink()
        again = _numbers_attempt(out, record)
        assert again.ok and again.lease_released is False and again.ended == first.ended
        assert not (out / "numbers.txt").exists()
        assert json.loads((out / ".marin/status.json").read_text())["status"] == "SUCCESS"
    finally:
        leases.stop()


def test_an_attempt_from_an_earlier_holding_of_the_lease_does_not_run(tmp_path: Path) -> None:
    # The executor lost its lease and took it back (a new `acquired`): an attempt submitted under the old
    # holding
    # that starts late is not its agent any more.
    out = tmp_path / "w" / "numbers-abababab"
    lease = sf.lease_path(str(out))
    leases = LeaseManager(storage_for(str(tmp_path)), "exec-1", 60)
    try:
        assert leases.try_acquire(lease, attempt=1).ok
        old = dataclasses.replace(_record(out, "exec-1"), lease_acquired=leases.acquired_at(lease))
        assert leases.release(lease)
        time.sleep(0.01)
        assert leases.try_acquire(lease, attempt=2).ok and leases.acquired_at(lease) != old.lease_acquired
        result = _numbers_attempt(out, old)
        assert not result.ok and result.outcome is Outcome.LEASE_LOST and not (out / "numbers.txt").exists()
    finally:
        leases.stop()


def test_a_worker_that_lost_the_lease_leaves_the_ledger_to_the_new_holder(tmp_path: Path) -> None:
    """Attempt 2 skipped a damaged checkpoint (its progress file says so) but its lease was taken over while
    it ran, and the new holder wrote its own ledger entry: the worker writes no fallback entry (nor
    rewrites the ledger) - only a lease holder writes the step's records."""
    from marin.status import interruptions as il

    out = tmp_path / "w" / "numbers-abababab"
    lease = sf.lease_path(str(out))
    leases = LeaseManager(storage_for(str(tmp_path)), "exec-1", 60)
    assert leases.try_acquire(lease, attempt=2).ok
    ledger_file = out / ".marin/interruptions.json"

    def fell_back_then_taken_over(cfg: WriteConfig) -> None:
        write_numbers(cfg)
        skipped = {"step": 6, "resumed_from": 3, "resumed_time": time.time(), "steps_redone": 3}
        Path(il.progress_path(str(out))).write_text(json.dumps(
            {"step": 8, "resumed_from": 3, "updated": time.time(), "checkpoint_fallbacks": [skipped]}))
        Path(lease).write_text(LeaseInfo("exec-2", time.time(), time.time(), 60, 3).to_json())  # a takeover
        il.record_interruption(storage_for(str(out)), str(out), name="w/numbers", attempt=2, run_id="run-1",
                               cause="driver_lost", hosts=[], started=None, ended=time.time(),
                               message="closed by exec-2")

    record = dataclasses.replace(_record(out, "exec-1"), attempt=2)
    try:
        result = execute_step(fell_back_then_taken_over, WriteConfig(output_path=str(out), n=3),
                              sf.log_path(str(out), 2), {}, record)
    finally:
        leases.stop()
    assert result.outcome is Outcome.LEASE_LOST
    ledger = json.loads(ledger_file.read_text())
    entries = [(e["cause"], e["message"]) for e in ledger["interruptions"]]
    assert entries == [("driver_lost", "closed by exec-2")]
