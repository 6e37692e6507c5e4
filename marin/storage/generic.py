"""Storage on any fsspec filesystem, with the conditional writes every store can give: check, then write.

Writes are single-object PUTs (atomic for readers on object stores). The conditional operations here are best
effort: two executors can both win a race, which docs/concepts.md ("Leases") says plainly. The object stores
with real preconditions subclass this class and replace exactly those operations (`s3.py`, `gcs.py`).
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import fsspec
from fsspec.asyn import sync

from marin.storage.base import Storage, Versioned
from marin.storage.listing import CHUNK, FileInfo, fsspec_file_info

T = TypeVar("T")

def split_bucket(path: str) -> tuple[str, str]:
    """("bucket", "key/of/object") of an object-store URL."""
    bucket, _, key = path.split("://", 1)[-1].partition("/")
    return bucket, key


BATCH_CONCURRENCY = 64
"""Requests a batch (`read_many`, `list_many`) keeps in flight at once on an async store (s3fs, gcsfs); a
thread pool of 16 does it for a store without an async interface."""


class FsspecStorage(Storage):
    """Any fsspec filesystem; `protocol` is the URL scheme it was opened for."""

    guarantees = "single-PUT writes; leases are best effort (check then write)"
    cat_options: dict[str, Any] = {}  # passed to `cat_file` (s3.py: one GET, without a HEAD for the size)

    def __init__(self, fs: fsspec.AbstractFileSystem, protocol: str) -> None:
        self.fs = fs
        self.protocol = protocol

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def read_bytes(self, path: str) -> bytes | None:
        try:
            data: bytes = self.fs.cat_file(path, **self.cat_options)
        except FileNotFoundError:
            return None
        return data

    # ----- batches: concurrent through the store's async interface (one event loop, no thread per call) -----
    def _batch(self, one: Callable[[str], Awaitable[T]], fallback: Callable[[str], T],
               paths: Sequence[str]) -> list[T]:
        if len(paths) < 2:
            return [fallback(p) for p in paths]
        if not getattr(self.fs, "async_impl", False):
            with ThreadPoolExecutor(16) as pool:
                return list(pool.map(fallback, paths))

        async def gather() -> list[T]:
            limit = asyncio.Semaphore(BATCH_CONCURRENCY)

            async def bounded(path: str) -> T:
                async with limit:
                    return await one(path)

            return list(await asyncio.gather(*(bounded(p) for p in paths)))

        return list(sync(self.fs.loop, gather))

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        async def one(path: str) -> bytes | None:
            try:
                data: bytes = await self.fs._cat_file(self._bare(path), **self.cat_options)
            except FileNotFoundError:
                return None
            return data

        return self._batch(one, self.read_bytes, paths)

    def list_many(self, paths: Sequence[str]) -> list[dict[str, FileInfo] | None]:
        async def one(path: str) -> dict[str, FileInfo] | None:
            root = self._bare(path)
            try:
                found = await self.fs._find(root, detail=True, withdirs=False)
            except FileNotFoundError:
                return None
            return self._under(root, found)

        return self._batch(one, self.list_files, paths)

    def move(self, path: str, to: str) -> None:
        self.fs.mv(path, to, recursive=True)

    def write_text(self, path: str, text: str) -> None:
        self.fs.pipe_file(path, text.encode("utf-8"))

    def append_text(self, path: str, text: str) -> None:
        # Object stores have no append: rewrite the whole (small) object.
        old = self.read_text(path) or ""
        self.write_text(path, old + text)

    def listdir(self, path: str) -> list[str] | None:
        try:
            entries = self.fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return None
        except TypeError:  # a filesystem whose ls takes no `refresh`
            entries = self.fs.ls(path, detail=False)
        return [posixpath.basename(str(e).rstrip("/")) for e in entries]

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def upload_file(self, local_path: str, path: str) -> None:
        self.fs.put_file(local_path, path)

    def create_exclusive(self, path: str, text: str) -> bool:
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, text.encode("utf-8"))
        return True

    def read_versioned(self, path: str) -> Versioned | None:
        text = self.read_text(path)
        return None if text is None else Versioned(text, text)

    def replace_if(self, path: str, text: str, token: Any) -> bool:
        if self.read_text(path) != token:
            return False
        self.write_text(path, text)
        return True

    def delete_if(self, path: str, token: Any) -> bool:
        if self.read_text(path) != token:
            return False
        self.fs.rm_file(path)
        return True

    # ----- listings: one paged `find` per directory (marin/storage/listing.py) ---------------------------
    def _bare(self, path: str) -> str:
        """`path` as the filesystem names it in listings (without the protocol)."""
        return str(self.fs._strip_protocol(path)).rstrip("/")

    def list_files(self, path: str, limit: int | None = None) -> dict[str, FileInfo] | None:
        root = self._bare(path)
        try:
            found = self.fs.find(root, detail=True, withdirs=False)
        except FileNotFoundError:
            return None
        return self._under(root, found)

    @staticmethod
    def _under(root: str, found: dict[str, dict[str, Any]]) -> dict[str, FileInfo] | None:
        """The files of a `find(root, detail=True)` answer, by name relative to `root`."""
        out: dict[str, FileInfo] = {}
        for name, info in found.items():
            name = str(name).rstrip("/")
            if info.get("type") == "directory" or not name.startswith(root + "/"):
                continue  # the directory itself, or a file named like the path (not under it)
            out[name[len(root) + 1:]] = fsspec_file_info(info)
        return out or None  # object stores have no empty directories: nothing under it is "absent"

    def file_info(self, path: str) -> FileInfo | None:
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else fsspec_file_info(info)

    def glob_files(self, pattern: str) -> dict[str, FileInfo]:
        found = self.fs.glob(pattern, detail=True)
        return {self.protocol + "://" + str(name): fsspec_file_info(info)
                for name, info in sorted(found.items())
                if info.get("type") != "directory"}

    def iter_bytes(self, path: str) -> Iterator[bytes]:
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def _create_if_absent(self, path: str, text: str) -> bool:
        """Create through the store's own create-if-absent (`mode="create"`, s3fs and gcsfs): a lost race is
        FileExistsError there, a clean refusal here."""
        try:
            self.fs.pipe_file(path, text.encode("utf-8"), mode="create")
        except FileExistsError:
            return False
        return True
