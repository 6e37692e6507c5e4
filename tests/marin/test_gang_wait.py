"""A gang waiting for hosts, without a cluster: the text, the WAITING record written only under the
executor's lease, and the driver's poller reporting each change once (gang_wait.py). The same on a real
3-node cluster with a node SIGKILLed: tests/marin/test_gang.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from marin.execution import gang_wait
from marin.execution.attempt import StepRecord
from marin.status import files as sf
from marin.storage import LocalStorage
from marin.storage.lease import LeaseInfo


def test_the_text_says_what_the_gang_needs_and_how_many_nodes_could_take_a_member() -> None:
    free = [{"CPU": 1.0, "gang_slot": 1.0}, {"CPU": 0.0, "gang_slot": 1.0}, {"CPU": 4.0}]
    assert gang_wait.waiting_text(2, {"CPU": 1.0}, free) == "waiting for 2 hosts with 1 CPU each; 2 available"
    assert gang_wait.waiting_text(3, {"gang_slot": 1.0}, free) == (
        "waiting for 3 hosts with 1 gang_slot each; 2 available")


def _record(out: Path, lease_acquired: float) -> StepRecord:
    return StepRecord(output_path=str(out), name="g/x", hash="h" * 64, attempt=2, run_id="run",
                      executor="me:1:abc", created=10.0, lease_acquired=lease_acquired)


def test_the_waiting_status_is_written_only_under_the_executors_lease(tmp_path: Path) -> None:
    out = tmp_path / "g/x-12345678"
    storage = LocalStorage()
    storage.write_text(sf.lease_path(str(out)), LeaseInfo("me:1:abc", 5.0, time.time(), 60, 2).to_json())
    assert gang_wait.record_waiting(_record(out, 5.0), "waiting for 2 hosts with 1 CPU each; 1 available")
    status = json.loads((out / ".marin/status.json").read_text())
    assert (status["status"], status["attempt"], status["created"]) == ("WAITING", 2, 10.0)
    assert status["waiting"] == "waiting for 2 hosts with 1 CPU each; 1 available"
    [event] = sf.read_events(storage, str(out))
    assert event["event"] == "WAITING" and event["waiting"] == status["waiting"]
    storage.write_text(sf.lease_path(str(out)), LeaseInfo("other:2:def", 6.0, time.time(), 60, 3).to_json())
    assert not gang_wait.record_waiting(_record(out, 5.0), "changed")  # the lease is another's: nothing
    assert json.loads((out / ".marin/status.json").read_text())["waiting"] == status["waiting"]
    assert len(sf.read_events(storage, str(out))) == 1


class _KV:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.values.get(key)


def test_the_driver_reports_each_change_of_a_gangs_waiting_state_once() -> None:
    kv = _KV()
    reports: list[tuple[str, int, str | None]] = []
    changed = threading.Event()

    def report(key: str, attempt: int, text: str | None) -> None:
        reports.append((key, attempt, text))
        changed.set()

    waits = gang_wait.GangWaits(lambda: kv, report, poll_s=0.05)
    try:
        waits.add("k", "g/x:12345678:attempt-2", 2)
        kv.values["waiting:g/x:12345678:attempt-2"] = "waiting for 2 hosts with 1 CPU each; 1 available"
        assert changed.wait(5)
        time.sleep(0.3)  # several polls: still one report
        assert reports == [("k", 2, "waiting for 2 hosts with 1 CPU each; 1 available")]
        changed.clear()
        del kv.values["waiting:g/x:12345678:attempt-2"]  # reserved
        assert changed.wait(5)
        assert reports[-1] == ("k", 2, None) and len(reports) == 2
    finally:
        waits.close()


class _Cluster:
    """What wait_for_hosts asks of Ray, replayed from a script of free resources per poll (the last poll's
    reservation succeeds)."""

    def __init__(self, polls: list[list[dict[str, float]]]) -> None:
        self.polls, self.waits = polls, 0

    def wait(self, refs: list[object], timeout: float) -> tuple[list[object], list[object]]:
        self.waits += 1
        return (refs, []) if self.waits > len(self.polls) else ([], refs)

    def get(self, ref: object) -> object:
        return ref


class _WritableKV(_KV):
    def __init__(self) -> None:
        super().__init__()
        self.history: list[str] = []

    def put(self, key: str, value: str) -> None:
        self.values[key] = value
        self.history.append(value)

    def del_(self, key: str) -> None:
        self.values.pop(key, None)


def test_a_wait_shows_each_shortfall_once_and_nothing_once_enough_hosts_are_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on a loaded 3-node cluster: after the replacement node joined, the next poll read '3 available'
    before the reservation completed and recorded it as one more WAITING event."""
    slot = {"gang_slot": 1.0}
    polls = [[slot, slot, slot], [slot, slot], [slot], [slot, slot], [slot, slot, slot]]
    cluster, kv = _Cluster(polls), _WritableKV()
    free = iter(polls)
    monkeypatch.setattr(gang_wait, "free_per_node", lambda ray: next(free))
    out = tmp_path / "g/x-12345678"
    storage = LocalStorage()
    storage.write_text(sf.lease_path(str(out)), LeaseInfo("me:1:abc", 5.0, time.time(), 60, 2).to_json())
    gang_wait.wait_for_hosts(cluster, "ready", 3, slot, lambda: _record(out, 5.0), "attempt-2", kv)
    texts = [f"waiting for 3 hosts with 1 gang_slot each; {n} available" for n in (2, 1, 2)]
    assert kv.history == texts and kv.values == {}  # withdrawn once reserved
    assert [e["waiting"] for e in sf.read_events(storage, str(out))] == texts
