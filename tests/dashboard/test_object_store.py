"""The dashboard on s3:// and gs:// prefixes, against moto's S3 server and fake-gcs-server on loopback.

Object stores have no directories, no mtimes that fsspec reports the same way and no symlinks: the signature
cache keys on ETag/LastModified there, and step paths fall back to `{name}-{hash8}` when a manifest names
output paths of another location. Run inside the private network namespace (scripts/netns).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from tests.fakes.synthetic_prefix import write_prefix


def test_s3_prefix(moto_endpoint: str, tmp_path: Path) -> None:
    import s3fs

    write_prefix(str(tmp_path), experiments=1, metrics_rows=30)  # few files: PUTs cost ~10 ms each
    opts = {"endpoint_url": moto_endpoint, "key": "test", "secret": "test"}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("dash-bucket")
    fs.put(str(tmp_path) + "/", "dash-bucket/prefix/", recursive=True)
    _check(fs, "s3://dash-bucket/prefix", "dash-bucket/prefix", opts)


def test_gcs_prefix(fake_gcs_bucket: str, tmp_path: Path) -> None:
    import gcsfs

    write_prefix(str(tmp_path), experiments=1, metrics_rows=30)
    # fake-gcs-server (Go): gcp-storage-emulator stalled this test ~2 minutes on uploads in the full suite
    opts: dict[str, Any] = {"token": "anon", "skip_instance_cache": True}  # its endpoint: the fsspec config
    fs = gcsfs.GCSFileSystem(**opts)
    root = fake_gcs_bucket.removeprefix("gs://") + "/dash/prefix"
    fs.put(str(tmp_path) + "/", root + "/", recursive=True)
    _check(fs, f"gs://{root}", root, opts)


def _check(fs: Any, url: str, root: str, opts: dict[str, Any]) -> None:
    app = create_app(url, cache_ttl=0, storage_options=opts)
    with TestClient(app) as c:
        listing = c.get("/api/experiments", params={"limit": 500}).json()
        assert listing["total"] == 1 and not listing["problems"]
        failed = next(e for e in listing["items"] if e["state"] == "FAILED")
        d = c.get(f"/api/experiments/{failed['id']}").json()
        assert d["step_counts"] == {"SUCCESS": 17, "FAILED": 1, "DEP_FAILED": 2}
        bad = next(s for s in d["steps"] if s["status"] == "FAILED")
        step = c.get(f"/api/steps/{bad['path']}").json()
        assert step["status"]["error"]["type"] == "FloatingPointError" and step["attempts"][0]["log_size"] > 0
        assert "line 39" in c.get(f"/api/logs/{bad['path']}", params={"max_bytes": 100}).json()["text"]
        train = next(s for s in d["steps"] if s["name"].endswith("train/model1"))
        assert c.get(f"/api/metrics/{train['path']}").json()["rows"] == 30
        names = {e["name"] for e in c.get(f"/api/files/{train['path']}").json()["entries"]}
        assert {".marin", "metrics.jsonl", "wandb.json"} <= names
        assert c.get(f"/raw/{train['path']}/wandb.json").json()["mode"] == "offline"
        # a status change on the object store is seen (ETag/LastModified signature)
        key = f"{root}/{bad['path']}/.marin/status.json"
        status = json.loads(fs.cat_file(key))
        status["status"] = "SUCCESS"
        fs.pipe_file(key, json.dumps(status).encode())
        fs.invalidate_cache()
        again = c.get(f"/api/experiments/{failed['id']}").json()
        assert again["step_counts"]["SUCCESS"] == 18
        assert c.get("/api/files/%2e%2e/other-bucket").status_code == 400


_IO = {"info", "exists", "isfile", "isdir", "size", "open", "cat", "cat_file", "head", "ls", "find", "glob",
       "read_bytes", "read_text", "read_many", "list_files", "list_many", "file_info"}


class _Counting:
    """A filesystem or Storage that records each storage call (name, first argument) and passes it on."""

    def __init__(self, inner: Any, calls: list[tuple[str, Any]]) -> None:
        self._inner, self._calls = inner, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _IO:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((name, args[0] if args else None))
            return attr(*args, **kwargs)

        return counted


def _mark_failed(client: TestClient, fs: Any, root: str, experiment_id: str, name: str) -> None:
    """Rewrite the status.json of the experiment's step `name` on the store as FAILED."""
    steps = client.get(f"/api/experiments/{experiment_id}").json()["steps"]
    step = next(s for s in steps if s["name"] == name)
    key = f"{root}/{step['path']}/.marin/status.json"
    status = json.loads(fs.cat_file(key))
    status["status"] = "FAILED"
    fs.pipe_file(key, json.dumps(status).encode())


def test_experiment_page_reads_step_files_in_batches(moto_endpoint: str, tmp_path: Path) -> None:
    """Issue 35: an experiment page reads its steps' files in batches: every status.json in one concurrent
    read, the result records (train_result/eval/choices.json) known absent from one listing of the parent
    holding the steps; a later load lists that parent and reads only what changed, never a call per step
    (before: a HEAD of each status.json, and three probes per step on the first load). What changed on the
    store is on the page at once: no cache serves stale status."""
    import s3fs

    from marin import ExecutorMainConfig, run_experiment
    from tests.marin.test_plan_batching import _fan_out

    result = run_experiment(_fan_out(12), ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"),
                            verbose=False, script="tests/dashboard_batching.py")
    assert result.status == "SUCCESS"
    opts = {"endpoint_url": moto_endpoint, "key": "test", "secret": "test"}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("batch-bucket")
    fs.put(str(tmp_path / "p") + "/", "batch-bucket/prefix/", recursive=True)
    app = create_app("s3://batch-bucket/prefix", cache_ttl=0, storage_options=opts)  # every load revalidates
    calls: list[tuple[str, Any]] = []
    store = app.state.dash.store
    store._storage = _Counting(store.storage, calls)  # the Storage over the real filesystem
    store.fs = _Counting(store.fs, calls)

    def batches() -> list[int]:
        return [len(arg) for name, arg in calls if name == "read_many"]

    def per_step() -> list[tuple[str, Any]]:  # a single call inside a step's directory (fan/NAME-HASH/...)
        return [(n, a) for n, a in calls if n != "read_many" and "/fan/" in str(a)]

    page = f"/experiments/{result.experiment_id}"
    with TestClient(app) as c:
        first = c.get(page)
        assert first.status_code == 200 and first.text.count("SUCCESS") >= 13
        assert batches() == [13] and per_step() == []  # 13 status.json in one batch; nothing per step
        assert ("find", "batch-bucket/prefix/fan") in calls
        calls.clear()
        again = c.get(page)
        assert again.text == first.text
        # nothing changed: the parent fan/ listed again, no read and no stat of a step's file
        assert batches() == [] and per_step() == [] and ("find", "batch-bucket/prefix/fan") in calls
        _mark_failed(c, fs, "batch-bucket/prefix", result.experiment_id, "fan/s3")
        calls.clear()
        changed = c.get(page)
        assert batches() == [1] and per_step() == []  # only the changed status.json is read
        assert changed.text.count("FAILED") > first.text.count("FAILED")
        detail = c.get(f"/api/experiments/{result.experiment_id}").json()
        assert detail["step_counts"] == {"SUCCESS": 12, "FAILED": 1}


def test_a_later_load_costs_one_listing_of_the_parent_and_one_get_of_the_verdicts(moto_endpoint: str,
                                                                                   tmp_path: Path) -> None:
    """A later load of an experiment page lists the steps' parent once (no delimited listing of its names
    first: its last listing says how many entries it has) and reads the experiment's absent verdicts.json
    with a GET (a stat of an absent object is a metadata request and a directory listing)."""
    import s3fs

    from marin import ExecutorMainConfig, run_experiment
    from tests.marin.test_plan_batching import _fan_out

    result = run_experiment(_fan_out(12), ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"),
                            verbose=False, script="tests/dashboard_later_load.py")
    opts = {"endpoint_url": moto_endpoint, "key": "test", "secret": "test"}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("later-bucket")
    fs.put(str(tmp_path / "p") + "/", "later-bucket/prefix/", recursive=True)
    app = create_app("s3://later-bucket/prefix", cache_ttl=0, storage_options=opts)  # every load revalidates
    calls: list[tuple[str, Any]] = []
    store = app.state.dash.store
    store._storage = _Counting(store.storage, calls)
    store.fs = _Counting(store.fs, calls)
    verdicts = f"later-bucket/prefix/experiments/{result.experiment_id}/verdicts.json"
    page = f"/experiments/{result.experiment_id}"
    with TestClient(app) as c:
        first = c.get(page)
        assert first.status_code == 200
        calls.clear()
        assert c.get(page).text == first.text
        assert [(n, a) for n, a in calls if str(a).rstrip("/").endswith("prefix/fan")] == [
            ("find", "later-bucket/prefix/fan")]
        read = [n for n, a in calls if str(a).endswith("verdicts.json")]
        assert read and set(read) == {"read_bytes"}  # GETs only (each view's, with a ttl of 0): no stat
        assert store.read_json_fetched(f"experiments/{result.experiment_id}/verdicts.json") is None
        assert not fs.exists(verdicts)


def test_prefix_groups_cover_every_name_within_the_bound() -> None:
    from marin.dashboard.store import prefix_groups

    names = ["root-0a1b2c3d"] + [f"s{i}-{i * 7919 % 65536:08x}" for i in range(1, 1000)]
    groups = prefix_groups(names, 16)
    assert len(groups) <= 16 and groups == ["r", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"]
    assert all(any(n.startswith(g) for g in groups) for n in names)
    # a name that is itself a prefix of others keeps its group whole; one name or none: the whole directory
    assert prefix_groups(["logs", "logs-old", "logs2"], 16) == ["logs"]
    assert prefix_groups(["a-1", "b-2"], 1) == [""] and prefix_groups([], 16) == [""]


def test_a_large_parent_is_listed_in_concurrent_groups(moto_endpoint: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a parent with more entries than SPLIT_LISTING is listed as a few concurrent listings of the
    entries sharing a name prefix (their pages no longer one after another); the listing is the same as one
    recursive listing, and a change on the store is on the next load past the ttl."""
    import s3fs

    from marin import ExecutorMainConfig, run_experiment
    from marin.dashboard import store as store_module
    from tests.marin.test_plan_batching import _fan_out

    result = run_experiment(_fan_out(12), ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"),
                            verbose=False, script="tests/dashboard_split.py")
    opts = {"endpoint_url": moto_endpoint, "key": "test", "secret": "test"}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("split-bucket")
    fs.put(str(tmp_path / "p") + "/", "split-bucket/prefix/", recursive=True)
    whole = create_app("s3://split-bucket/prefix", cache_ttl=0, storage_options=opts)
    expected = whole.state.dash.store.listing("fan")
    monkeypatch.setattr(store_module, "SPLIT_LISTING", 4)  # fan/ holds 13 step directories
    app = create_app("s3://split-bucket/prefix", cache_ttl=0, storage_options=opts)
    store = app.state.dash.store
    finds: list[dict[str, Any]] = []
    real_find = store.fs.find

    def find(path: str, **kwargs: Any) -> Any:
        finds.append(kwargs)
        return real_find(path, **kwargs)

    monkeypatch.setattr(store.fs, "find", find)
    assert store.listing("fan") == expected and len(expected) > 13
    assert len(finds) > 1 and all(k.get("prefix") for k in finds)  # several listings, by name prefix
    page = f"/experiments/{result.experiment_id}"
    with TestClient(app) as c, TestClient(whole) as w:
        assert c.get(page).text == w.get(page).text
        _mark_failed(c, fs, "split-bucket/prefix", result.experiment_id, "fan/s3")
        detail = c.get(f"/api/experiments/{result.experiment_id}").json()
        assert detail["step_counts"] == {"SUCCESS": 12, "FAILED": 1}


def test_member_glob_escapes_the_literal_parts() -> None:
    from marin.storage.gcs import member_glob

    assert member_glob("run/b/", {".marin/status.json"}) == "run/b/*/.marin/status.json"
    assert member_glob("r[1]/{x}*/", {"eval.json", "a,b.json"}) == r"r\[1\]/\{x\}\*/*/{a\,b.json,eval.json}"


def test_a_listing_page_is_filtered_as_it_is_parsed_with_the_collector_paused() -> None:
    """`parse_page` keeps the items whose name is wanted (the keys `fields` asks for: an emulator that ignores
    `fields` answers ACLs too) and the next page's token, with the cyclic garbage
    collector paused only while it parses (and left as it was: disabled stays disabled); an answer that is
    not a JSON object is refused, naming what came back."""
    import gc

    from marin.storage.gcs import parse_page

    names_seen: list[bool] = []

    def keep(name: str) -> bool:
        names_seen.append(gc.isenabled())
        return name.endswith("/status.json")

    page = {"kind": "storage#objects", "nextPageToken": "run/b/s2",
            "items": [{"name": "run/b/s1/.marin/status.json", "size": "3", "acl": [{"role": "OWNER"}]},
                      {"name": "run/b/s1/.marin/events.jsonl", "size": "9"}, {"size": "1"}]}
    assert gc.isenabled()
    items, token = parse_page(json.dumps(page).encode(), keep)
    assert items == [{"name": "run/b/s1/.marin/status.json", "size": "3"}] and token == "run/b/s2"  # no acl
    assert names_seen == [False, False, False] and gc.isenabled()
    assert parse_page(b'{"kind": "storage#objects"}', keep) == ([], None)  # an empty listing
    gc.disable()
    try:
        parse_page(json.dumps(page).encode(), keep)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="JSON list, not an object"):
        parse_page(b"[]", keep)
    assert gc.isenabled()


def test_gcs_listing_of_wanted_files_and_a_later_load(fake_gcs_bucket: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: on gs:// the listing a batch read needs (each step's .marin/status.json) is read straight off
    objects.list with a matchGlob (`gcs_find`); fake-gcs-server ignores the glob and the answer is filtered
    here: the same files as gcsfs's find, with the same signatures. A store that refuses the glob is asked
    again without it. A later load (its three reads made at once, `read_ahead`) shows a status changed since
    the previous load, and a step new since the last listing, named unlike the groups that listing was split
    by, is listed too."""
    import gcsfs
    from fsspec.asyn import sync

    from marin import ExecutorMainConfig, run_experiment
    from marin.dashboard import store as store_module
    from marin.dashboard.read_ahead import read_ahead
    from marin.dashboard.store import signature
    from marin.storage.gcs import gcs_find
    from tests.marin.test_plan_batching import _fan_out

    result = run_experiment(_fan_out(12), ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"),
                            verbose=False, script="tests/dashboard_gcs_glob.py")
    opts: dict[str, Any] = {"token": "anon", "skip_instance_cache": True}
    fs = gcsfs.GCSFileSystem(**opts)
    root = fake_gcs_bucket.removeprefix("gs://") + "/glob/prefix"
    fs.put(str(tmp_path / "p") + "/", root + "/", recursive=True)
    tail = ".marin/status.json"
    expected = {k: v for k, v in fs.find(f"{root}/fan", detail=True).items() if k.endswith("/" + tail)}
    assert len(expected) == 13
    found = sync(fs.loop, gcs_find, fs, f"{root}/fan", "", {tail})
    assert found.keys() == expected.keys()
    assert all(signature(found[k]) == signature(expected[k]) for k in found)
    assert sync(fs.loop, gcs_find, fs, f"{root}/fan", "s1")  # a name prefix: fan/s1-..., fan/s10-...
    assert set(sync(fs.loop, gcs_find, fs, f"{root}/fan", "s1", {tail})) == {
        k for k in expected if k.split("/fan/")[1].startswith("s1")}

    real_call, globs = fs._call, []

    async def refusing(*args: Any, **kwargs: Any) -> Any:
        globs.append(kwargs.get("matchGlob"))
        if kwargs.get("matchGlob"):
            raise ValueError("Bad Request: invalid matchGlob")
        return await real_call(*args, **kwargs)

    monkeypatch.setattr(fs, "_call", refusing)
    assert sync(fs.loop, gcs_find, fs, f"{root}/fan", "", {tail}).keys() == expected.keys()
    assert globs == [root.split("/", 1)[1] + "/fan/*/.marin/status.json", None]
    monkeypatch.setattr(fs, "_call", real_call)

    monkeypatch.setattr(store_module, "SPLIT_LISTING", 4)  # fan/ holds 13 step directories: split
    app = create_app(f"gs://{root}", cache_ttl=0, storage_options=opts)  # every load revalidates
    api = f"/api/experiments/{result.experiment_id}"
    with TestClient(app) as c:
        assert c.get(f"/experiments/{result.experiment_id}").status_code == 200
        assert c.get(api).json()["step_counts"] == {"SUCCESS": 13}
        assert read_ahead(app.state.dash, result.experiment_id) == 3
        assert read_ahead(app.state.dash, "no-such-experiment") == 0
        _mark_failed(c, fs, root, result.experiment_id, "fan/s3")
        assert c.get(api).json()["step_counts"] == {"SUCCESS": 12, "FAILED": 1}
        fs.pipe_file(f"{root}/fan/zz-new/.marin/status.json", b'{"status": "SUCCESS"}')
        assert "fan/zz-new/.marin/status.json" in app.state.dash.store.listing("fan", {tail})
