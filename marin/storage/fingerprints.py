"""Raw-input fingerprints: what an existing file, directory or glob outside the DAG holds, read cheaply.

A fingerprint is built from listings (marin/storage/listing.py), never from a walk of the bytes on an object
store: the store's own checksum (S3 ETag, GCS md5Hash) and version (GCS generation). On local disk a file up
to `SMALL_FILE_BYTES` is identified by a sha256 of its content, a larger one by its size and mtime (so
touching a large file counts as a change; reading gigabytes at every plan would not be cheap). A directory
(`.marin/` left out) or a glob is fingerprinted as a whole: `digest` covers every member's name, size and
identifying key, so adding, removing or changing any member changes it.

`digest` is what enters a step's identity (docs/concepts.md, "Raw inputs"); the other fields are recorded in
step.json so a later plan can say what changed (`raw input gs://b/x.jsonl: generation 3 -> 4`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from marin.errors import StorageError
from marin.storage.base import Storage
from marin.storage.listing import FileInfo, digest_chunks

SMALL_FILE_BYTES = 16 << 20  # local files up to 16 MiB are identified by content, larger ones by size + mtime
MAX_MEMBERS = 200_000  # a directory or glob with more files than this is refused (see `fingerprint`)
GLOB_CHARS = ("*", "?", "[")


class InputFingerprintError(StorageError):
    """A raw input's fingerprint cannot be read (permissions, a path that vanished, a store error)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    path: str
    kind: str  # "file", "directory" or "glob"
    files: int
    bytes: int
    digest: str  # sha256 over the identifying keys: what enters identity
    checksum: str | None = None  # a file's identifying key (`sha256:`, `etag:`, `md5:`, `mtime:`)
    version: int | str | None = None  # a file's generation (GCS) or mtime in ns (local)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def changes_since(self, old: dict[str, Any]) -> str:
        """What differs from an earlier fingerprint (its `to_json`), in words."""
        parts = []
        if self.version is not None and old.get("version") not in (None, self.version):
            label = "generation" if "://" in self.path else "mtime_ns"
            parts.append(f"{label} {old['version']} -> {self.version}")
        if old.get("files") != self.files and self.kind != "file":
            parts.append(f"files {old.get('files')} -> {self.files}")
        if old.get("bytes") != self.bytes:
            parts.append(f"{'size' if self.kind == 'file' else 'bytes'} {old.get('bytes')} -> {self.bytes}")
        if self.checksum and old.get("checksum") not in (None, self.checksum) and \
                not self.checksum.startswith("mtime"):
            parts.append(f"{_short(old.get('checksum'))} -> {_short(self.checksum)}")
        if not parts:
            parts.append(f"content digest {str(old.get('digest'))[:12]} -> {self.digest[:12]}")
        return ", ".join(parts)


def _short(checksum: Any) -> str:
    text = str(checksum)
    algorithm, _, value = text.partition(":")
    return f"{algorithm} {value[:12]}" if value else text


def is_glob(path: str) -> bool:
    return any(c in path for c in GLOB_CHARS)


def _key(storage: Storage, path: str, info: FileInfo) -> str:
    """A file's identifying key: the store's checksum, a local small file's sha256, else size + mtime."""
    if info.checksum is not None:
        return info.checksum
    if info.size <= SMALL_FILE_BYTES:
        return digest_chunks("sha256", storage.iter_bytes(path))
    return f"mtime:{info.version}"


def _whole(path: str, kind: str, members: dict[str, tuple[FileInfo, str]]) -> Fingerprint:
    h = hashlib.sha256()
    for name in sorted(members):
        info, key = members[name]
        h.update(f"{name}\0{info.size}\0{key}\n".encode())
    return Fingerprint(path, kind, len(members), sum(i.size for i, _ in members.values()), h.hexdigest())


def _file(storage: Storage, path: str, info: FileInfo) -> Fingerprint:
    key = _key(storage, path, info)
    digest = hashlib.sha256(f"{info.size}\0{key}".encode()).hexdigest()
    return Fingerprint(path, "file", 1, info.size, digest, key, info.version)


def _too_many(path: str, n: int) -> InputFingerprintError:
    return InputFingerprintError(
        f"raw input {path} has {n} files (more than {MAX_MEMBERS}): fingerprinting it at every plan would "
        "not "
        "be cheap. Fix: point the config at the subset the step reads, or pass the path in a "
        "marin.runtime_field if it is not an input", path)


def fingerprint(storage: Storage, path: str) -> Fingerprint | None:
    """The fingerprint of a file, directory or glob; None when nothing exists there (not a raw input).
    Raises InputFingerprintError when it exists but cannot be read."""
    try:
        if is_glob(path):
            found = storage.glob_files(path)
            if len(found) > MAX_MEMBERS:
                raise _too_many(path, len(found))
            return _whole(path, "glob", {p: (i, _key(storage, p, i)) for p, i in found.items()}) if found \
                else None
        info = storage.file_info(path)
        if info is not None:
            return _file(storage, path, info)
        files = storage.list_files(path, limit=MAX_MEMBERS)
        if files is None:
            return None
        files = {n: i for n, i in files.items() if n != ".marin" and not n.startswith(".marin/")}
        if len(files) > MAX_MEMBERS:
            raise _too_many(path, len(files))
        join = posixpath.join
        return _whole(path, "directory", {n: (i, _key(storage, join(path, n), i)) for n, i in files.items()})
    except InputFingerprintError:
        raise
    except FileNotFoundError as e:  # listed, then gone before its bytes were read
        raise InputFingerprintError(f"raw input {path} vanished while it was fingerprinted ({e}); re-run "
                                    "when "
                                    "it is complete", path) from e
    except OSError as e:
        raise InputFingerprintError(f"cannot read the fingerprint of raw input {path}: "
                                    f"{type(e).__name__}: {e}. Fix its permissions or the path", path) from e


def fingerprint_all(paths: Iterable[str],
                    storage_of: Callable[[str], Storage]) -> dict[str, Fingerprint | None]:
    """Fingerprints of many paths, each read once; object-store paths concurrently (16 at a time)."""
    unique = sorted(set(paths))
    remote = [p for p in unique if not storage_of(p).is_local]
    out = {p: fingerprint(storage_of(p), p) for p in unique if p not in set(remote)}
    if remote:
        with ThreadPoolExecutor(min(16, len(remote))) as pool:
            out.update(zip(remote, pool.map(lambda p: fingerprint(storage_of(p), p), remote), strict=True))
    return out
