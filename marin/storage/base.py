"""The one interface the engine uses for the prefix's storage, whatever the store.

Paths are absolute (local paths or URLs). Every store gives atomic writes for readers (a reader sees the old
text or the new one, never a mix); the conditional operations (`create_exclusive`, `replace_if`, `delete_if`)
are what leases are built on (marin/storage/lease.py), and each implementation says in `guarantees` how far
they hold there. A refused condition is a `False` return, never an exception: losing a race is normal.

Implementations, one module per store: `local.py` (the OS), `s3.py`, `gcs.py`, and `generic.py` for any other
fsspec filesystem; `fs.storage_for` picks one for a prefix.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

from marin.storage.listing import FileInfo


def aside_name(path: str, now: float | None = None) -> str:
    """Where a damaged file at `path` is kept when it is moved aside: `{path}.corrupt-{YYYYmmddTHHMMSSZ}`
    (marin/status/damaged.py has the policy)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{path}.corrupt-{stamp}"


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A file's text plus an opaque token that changes whenever the file is rewritten."""

    text: str
    token: Any


class Storage(abc.ABC):
    """The operations the engine needs; paths are absolute (local paths or URLs)."""

    is_local: bool = False
    guarantees: str = ""

    @abc.abstractmethod
    def read_text(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""

    @abc.abstractmethod
    def write_text(self, path: str, text: str) -> None:
        """Replace the file's text atomically (readers see the old or the new text)."""

    @abc.abstractmethod
    def append_text(self, path: str, text: str) -> None:
        """Append `text` (one line of a JSONL file) to the file, creating it if absent."""

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str] | None:
        """Base names of the entries of a directory, or None when it does not exist."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abc.abstractmethod
    def upload_file(self, local_path: str, path: str) -> None:
        """Place the local file `local_path` at `path` (a move on local storage)."""

    @abc.abstractmethod
    def create_exclusive(self, path: str, text: str) -> bool:
        """Create `path` with `text` only if it does not exist; False if it already exists."""

    def create_versioned(self, path: str, text: str) -> tuple[bool, Any]:
        """`create_exclusive`, and the new file's version token when the store's answer carries it (None
        when it must be read: `read_versioned`). Saves a lease its read-back on S3 (ETag) and GCS
        (generation)."""
        return self.create_exclusive(path, text), None

    @abc.abstractmethod
    def read_versioned(self, path: str) -> Versioned | None:
        """The file's text and version token, read together; None when it does not exist."""

    @abc.abstractmethod
    def replace_if(self, path: str, text: str, token: Any) -> bool:
        """Overwrite `path` only if it still has version `token`; False if someone else changed it."""

    @abc.abstractmethod
    def delete_if(self, path: str, token: Any) -> bool:
        """Delete `path` only if it still has version `token`; False if someone else changed it."""

    # ----- listings (output manifests and raw-input fingerprints: marin/storage/listing.py) ---------------
    @abc.abstractmethod
    def list_files(self, path: str, limit: int | None = None) -> dict[str, FileInfo] | None:
        """Every file under the directory `path`, recursively, by name relative to it ('/'-separated), from
        as few store calls as the store allows; None when `path` is not a directory (or does not exist).
        With `limit`, a store that walks (local disk) may stop once it found more than `limit` files."""

    @abc.abstractmethod
    def file_info(self, path: str) -> FileInfo | None:
        """The file at `path` (one stat or HEAD); None when no file is there."""

    @abc.abstractmethod
    def glob_files(self, pattern: str) -> dict[str, FileInfo]:
        """The files matching a glob (`*`, `?`, `[..]`, `**` for any depth), by absolute path."""

    @abc.abstractmethod
    def iter_bytes(self, path: str) -> Iterator[bytes]:
        """The file's content in chunks (for digests)."""

    # ----- batches: many independent calls at once (the plan, `marin status`); order of the answers = order
    # of the paths. Stores with an async client issue them concurrently (generic.py); the default is a loop.
    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        """`read_bytes` of every path (None for one that does not exist), concurrently where the store can."""
        return [self.read_bytes(p) for p in paths]

    def list_many(self, paths: Sequence[str]) -> list[dict[str, FileInfo] | None]:
        """`list_files` of every directory, concurrently where the store can."""
        return [self.list_files(p) for p in paths]

    def listed_checksum(self, data: bytes) -> str | None:
        """The checksum this store's listing reports for a file just written whole with `data` (one PUT), or
        None where listings carry no content digest (marin/storage/listed_cache.py)."""
        return None

    def read_bytes(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist (for a file that may not be UTF-8: a damaged
        record is reported and moved aside, never decoded into an unnamed error)."""
        raise NotImplementedError(f"{type(self).__name__} cannot read bytes")

    def move(self, path: str, to: str) -> None:
        """Move the file at `path` to `to` (a damaged record is kept beside the one that replaces it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot move files")
