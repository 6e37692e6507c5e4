"""GCS leases against fake-gcs-server on loopback, a GCS emulator that enforces `ifGenerationMatch` on writes
(the gcp-storage-emulator used in test_object_stores.py ignores preconditions): executors racing to create one
lease, or to take over one stale lease, have exactly one winner, and concurrent runs of one experiment all
land in its manifest. fake-gcs-server does not enforce preconditions on deletes, so the conditional release is
not exercised here (it is on S3, against moto)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from marin.status.manifest import end_run, manifest_path, start_run
from marin.storage.fs import storage_for
from marin.storage.lease import LeaseInfo, LeaseManager

RACERS = 8


@pytest.fixture(scope="module")
def gcs_bucket(fake_gcs_bucket: str) -> str:
    return fake_gcs_bucket  # fake-gcs-server on loopback (tests/marin/conftest.py)


def _race(action: Callable[[int], Any]) -> list[Any]:
    barrier = threading.Barrier(RACERS)
    results: list[Any] = [None] * RACERS

    def go(i: int) -> None:
        barrier.wait()
        results[i] = action(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_the_emulator_enforces_generation_preconditions(gcs_bucket: str) -> None:
    """Without this the races below would prove nothing."""
    storage = storage_for(gcs_bucket)
    path = f"{gcs_bucket}/check/lease.json"
    assert storage.create_exclusive(path, "one")
    assert not storage.create_exclusive(path, "two")
    current = storage.read_versioned(path)
    assert current is not None and isinstance(current.token, int) and current.text == "one"
    assert storage.replace_if(path, "three", current.token)
    assert not storage.replace_if(path, "four", current.token)  # the generation moved on
    assert storage.read_text(path) == "three"
    fresh = storage.read_versioned(path)
    assert fresh is not None and fresh.text == "three" and isinstance(fresh.token,
                                                                      int) and fresh.token != current.token
    assert storage.delete_if(path, fresh.token) and storage.read_versioned(path) is None


def test_executors_racing_for_one_gcs_lease_have_exactly_one_winner(gcs_bucket: str) -> None:
    storage = storage_for(gcs_bucket)
    path = f"{gcs_bucket}/race/step-0123abcd/.marin/lease.json"
    managers = [LeaseManager(storage, f"executor-{i}", 60) for i in range(RACERS)]
    try:
        got = _race(lambda i: managers[i].try_acquire(path, attempt=1))
        winners = [i for i, a in enumerate(got) if a.ok]
        assert len(winners) == 1, got
        lease = LeaseInfo.parse(storage.read_text(path) or "")
        assert lease is not None and lease.owner == f"executor-{winners[0]}"
        assert all(a.holder is not None and a.holder.owner == lease.owner for a in got if not a.ok)
    finally:
        for m in managers:
            m.stop()


def test_executors_racing_to_take_over_one_stale_gcs_lease_have_exactly_one_winner(gcs_bucket: str) -> None:
    storage = storage_for(gcs_bucket)
    path = f"{gcs_bucket}/race/stale-0123abcd/.marin/lease.json"
    long_ago = time.time() - 3600
    assert storage.create_exclusive(path, LeaseInfo("crashed-executor", long_ago, long_ago, 60, 1).to_json())
    managers = [LeaseManager(storage, f"executor-{i}", 60) for i in range(RACERS)]
    try:
        got = _race(lambda i: managers[i].try_acquire(path, attempt=2))
        winners = [i for i, a in enumerate(got) if a.ok]
        assert len(winners) == 1, got
        assert got[winners[0]].previous_owner == "crashed-executor"
        lease = LeaseInfo.parse(storage.read_text(path) or "")
        assert lease is not None and lease.owner == f"executor-{winners[0]}"
    finally:
        for m in managers:
            m.stop()


def test_runs_of_one_experiment_started_at_once_on_gcs_all_land_in_its_manifest(gcs_bucket: str) -> None:
    storage = storage_for(gcs_bucket)

    def run(i: int) -> None:
        start_run(storage, gcs_bucket, "exp1_demo-0123abcd", script="experiments/exp1_demo.py",
                  description="",
                  issue=None, provenance={}, steps=[], run_id=f"run-{i}", args=[])
        end_run(storage, gcs_bucket, "exp1_demo-0123abcd", f"run-{i}", "SUCCESS", [])

    _race(run)
    text = storage.read_text(manifest_path(gcs_bucket, "exp1_demo-0123abcd"))
    assert text is not None
    assert {r["run_id"]: r["status"] for r in json.loads(text)["runs"]} == {f"run-{i}": "SUCCESS"
                                                                            for i in range(RACERS)}


def test_a_gcs_object_rewritten_between_its_metadata_and_body_is_read_again() -> None:
    from google.api_core import exceptions as gexc

    from marin.storage.gcs import gcs_get_versioned as _gcs_get_versioned

    class Blob:
        """Generation 1 when first asked, but rewritten (generation 2) before its body is downloaded."""

        name = "b/lease.json"

        def __init__(self) -> None:
            self.generation: int | None = None
            self.reloads = 0

        def reload(self) -> None:
            self.reloads += 1
            self.generation = self.reloads

        def download_as_bytes(self, if_generation_match: int) -> bytes:
            if if_generation_match != 2:
                raise gexc.PreconditionFailed("generation moved on")
            return b"second"

    blob = Blob()
    has_generations, found = _gcs_get_versioned(blob)
    assert has_generations and found is not None and (found.text, found.token) == ("second", 2)
    assert blob.reloads == 2
