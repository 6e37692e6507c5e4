"""The plan's storage traffic is batched (issue 35): planning N succeeded steps costs one listing per parent
directory plus one concurrent batch of status reads, one of output listings and one of step.json reads -
never a call per step. Counted through a wrapped store (no timings: benchmarks/cloud_latency.py times it
behind a latency proxy)."""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from marin.graph.dag import build_graph
from marin.graph.plan import make_plan
from marin.storage.listing import FileInfo
from marin.storage.local import LocalStorage
from tests.marin.fns import FsWriteConfig, SumConfig, WriteConfig, fs_write, sum_numbers, write_numbers


class CountingStorage(LocalStorage):
    """Local storage that counts each call by operation, and the paths each batch carried."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()
        self.batches: list[tuple[str, int]] = []

    def read_text(self, path: str) -> str | None:
        self.calls["read_text"] += 1
        return super().read_text(path)

    def read_bytes(self, path: str) -> bytes | None:
        self.calls["read_bytes"] += 1
        return super().read_bytes(path)

    def listdir(self, path: str) -> list[str] | None:
        self.calls["listdir"] += 1
        return super().listdir(path)

    def exists(self, path: str) -> bool:
        self.calls["exists"] += 1
        return super().exists(path)

    def list_files(self, path: str, limit: int | None = None) -> dict[str, FileInfo] | None:
        self.calls["list_files"] += 1
        return super().list_files(path, limit)

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        self.batches.append(("read_many", len(paths)))
        return [LocalStorage.read_bytes(self, p) for p in paths]

    def list_many(self, paths: Sequence[str]) -> list[dict[str, FileInfo] | None]:
        self.batches.append(("list_many", len(paths)))
        return [LocalStorage.list_files(self, p) for p in paths]


def _fan_out(n: int) -> list[Step]:
    root = Step(name="fan/root", fn=write_numbers, config=WriteConfig(output_path=this_output_path()))
    return [Step(name=f"fan/s{i}", fn=sum_numbers, config=SumConfig(
        input_path=output_path_of(root, "numbers.txt"), output_path=this_output_path())) for i in range(n)]


def test_planning_n_succeeded_steps_makes_one_listing_per_directory_and_one_batch_per_kind(
    tmp_path: Path,
) -> None:
    steps = _fan_out(12) + [Step(name="other/one", fn=write_numbers,
                                 config=WriteConfig(output_path=this_output_path(), n=3))]
    result = run_experiment(steps, ExecutorMainConfig(prefix=str(tmp_path), backend="local"), verbose=False,
                            script="tests/batching.py")
    assert result.status == "SUCCESS"
    storage = CountingStorage()
    plan = make_plan(build_graph(steps), str(tmp_path), storage)
    assert [e.action for e in plan.entries] == ["skip"] * 14
    # 14 steps in 2 directories (fan/, other/): 2 listings, and no per-step read, stat or listing
    assert storage.calls == {"listdir": 2}
    # status.json of all 14; the output listings in one batch of 2: fan/ (13 steps) listed whole, other/one
    # on its own; the step.json of the 13 reused ones (code drift, raw inputs under `warn`; fan/root is not
    # needed: every step that uses it succeeded)
    assert storage.batches == [("read_many", 14), ("list_many", 2), ("read_many", 13)]


def test_a_plan_that_finds_a_missing_output_still_reads_in_batches(tmp_path: Path) -> None:
    steps = _fan_out(8)  # with the root, 9 steps in fan/: listed whole (plan.WHOLE_PARENT_MIN)
    run_experiment(steps, ExecutorMainConfig(prefix=str(tmp_path), backend="local"), verbose=False,
                   script="tests/batching.py")
    graph = build_graph(steps)
    victim = graph.nodes[-1].output_path(str(tmp_path))
    Path(victim, "total.txt").unlink()
    storage = CountingStorage()
    plan = make_plan(graph, str(tmp_path), storage)
    entry = next(e for e in plan.entries if e.output_path == victim)
    assert entry.action == "run" and "1 file missing (total.txt)" in entry.reason
    assert storage.batches[:2] == [("read_many", 9), ("list_many", 1)]
    assert storage.calls["list_files"] == 0 and storage.calls["exists"] == 0


def _batch_round(prefix: str) -> None:
    from marin.storage.fs import storage_for

    storage = storage_for(prefix)
    names = [f"{prefix}/d{i}/f.json" for i in range(7)]
    for i, name in enumerate(names):
        storage.write_text(name, f'{{"i": {i}}}')
    storage.write_text(f"{prefix}/d0/sub/g.txt", "g")
    storage.fs.pipe_file(f"{prefix}/bad.json", b"\xff\xfe")  # type: ignore[attr-defined]
    wanted = [*names, f"{prefix}/absent.json", f"{prefix}/bad.json"]
    assert storage.read_many(wanted) == [storage.read_bytes(p) for p in wanted]
    assert storage.read_many(wanted)[-2:] == [None, b"\xff\xfe"]
    dirs = [f"{prefix}/d{i}" for i in range(7)] + [f"{prefix}/nothing-here"]
    listed = storage.list_many(dirs)
    assert listed == [storage.list_files(d) for d in dirs]
    assert sorted(listed[0] or {}) == ["f.json", "sub/g.txt"] and listed[-1] is None


def test_batched_reads_and_listings_answer_as_single_calls_on_s3(s3_bucket: str) -> None:
    _batch_round(f"{s3_bucket}/batching")


def test_batched_reads_and_listings_answer_as_single_calls_on_gcs(fake_gcs_bucket: str) -> None:
    _batch_round(f"{fake_gcs_bucket}/batching")


def test_on_s3_a_read_is_one_get_and_a_small_write_sends_its_body_at_once(s3_bucket: str) -> None:
    """No HEAD before each GET (s3fs asks for the size to split large reads), and no `Expect: 100-continue`
    round trip before a record's body; both counted at botocore's event hooks."""
    from fsspec.asyn import sync

    from marin.storage.fs import storage_for

    storage = storage_for(f"{s3_bucket}/one-get")
    path = f"{s3_bucket}/one-get/status.json"
    storage.write_text(path, "{}")
    client = sync(storage.fs.loop, storage.fs.set_session)  # type: ignore[attr-defined]
    seen: list[tuple[str, str | None]] = []

    def note(model: object, params: dict[str, object], **kwargs: object) -> None:
        headers = params.get("headers") or {}
        seen.append((getattr(model, "name", ""), headers.get("Expect")))  # type: ignore[attr-defined]

    client.meta.events.register_last("before-call.s3", note)
    try:
        assert storage.read_text(path) == "{}"
        storage.write_text(path, '{"status": "SUCCESS"}')
        assert storage.read_many([path, path]) == [b'{"status": "SUCCESS"}'] * 2
    finally:
        client.meta.events.unregister("before-call.s3", note)
    assert seen == [("GetObject", None), ("PutObject", None), ("GetObject", None), ("GetObject", None)]


def test_on_s3_a_listing_parses_its_timestamps_fast_and_to_the_same_instants(s3_bucket: str) -> None:
    """A listing's LastModified goes through `iso_timestamp` (botocore's own parser costs three quarters of
    a listing page's CPU), and gives the instants botocore's parser gives for the same answer, to the
    microsecond; forms other than S3's listing form go to botocore's parser unchanged."""
    from botocore.utils import parse_timestamp

    from marin.storage import s3
    from marin.storage.fs import storage_for

    for text in ("2026-12-06T22:50:00.000Z", "2026-12-06T22:50:00.123Z", "2026-12-06T22:50:00Z",
                 "Sun, 06 Dec 2026 22:50:00 GMT", "1700000000", "2026-12-06T22:50:00.000+01:00"):
        assert s3.iso_timestamp(text) == parse_timestamp(text), text
    with pytest.raises(ValueError, match="month must be in 1..12"):
        s3.iso_timestamp("2026-13-06T22:50:00.000Z")

    import fsspec

    prefix = f"{s3_bucket}/timestamps-{time.time_ns()}"
    storage = storage_for(prefix)
    for i in range(3):
        storage.write_text(f"{prefix}/d{i}/status.json", "{}")
    listing = storage.list_files(prefix)
    assert listing is not None and sorted(listing) == [f"d{i}/status.json" for i in range(3)]
    client = s3.tuned_client(storage.fs)  # type: ignore[attr-defined]
    assert client._endpoint._response_parser_factory._defaults["timestamp_parser"] is s3.iso_timestamp
    fast = storage.fs.find(prefix, detail=True)  # type: ignore[attr-defined]
    plain = fsspec.filesystem("s3", skip_instance_cache=True)  # its own session: botocore's parser
    slow = plain.find(prefix, detail=True)
    assert sorted(fast) == sorted(slow) and len(fast) == 3
    assert [fast[k]["LastModified"] for k in sorted(fast)] == [slow[k]["LastModified"] for k in sorted(slow)]


def _create_round(prefix: str) -> None:
    from marin.storage.fs import storage_for

    storage = storage_for(prefix)
    path = f"{prefix}/lease-{os.getpid()}-{time.time_ns()}.json"
    created, token = storage.create_versioned(path, '{"owner": "a"}')
    current = storage.read_versioned(path)
    assert created and current is not None and token == current.token  # no read-back needed
    assert storage.create_versioned(path, '{"owner": "b"}') == (False, None)  # the race's loser
    assert storage.replace_if(path, '{"owner": "a", "beat": 2}', token)  # the token is a working one
    assert storage.read_text(path) == '{"owner": "a", "beat": 2}'


def test_a_create_on_s3_answers_with_the_etag_a_read_gives(s3_bucket: str) -> None:
    _create_round(f"{s3_bucket}/create-versioned")


def test_a_create_on_gcs_answers_with_the_generation_a_read_gives(fake_gcs_bucket: str) -> None:
    _create_round(f"{fake_gcs_bucket}/create-versioned")


def test_on_an_object_store_the_plan_reads_only_step_json_files_changed_since_success(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SUCCESS status records step.json's checksum and source hash; a plan whose output listing shows the
    same checksum does not read step.json, and reads (and names) one rewritten since. (Without the local
    cache of status files, so that the plan reads every status here: `storage.read` is not empty.)"""
    monkeypatch.setenv("MARIN_CACHE_DIR", "off")
    from marin.status.files import step_json_path
    from marin.storage.fs import storage_for
    from marin.storage.s3 import S3Storage

    class Recording(S3Storage):
        def __init__(self, base: S3Storage) -> None:
            super().__init__(base.fs, "s3")
            self.read: list[str] = []

        def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
            self.read.extend(paths)
            return super().read_many(paths)

    prefix = f"{s3_bucket}/facts-{time.time_ns()}"
    steps = [Step(name=f"fan/w{i}", fn=fs_write, config=FsWriteConfig(output_path=this_output_path(),
                                                                      text=str(i)))
             for i in range(9)]  # fan/ listed whole (plan.WHOLE_PARENT_MIN), split by step
    run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                   script="tests/batching.py")
    base = storage_for(prefix)
    assert isinstance(base, S3Storage)
    graph = build_graph(steps)
    storage = Recording(base)
    assert [e.action for e in make_plan(graph, prefix, storage).entries] == ["skip"] * 9
    assert storage.read and not [p for p in storage.read if p.endswith("step.json")]
    victim = graph.nodes[-1].output_path(prefix)
    base.write_text(step_json_path(victim), "{not json")
    storage = Recording(base)
    plan = make_plan(graph, prefix, storage)
    assert [p for p in storage.read if p.endswith("step.json")] == [step_json_path(victim)]
    entry = next(e for e in plan.entries if e.output_path == victim)
    assert entry.action == "skip" and any(f"{step_json_path(victim)} cannot be read" in w
                                          for w in entry.warnings)
    base.fs.rm_file(f"{victim}/out.txt")  # type: ignore[attr-defined]
    entry = next(e for e in make_plan(graph, prefix, base).entries if e.output_path == victim)
    assert entry.action == "run" and "1 file missing (out.txt)" in entry.reason


def _cached_status_round(prefix: str, cache_dir: Path) -> None:
    """A plan of succeeded steps on an object store reads each status.json once per content: a second plan
    reads none (the listing names each one's checksum), a status rewritten in between is read again (the
    listing shows another checksum), and a damaged cache entry is a miss, never a wrong answer."""
    from marin.status.files import status_path
    from marin.storage.fs import storage_for

    class Recording(type(storage_for(prefix))):  # type: ignore[misc]
        def __init__(self) -> None:
            base = storage_for(prefix)
            super().__init__(base.fs, base.protocol)  # type: ignore[attr-defined]
            self.read: list[str] = []

        def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
            self.read.extend(paths)
            return super().read_many(paths)

    steps = [Step(name=f"fan/w{i}", fn=fs_write, config=FsWriteConfig(output_path=this_output_path(),
                                                                      text=str(i)))
             for i in range(9)]  # fan/ listed whole (plan.WHOLE_PARENT_MIN)
    assert run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                          script="tests/batching.py").status == "SUCCESS"
    graph = build_graph(steps)
    statuses = sorted(status_path(n.output_path(prefix)) for n in graph.nodes)
    first = Recording()  # the workers kept the SUCCESS status they wrote (listed_cache.remember)
    assert [e.action for e in make_plan(graph, prefix, first).entries] == ["skip"] * 9
    assert not [p for p in first.read if p.endswith("status.json")]
    second = Recording()
    assert [e.action for e in make_plan(graph, prefix, second).entries] == ["skip"] * 9
    assert not [p for p in second.read if p.endswith("status.json")]
    victim = graph.nodes[3].output_path(prefix)
    base = storage_for(prefix)
    doc = json.loads(base.read_text(status_path(victim)) or "{}")
    base.write_text(status_path(victim), json.dumps({**doc, "status": "FAILED"}))  # new bytes
    third = Recording()
    plan = make_plan(graph, prefix, third)
    assert [p for p in third.read if p.endswith("status.json")] == [status_path(victim)]
    assert next(e for e in plan.entries if e.output_path == victim).previous["status"] == "FAILED"
    base.write_text(status_path(victim), json.dumps(doc))  # back to the very bytes cached before
    for entry in cache_dir.rglob("*"):
        if entry.is_file():
            entry.write_bytes(b'{"status": "FAILED"}')  # every entry damaged: all misses, none believed
    fourth = Recording()
    assert [e.action for e in make_plan(graph, prefix, fourth).entries] == ["skip"] * 9
    assert sorted(p for p in fourth.read if p.endswith("status.json")) == statuses
    fifth = Recording()  # the damaged entries were replaced by what was read
    make_plan(graph, prefix, fifth)
    assert not [p for p in fifth.read if p.endswith("status.json")]


def test_on_s3_a_plan_reads_each_status_once_per_content(s3_bucket: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path))
    _cached_status_round(f"{s3_bucket}/cached-{time.time_ns()}", tmp_path)


def test_on_gcs_a_plan_reads_each_status_once_per_content(fake_gcs_bucket: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path))
    _cached_status_round(f"{fake_gcs_bucket}/cached-{time.time_ns()}", tmp_path)


def test_on_local_disk_no_status_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local listings carry no checksum: every plan reads the status files, and nothing is kept."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MARIN_CACHE_DIR", str(cache))
    steps = _fan_out(8)
    run_experiment(steps, ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"), verbose=False,
                   script="tests/batching.py")
    for _ in range(2):
        storage = CountingStorage()
        make_plan(build_graph(steps), str(tmp_path / "p"), storage)
        assert storage.batches[0] == ("read_many", 9)
    assert not cache.exists()


def test_a_step_that_finishes_between_the_plans_listing_and_its_reads_is_listed_again(
        s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan lists the parent before it reads the statuses; a step whose status and outputs land in
    between is checked against a listing made after them, never against the older one (that would call its
    outputs missing and re-run it)."""
    from marin.status.files import status_path
    from marin.storage.fs import storage_for
    from marin.storage.s3 import S3Storage

    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path))
    prefix = f"{s3_bucket}/late-{time.time_ns()}"
    steps = [Step(name=f"fan/w{i}", fn=fs_write, config=FsWriteConfig(output_path=this_output_path(),
                                                                      text=str(i)))
             for i in range(9)]
    run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                   script="tests/batching.py")
    base = storage_for(prefix)
    assert isinstance(base, S3Storage)
    graph = build_graph(steps)
    victim = graph.nodes[2].output_path(prefix)
    saved = {p: base.read_bytes(f"{victim}/{p}") for p in ("out.txt", ".marin/status.json")}
    for p in saved:
        base.fs.rm_file(f"{victim}/{p}")  # type: ignore[attr-defined]

    class Late(S3Storage):
        """Puts the victim's output and status back after the plan's listing, before its reads."""

        def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
            if status_path(victim) in paths:
                for p, data in saved.items():
                    base.fs.pipe_file(f"{victim}/{p}", data)  # type: ignore[attr-defined]
            return super().read_many(paths)

    entry = next(e for e in make_plan(graph, prefix, Late(base.fs, "s3")).entries if e.output_path == victim)
    assert entry.action == "skip", entry.reason
