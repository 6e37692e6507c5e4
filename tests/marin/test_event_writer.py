"""A worker's event appends without a read-back (status/files.py `EventWriter`), against real object stores on
loopback (moto for s3://, fake-gcs-server for gs://, both enforce the preconditions it relies on) and local
disk: the lines land in order, and a line another writer appended in between is never lost."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from marin.status import files as sf
from marin.storage.fs import storage_for


@pytest.fixture(params=["s3", "gs", "local"])
def out(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "step")
    bucket = request.getfixturevalue("s3_bucket" if request.param == "s3" else "fake_gcs_bucket")
    return f"{bucket}/events-{uuid.uuid4().hex[:8]}/step"


@pytest.fixture(params=["s3", "gs"])
def remote_out(request: pytest.FixtureRequest) -> str:
    bucket = request.getfixturevalue("s3_bucket" if request.param == "s3" else "fake_gcs_bucket")
    return f"{bucket}/events-{uuid.uuid4().hex[:8]}/step"


def _events(out: str) -> list[tuple[str, int]]:
    return [(e["event"], e["attempt"]) for e in sf.read_events(storage_for(out), out)]


def _append(writer: sf.EventWriter, event: str, attempt: int = 1) -> None:
    writer.append(event, attempt=attempt, run_id="r", executor="x")


def test_a_fresh_steps_two_appends_land_in_order_without_a_read_back(out: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_for(out)
    storage.makedirs(sf.meta_dir(out))
    writer = sf.EventWriter(storage, out, fresh=True)
    if not storage.is_local:  # the object stores' read-and-rewrite is never needed here
        def no_read_back(path: str, text: str) -> None:
            raise AssertionError(f"read back {path} before appending")

        monkeypatch.setattr(storage, "append_text", no_read_back)
        monkeypatch.setattr(storage, "read_text", lambda path: no_read_back(path, ""))
    _append(writer, sf.RUNNING)
    _append(writer, sf.SUCCESS)
    monkeypatch.undo()
    assert _events(out) == [("RUNNING", 1), ("SUCCESS", 1)]
    line = json.loads((storage.read_text(sf.events_path(out)) or "").splitlines()[0])
    assert set(line) == {"ts", "event", "attempt", "run_id", "executor", "message"}


def test_a_line_another_writer_appended_in_between_is_kept(out: str) -> None:
    storage = storage_for(out)
    storage.makedirs(sf.meta_dir(out))
    writer = sf.EventWriter(storage, out, fresh=True)
    _append(writer, sf.RUNNING)
    sf.append_event(storage, out, sf.LEASE_TAKEOVER, attempt=1, run_id="other", executor="y")
    _append(writer, sf.SUCCESS)
    assert _events(out) == [("RUNNING", 1), ("LEASE_TAKEOVER", 1), ("SUCCESS", 1)]


def test_a_fresh_writer_finding_events_already_there_appends_to_them(out: str) -> None:
    storage = storage_for(out)
    storage.makedirs(sf.meta_dir(out))
    sf.append_event(storage, out, sf.PREEMPTED, attempt=3, run_id="old", executor="y")
    writer = sf.EventWriter(storage, out, fresh=True)
    _append(writer, sf.RUNNING, 4)
    _append(writer, sf.SUCCESS, 4)
    assert _events(out) == [("PREEMPTED", 3), ("RUNNING", 4), ("SUCCESS", 4)]


def test_a_conditional_write_whose_answer_was_lost_is_not_written_twice(
        remote_out: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client library retries a conditional write whose answer was lost; the retry is refused (the first
    request had landed). The writer must not add the line again (review of issue 35: it did)."""
    storage = storage_for(remote_out)
    storage.makedirs(sf.meta_dir(remote_out))
    create, replace = storage.create_versioned, storage.replace_if

    def create_answer_lost(path: str, text: str) -> tuple[bool, object]:
        assert create(path, text)[0]
        return False, None  # what the retry of a landed create-if-absent answers

    def replace_answer_lost(path: str, text: str, token: object) -> bool:
        assert replace(path, text, token)
        return False

    monkeypatch.setattr(storage, "create_versioned", create_answer_lost)
    writer = sf.EventWriter(storage, remote_out, fresh=True)
    _append(writer, sf.RUNNING)
    monkeypatch.setattr(storage, "create_versioned", create)
    monkeypatch.setattr(storage, "replace_if", replace_answer_lost)
    found = storage.read_versioned(sf.events_path(remote_out))
    assert found is not None
    writer._known = (found.text, found.token)  # as if its create had been answered
    _append(writer, sf.SUCCESS)
    assert _events(remote_out) == [("RUNNING", 1), ("SUCCESS", 1)]


def test_a_line_appended_between_the_fallbacks_read_and_its_rewrite_is_kept(
        remote_out: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback rewrites only the version it read: another writer's line that lands in between makes it
    read again, never overwrite (review of issue 35: the fallback was an unconditional rewrite)."""
    storage = storage_for(remote_out)
    storage.makedirs(sf.meta_dir(remote_out))
    sf.append_event(storage, remote_out, sf.PREEMPTED, attempt=1, run_id="old", executor="y")
    read = storage.read_versioned
    raced: list[bool] = []

    def read_then_someone_appends(path: str) -> object:
        found = read(path)
        if not raced:
            raced.append(True)
            sf.append_event(storage, remote_out, sf.LEASE_TAKEOVER, attempt=1, run_id="other", executor="y")
        return found

    monkeypatch.setattr(storage, "read_versioned", read_then_someone_appends)
    writer = sf.EventWriter(storage, remote_out, fresh=True)  # the create is refused: events exist
    _append(writer, sf.RUNNING, 2)
    assert raced
    assert _events(remote_out) == [("PREEMPTED", 1), ("LEASE_TAKEOVER", 1), ("RUNNING", 2)]
