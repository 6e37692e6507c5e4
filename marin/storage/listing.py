"""What a listing says about files: size, the store's checksum, and what changes when a file is rewritten.

`FileInfo` is one file as a listing (or a stat) reports it; `Storage.list_files` returns every file under a
path (recursively, names relative to it) from as few store calls as the store allows: `os.scandir` locally,
one paged `find` on object stores (S3 ListObjectsV2, GCS objects.list). Output manifests (`outputs.py`) and
raw input fingerprints (`fingerprints.py`) are both built from it.

Checksums are strings `algorithm:value`:
- local files: `sha256:<hex>`, computed by reading the file (the OS keeps no checksum), only when asked;
- S3: `etag:<etag>` (for a single-part upload the ETag is the MD5 of the content; a multipart one ends in
  `-<parts>` and is not a plain content digest);
- GCS: `md5:<base64>` (the object's `md5Hash`; composite objects have none and fall back to
  `crc32c:<base64>`).
`version` is what a rewrite always changes even with the same bytes: the GCS generation, the local mtime (ns),
or None where the store reports nothing of the kind (S3 without versioning).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

CHUNK = 1 << 20

WHOLE_PARENT_MIN = 8
"""A parent directory is listed whole (recursively, once: on S3 and GCS a page per 1,000 objects) instead of
its wanted members one by one when at least this many of them lie under it and they are at least half of its
entries (`whole_parents`: the plan's output listings and the dashboard's `read_json_many` share it)."""


def whole_parents(wanted: Mapping[str, Collection[Any]], entries: Callable[[str], int],
                  allowed: Callable[[str], bool] = lambda parent: True) -> list[str]:
    """The parents in `wanted` (parent -> the members wanted under it) worth one recursive listing: at least
    `WHOLE_PARENT_MIN` members wanted and at least half of its entries (`entries(parent)`: how many it has,
    asked only of a parent that passed the other checks, since it may cost a listing), and `allowed`."""
    return [parent for parent, members in wanted.items()
            if len(members) >= WHOLE_PARENT_MIN and allowed(parent) and 2 * len(members) >= entries(parent)]


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One file as listed: its size, the store's checksum (None where it must be computed) and version."""

    size: int
    checksum: str | None = None
    version: int | str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size}
        if self.checksum is not None:
            out["checksum"] = self.checksum
        if self.version is not None:
            out["version"] = self.version
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> FileInfo:
        return FileInfo(int(data["size"]), data.get("checksum"), data.get("version"))


def fsspec_file_info(info: dict[str, Any]) -> FileInfo:
    """A FileInfo from an fsspec `info`/`find(detail=True)` entry (s3fs, gcsfs, or anything else)."""
    size = int(info.get("size") or 0)
    md5 = info.get("md5Hash")
    if md5:
        checksum: str | None = f"md5:{md5}"
    elif info.get("crc32c"):
        checksum = f"crc32c:{info['crc32c']}"
    elif info.get("ETag") or info.get("etag"):
        checksum = "etag:" + str(info.get("ETag") or info.get("etag")).strip('"')
    else:
        checksum = None
    generation = info.get("generation")
    version = int(generation) if isinstance(generation, int | str) and str(generation).isdigit() else None
    return FileInfo(size, checksum, version)


def digest_chunks(algorithm: str, chunks: Iterator[bytes]) -> str:
    """The checksum string (`algorithm:value`, in the store's spelling) of the bytes `chunks` yields."""
    name = "md5" if algorithm in ("md5", "etag") else algorithm
    h = hashlib.new(name)
    for chunk in chunks:
        h.update(chunk)
    if algorithm == "md5":
        return f"md5:{base64.b64encode(h.digest()).decode()}"  # GCS spells md5Hash in base64
    return f"{algorithm}:{h.hexdigest()}"


def recomputable(checksum: str | None) -> str | None:
    """The algorithm to recompute `checksum` from the bytes, or None when it is not a content digest (a
    multipart ETag, a CRC32C: sizes are compared instead)."""
    if checksum is None:
        return None
    algorithm, _, value = checksum.partition(":")
    if algorithm == "etag":
        return "etag" if "-" not in value and len(value) == 32 else None
    return algorithm if algorithm in ("sha256", "md5") else None
