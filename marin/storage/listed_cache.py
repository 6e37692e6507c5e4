"""Small files read once per content, validated by a listing made by the caller: never stale by construction.

A plan of N succeeded steps on an object store reads N status.json files (one GET each) after listing their
parent directory; the listing already carries each file's size and the store's content checksum (S3: the ETag,
for a single-part PUT the MD5 of the bytes; GCS: `md5Hash`, and the generation, which every write changes).
This cache keeps the bytes of such files on local disk under the key (full path, size, content checksum) and
serves them only when the listing made *in the same plan* reports exactly that key, and only after checking
that the bytes kept still have that size and digest. So:
- a file rewritten since it was cached lists with another checksum: a miss, read from the store as before.
  The cache can only answer with bytes whose digest the store reports for that path now. (The GCS generation
  is left out of the key on purpose: the bytes are what is served, and their MD5 is checked; a rewrite with
  the very same bytes serves the very same bytes);
- the engine's own writers put what they wrote (`remember`: status.json, written by the worker on a local
  backend, or by the executor), keyed by the checksum the store will list for those bytes
  (`Storage.listed_checksum`: MD5 for a single-part S3 PUT or a GCS upload), so the first plan after a run
  on the same machine reads nothing either;
- bytes are cached only when their own digest equals the checksum the listing reported (a file rewritten
  between the listing and the read is read, used, and not cached under the older key);
- a damaged or truncated entry fails the digest check: a miss (and it is removed); an unreadable or
  unwritable cache directory is a miss too (a cache never fails a plan);
- a checksum that is not a plain content digest (a multipart ETag, a CRC32C) or no checksum at all (local
  disk: the plan reads the files as before) is never cached.

Where: `$MARIN_CACHE_DIR` if set, else `$XDG_CACHE_HOME/marin` (default `~/.cache/marin`), under
`listed-files/`; `MARIN_CACHE_DIR=off` disables it. Bounded: past `MAX_BYTES` the least recently used entries
(by mtime, touched on each hit) are removed down to three quarters of it. Entries are written to a temporary
name and renamed, so concurrent plans on one machine never see half an entry. docs/formats.md ("A local cache
of status files") states the argument; benchmarks/cloud_latency.py measures it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Sequence

from marin.storage.base import Storage
from marin.storage.listing import FileInfo, digest_chunks, recomputable

MAX_BYTES = 64 << 20
"""Bytes the cache may hold (about 40,000 status files) before its least recently used entries go."""
MAX_FILE = 1 << 20
"""Larger files are never cached (the engine's records are a few KB)."""
_TRIM_EVERY = 512
"""Entries written by one process between two size checks (a check scans the cache directory)."""


def cache_root() -> str | None:
    """The cache's directory, or None when disabled (`MARIN_CACHE_DIR=off`)."""
    explicit = os.environ.get("MARIN_CACHE_DIR")
    if explicit is not None:
        off = explicit.strip().lower() in ("off", "0", "")
        return None if off else os.path.join(explicit, "listed-files")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "marin", "listed-files")


def matches(info: FileInfo, data: bytes) -> bool:
    """Whether `data` is the content `info` (a listing's entry) describes: same size, same content digest."""
    algorithm = recomputable(info.checksum)
    return (algorithm is not None and len(data) == info.size
            and digest_chunks(algorithm, iter((data,))) == info.checksum)


class ListedCache:
    """Bytes of listed files on local disk, keyed and checked by what a fresh listing reports."""

    def __init__(self, root: str | None, max_bytes: int = MAX_BYTES) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.written = 0

    @staticmethod
    def cacheable(info: FileInfo | None) -> bool:
        return info is not None and info.size <= MAX_FILE and recomputable(info.checksum) is not None

    def _entry(self, path: str, info: FileInfo) -> str:
        assert self.root is not None
        key = json.dumps([path, info.size, info.checksum])
        name = hashlib.sha256(key.encode()).hexdigest()
        return os.path.join(self.root, name[:2], name)

    def get(self, path: str, info: FileInfo | None) -> bytes | None:
        """The bytes of `path` as `info` lists it, or None (not cached, not cacheable, or a bad entry)."""
        if self.root is None or info is None or not self.cacheable(info):
            return None
        entry = self._entry(path, info)
        try:
            with open(entry, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError:
            return None
        if not matches(info, data):  # damaged, truncated, or written by something else: a miss
            self._remove(entry)
            return None
        # recently used: kept longest (removed meanwhile by another process's trim: the bytes are still right)
        with contextlib.suppress(OSError):
            os.utime(entry)
        return data

    def put(self, path: str, info: FileInfo | None, data: bytes) -> bool:
        """Keep `data` for `path` under `info`'s key, only if `data` is what `info` describes (True if
        kept)."""
        if self.root is None or info is None or not self.cacheable(info) or not matches(info, data):
            return False
        entry = self._entry(path, info)
        tmp = f"{entry}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, entry)
        except OSError:
            self._remove(tmp)
            return False
        self.written += 1
        if self.written % _TRIM_EVERY == 0:
            self.trim()
        return True

    def trim(self) -> None:
        """Remove the least recently used entries while the cache holds more than `max_bytes`."""
        if self.root is None:
            return
        entries: list[tuple[float, int, str]] = []
        try:
            for sub in os.scandir(self.root):
                if sub.is_dir():
                    for e in os.scandir(sub.path):
                        st = e.stat()
                        entries.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        for _, size, path in sorted(entries):
            if total <= self.max_bytes * 3 // 4:
                break
            self._remove(path)
            total -= size

    @staticmethod
    def _remove(path: str) -> None:
        with contextlib.suppress(OSError):
            os.remove(path)


def remember(storage: Storage, path: str, text: str) -> None:
    """Keep `text`, just written to `path` on `storage`, for the next plan's listing to validate (a store
    whose listings carry no content digest keeps nothing). Never fails the write it follows."""
    data = text.encode("utf-8")
    checksum = storage.listed_checksum(data)
    if checksum is not None:
        ListedCache(cache_root()).put(path, FileInfo(len(data), checksum), data)


def read_listed(storage: Storage, items: Sequence[tuple[str, FileInfo | None]],
                cache: ListedCache | None = None) -> tuple[list[bytes | None], set[str]]:
    """The bytes of each (path, its entry in a listing just made, or None when unlisted), in order: served
    from the cache where the listing's entry validates it, the rest in one `Storage.read_many`. Also the paths
    whose bytes read now differ from what the listing reported (rewritten or deleted since the listing: the
    caller re-lists what depends on it)."""
    cache = cache or ListedCache(cache_root())
    out: list[bytes | None] = [cache.get(path, info) for path, info in items]
    missing = [i for i, data in enumerate(out) if data is None]
    found = storage.read_many([items[i][0] for i in missing])
    moved: set[str] = set()
    for i, data in zip(missing, found, strict=True):
        path, info = items[i]
        out[i] = data
        if info is None or data is None:
            if info is not None:
                moved.add(path)  # listed, but gone when read
            continue
        if cache.cacheable(info):
            if matches(info, data):
                cache.put(path, info, data)
            else:
                moved.add(path)  # rewritten since the listing: used as read, not cached
    return out, moved
