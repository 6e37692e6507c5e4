"""The local cache of listed files (marin/storage/listed_cache.py): it answers only for the bytes a listing
describes (size and content digest, checked on every hit), keeps nothing else, stays within its bound, and a
cache that cannot be used is a miss, never an error. The plan's use of it against moto and fake-gcs-server
is tested in test_plan_batching.py."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from marin.storage.listed_cache import ListedCache, cache_root, read_listed
from marin.storage.listing import FileInfo
from marin.storage.local import LocalStorage


def _etag(data: bytes) -> FileInfo:
    return FileInfo(len(data), "etag:" + hashlib.md5(data).hexdigest())


def _gcs(data: bytes, generation: int) -> FileInfo:
    return FileInfo(len(data), "md5:" + base64.b64encode(hashlib.md5(data).digest()).decode(), generation)


def test_an_entry_answers_only_for_the_listed_content(tmp_path: Path) -> None:
    cache = ListedCache(str(tmp_path))
    old, new = b'{"status": "RUNNING"}', b'{"status": "SUCCESS"}'
    assert cache.put("s3://b/x/.marin/status.json", _etag(old), old)
    assert cache.get("s3://b/x/.marin/status.json", _etag(old)) == old
    assert cache.get("s3://b/x/.marin/status.json", _etag(new)) is None  # rewritten: another checksum
    assert cache.get("s3://b/y/.marin/status.json", _etag(old)) is None  # another path
    assert cache.get("s3://b/x/.marin/status.json", None) is None  # not listed
    assert not cache.put("s3://b/x/.marin/status.json", _etag(new), old)  # bytes that are not the listed
    assert cache.put("gs://b/x/.marin/status.json", _gcs(new, 7), new)
    assert cache.get("gs://b/x/.marin/status.json", _gcs(new, 8)) == new  # same bytes, whatever generation


def test_checksums_that_are_not_content_digests_are_never_cached(tmp_path: Path) -> None:
    cache = ListedCache(str(tmp_path))
    data = b"{}"
    for info in (FileInfo(2), FileInfo(2, "etag:0123456789abcdef0123456789abcdef-3"),
                 FileInfo(2, "crc32c:AAAAAA=="), FileInfo(2, None, 12345)):
        assert not cache.put("s3://b/f", info, data) and cache.get("s3://b/f", info) is None
    assert not any(tmp_path.iterdir())


def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    cache = ListedCache(str(tmp_path))
    data = b'{"status": "SUCCESS", "attempt": 1}'
    cache.put("s3://b/x", _etag(data), data)
    (entry,) = [p for p in tmp_path.rglob("*") if p.is_file()]
    entry.write_bytes(data[:-3])  # truncated
    assert cache.get("s3://b/x", _etag(data)) is None and not entry.exists()
    cache.put("s3://b/x", _etag(data), data)
    entry.write_bytes(data.replace(b"1", b"2"))  # same size, other bytes
    assert cache.get("s3://b/x", _etag(data)) is None and not entry.exists()


def test_the_cache_stays_within_its_bound_dropping_the_least_recently_used(tmp_path: Path) -> None:
    cache = ListedCache(str(tmp_path), max_bytes=10_000)
    blobs = {f"s3://b/s{i}": os.urandom(1000) for i in range(30)}
    for i, (path, data) in enumerate(blobs.items()):
        cache.put(path, _etag(data), data)
        entry = cache._entry(path, _etag(data))
        os.utime(entry, (1_000_000 + i, 1_000_000 + i))  # put in this order, one second apart
    cache.trim()
    kept = [p for p, d in blobs.items() if cache.get(p, _etag(d)) is not None]
    assert sum(len(blobs[p]) for p in kept) <= 10_000
    assert kept == list(blobs)[-len(kept):] and len(kept) >= 5  # the newest ones


def test_an_unusable_cache_directory_is_a_miss_and_reads_go_to_the_store(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    cache = ListedCache(str(blocker / "listed-files"))
    data = b'{"status": "SUCCESS"}'
    assert not cache.put("s3://b/x", _etag(data), data)
    assert cache.get("s3://b/x", _etag(data)) is None
    target = tmp_path / "status.json"
    target.write_bytes(data)

    class Counting(LocalStorage):
        reads: list[str] = []

        def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
            self.reads.extend(paths)
            return super().read_many(paths)

    storage = Counting()
    found, moved = read_listed(storage, [(str(target), _etag(data))], cache)
    assert found == [data] and not moved and storage.reads == [str(target)]


def test_a_file_rewritten_after_the_listing_is_read_as_it_is_and_not_cached(tmp_path: Path) -> None:
    cache = ListedCache(str(tmp_path / "cache"))
    listed, now = b'{"status": "RUNNING"}', b'{"status": "SUCCESS", "attempt": 1}'
    target = tmp_path / "status.json"
    target.write_bytes(now)  # written after the listing that reported `listed`
    found, moved = read_listed(LocalStorage(), [(str(target), _etag(listed))], cache)
    assert found == [now] and moved == {str(target)}
    assert cache.get(str(target), _etag(listed)) is None and cache.get(str(target), _etag(now)) is None


def test_where_the_cache_lives(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MARIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == str(tmp_path / "marin" / "listed-files")
    monkeypatch.setenv("MARIN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == str(tmp_path / "mine" / "listed-files")
    monkeypatch.setenv("MARIN_CACHE_DIR", "off")
    assert cache_root() is None
