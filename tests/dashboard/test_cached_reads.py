"""/alerts and /catalogue over a prefix do not touch every step's or every experiment's files per request.

Every storage call of the dashboard's store is counted (a proxy around its fsspec filesystem), with the cache
TTL at zero so that nothing is trusted by time alone: a second request reads no file that did not change
(the finished experiments' steps and verdicts cost nothing but the listings of experiments/), the running
experiment's steps are still checked, a person's verdict is picked up by reading that one file, and a
rewritten manifest makes its steps' alerts be read again.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from marin.status import verdicts
from marin.storage import storage_for
from moe_trainer.watch import DropRate, RunFacts, WatchConfig, Watcher
from tests.fakes.synthetic_prefix import write_prefix

FACTS = RunFacts(num_steps=100, update_window=16, skip_nonfinite=True, max_grad_norm=1.0)
COUNTED = ("info", "open", "cat_file", "ls", "find", "exists")


class CountingFS:
    """Forwards to a filesystem and records (method, path) of every storage call."""

    def __init__(self, fs: Any) -> None:
        self._fs, self.calls = fs, Counter[tuple[str, str]]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in COUNTED:
            return attr

        def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[(name, str(path))] += 1
            return attr(path, *args, **kwargs)
        return counted


@pytest.fixture()
def prefix(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Three experiments (the second still running), an active alert on a train step of the first, and a
    computed verdict for every experiment."""
    write_prefix(str(tmp_path), experiments=3, metrics_rows=5, groups=3)
    manifests = sorted((json.loads(p.read_text()) for p in (tmp_path / "experiments").glob("*.json")),
                       key=lambda m: m["created"])
    out = Path(next(s for s in manifests[0]["steps"] if "/train/" in s["name"])["output_path"])
    w = Watcher(WatchConfig(drop_rate=DropRate(pending_steps=1, resolve_steps=1)), str(out), FACTS)
    w.observe({"step": 1, "loss": 2.0, "grad_norm": 0.5, "drop_rate": 0.5, "update_filter_armed": True})
    for m in manifests:
        verdicts.record(storage_for(str(tmp_path)), str(tmp_path), m["id"], {
            "outcome": "worked", "note": "", "by": "marin", "source": verdicts.COMPUTED, "at": time.time(),
            "criteria": [], "infra": [], "notebook_sha256": None})
    return tmp_path, manifests


@pytest.fixture()
def client(prefix: tuple[Path, list[dict[str, Any]]]) -> Iterator[tuple[TestClient, CountingFS]]:
    app = create_app(str(prefix[0]), cache_ttl=0)
    with TestClient(app) as c:
        store = app.state.dash.store
        counting = CountingFS(store.fs)
        store.fs = counting
        yield c, counting


def _touched(calls: Counter[tuple[str, str]], roots: list[str]) -> list[tuple[str, str]]:
    return [c for c in calls if any(c[1].startswith(r.rstrip("/") + "/") or c[1] == r for r in roots)]


def _step_roots(manifest: dict[str, Any]) -> list[str]:
    return [os.path.realpath(s["output_path"]) for s in manifest["steps"]]


def test_a_second_request_reads_no_unchanged_file(client: tuple[TestClient, CountingFS],
                                                  prefix: tuple[Path, list[dict[str, Any]]]) -> None:
    c, fs = client
    root, manifests = prefix
    first = (c.get("/api/alerts").json(), c.get("/api/catalogue").json())
    assert [a["rule"] for a in first[0]["active"]] == ["drop_rate"] and first[1]["counts"]["worked"] == 3
    fs.calls.clear()
    second = (c.get("/api/alerts").json(), c.get("/api/catalogue").json())
    assert second == first
    finished = _step_roots(manifests[0]) + _step_roots(manifests[2])
    assert _touched(fs.calls, finished) == []  # not one stat or read of a finished experiment's steps
    verdict_files = [os.path.realpath(verdicts.verdicts_path(str(root), m["id"])) for m in manifests]
    assert _touched(fs.calls, verdict_files) == []
    assert _touched(fs.calls, _step_roots(manifests[1]))  # the running experiment is still checked
    assert ("find", os.path.realpath(root / "experiments")) in fs.calls  # one listing instead
    # a person's verdict changes one file: the next request reads that file and no other verdict
    verdicts.record(storage_for(str(root)), str(root), manifests[2]["id"], {
        "outcome": "did_not_work", "note": "seed noise", "by": "alice", "source": verdicts.PERSON,
        "at": time.time(), "criteria": [], "infra": [], "notebook_sha256": None})
    fs.calls.clear()
    by_id = {r["experiment"]: r for r in c.get("/api/catalogue").json()["experiments"]}
    assert by_id[manifests[2]["id"]]["outcome"] == "did_not_work"
    opened = {p for (method, p) in fs.calls if method == "open"}
    assert opened & set(verdict_files) == {verdict_files[2]}


Prefix = tuple[Path, list[dict[str, Any]]]


def test_a_rewritten_manifest_makes_its_steps_be_read_again(client: tuple[TestClient, CountingFS],
                                                            prefix: Prefix) -> None:
    c, fs = client
    root, manifests = prefix
    assert len(c.get("/api/alerts").json()["active"]) == 1
    out = Path(next(s for s in manifests[0]["steps"] if "/train/" in s["name"])["output_path"])
    w = Watcher(WatchConfig(), str(out), FACTS)  # a new attempt resolves what the last one left open
    w.close()
    path = root / "experiments" / f"{manifests[0]['id']}.json"
    os.utime(path, (time.time() + 5, time.time() + 5))  # the run's end rewrites its manifest
    fs.calls.clear()
    assert c.get("/api/alerts").json()["active"] == []
    assert _touched(fs.calls, [os.path.realpath(out)])
    assert _touched(fs.calls, _step_roots(manifests[2])) == []


def test_the_local_listing_is_fsspecs_and_names_need_no_stat(tmp_path: Path) -> None:
    """PrefixStore lists a local directory with one scandir (store._local_ls) instead of fsspec's ls, and
    gives names alone without a stat per entry (store.names, what a step's versions are found with): the
    entries are the ones fsspec gives, key for key, links and dangling links included."""
    import fsspec

    from marin.dashboard.store import PrefixStore, _local_ls

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "file.json").write_text("{}")
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "link").symlink_to(tmp_path / "d" / "file.json")
    (tmp_path / "d" / "dangling").symlink_to(tmp_path / "nowhere")
    expected = sorted(fsspec.filesystem("file").ls(str(tmp_path / "d"), detail=True), key=lambda i: i["name"])
    assert sorted(_local_ls(str(tmp_path / "d")), key=lambda i: i["name"]) == expected
    store = PrefixStore(str(tmp_path), ttl=0)
    assert [e["name"] for e in store.ls("d")] == store.names("d") == ["dangling", "file.json", "link", "sub"]
    assert [e["type"] for e in store.ls("d")] == ["other", "file", "other", "directory"]
    assert store.ls("nothing") == [] and store.names("nothing") == [] and store.names("d/file.json") == []


def test_read_json_many_is_as_fresh_as_read_json(tmp_path: Path) -> None:
    """`PrefixStore.read_json_many` (issue 35's batched page reads) on an object-store-like filesystem: absent
    files are None, a damaged one is its CorruptFileError naming the path, a change is seen once the ttl has
    passed, and an unchanged file keeps its parsed object (views cached on it stay valid)."""
    import fsspec

    from marin.dashboard.store import PrefixStore
    from marin.errors import CorruptFileError

    mem = fsspec.filesystem("memory")
    root = f"/loop-many-{os.getpid()}-{time.monotonic_ns()}"
    for i in range(10):
        mem.pipe_file(f"{root}/fan/s{i}/.marin/status.json", json.dumps({"status": "SUCCESS"}).encode())
    mem.pipe_file(f"{root}/fan/s3/.marin/status.json", b"{not json")
    mem.pipe_file(f"{root}/alone/x/.marin/status.json", json.dumps({"status": "RUNNING"}).encode())
    store = PrefixStore(f"memory://{root}", ttl=60)
    rels = [f"fan/s{i}/.marin/status.json" for i in range(12)] + ["alone/x/.marin/status.json"]
    parents = ["fan"] * 12 + ["alone"]
    first = store.read_json_many(rels, parents)
    assert first["fan/s0/.marin/status.json"] == {"status": "SUCCESS"}
    assert first["fan/s10/.marin/status.json"] is None and first["fan/s11/.marin/status.json"] is None
    assert isinstance(first["fan/s3/.marin/status.json"], CorruptFileError)
    assert "fan/s3/.marin/status.json" in str(first["fan/s3/.marin/status.json"])
    assert first["alone/x/.marin/status.json"] == {"status": "RUNNING"}
    # the same answers read_json gives
    assert store.read_json("fan/s0/.marin/status.json") is first["fan/s0/.marin/status.json"]
    mem.pipe_file(f"{root}/fan/s1/.marin/status.json", json.dumps({"status": "FAILED"}).encode())
    mem.pipe_file(f"{root}/alone/x/.marin/status.json", json.dumps({"status": "SUCCESS"}).encode())
    store.ttl = 0  # the ttl has passed: every file is checked again
    again = store.read_json_many(rels, parents)
    assert again["fan/s1/.marin/status.json"] == {"status": "FAILED"}
    assert again["alone/x/.marin/status.json"] == {"status": "SUCCESS"}
    assert again["fan/s0/.marin/status.json"] is first["fan/s0/.marin/status.json"]
    assert isinstance(again["fan/s3/.marin/status.json"], CorruptFileError)


def test_a_file_read_without_its_listing_info_is_not_served_once_deleted() -> None:
    """Review of issue 35: a body fetched without listing info was cached under the absent file's signature,
    so once the file was deleted every later read matched it and served the old value, forever."""
    import uuid

    import fsspec

    from marin.dashboard.store import PrefixStore

    fs = fsspec.filesystem("memory")
    root = f"/stale-{uuid.uuid4().hex[:8]}"
    fs.pipe(f"{root}/experiments/e1/verdicts.json", b'{"outcome": "worked"}')
    store = PrefixStore(f"memory://{root}", ttl=0.05)
    assert store.read_json_fetched("experiments/e1/verdicts.json") == {"outcome": "worked"}
    fs.rm(f"{root}/experiments/e1/verdicts.json")
    time.sleep(0.1)
    assert store.read_json("experiments/e1/verdicts.json") is None
    time.sleep(0.1)
    assert store.read_json_fetched("experiments/e1/verdicts.json") is None
    fs.pipe(f"{root}/experiments/e1/verdicts.json", b'{"outcome": "did_not_work"}')
    time.sleep(0.1)
    assert store.read_json("experiments/e1/verdicts.json") == {"outcome": "did_not_work"}
