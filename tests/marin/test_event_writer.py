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
