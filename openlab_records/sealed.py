"""Sealed JSON records: canonical text, their own sha256, and reading and writing them on any fsspec store.

A sealed record carries ``record_sha256``, the sha256 of the canonical JSON of the record *without* that key:
sorted keys, compact separators (``,`` and ``:``), UTF-8 with non-ASCII kept as is, NaN and infinities
refused (the RFC 8785 habit). Anyone can recompute it with::

    json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

so a file edited after it was written no longer matches its hash, and the hash quoted in an issue comment pins
which record was posted.

Files: :func:`read_json` returns ``None`` for a file that does not exist and raises
:class:`RecordFormatError` (naming the path) for one that is not JSON; :func:`write_json_atomic` writes so
that a reader never sees half a record (a temporary file and a rename on local disk, one PUT on an
object store).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

HASH_KEY = "record_sha256"


class RecordFormatError(ValueError):
    """A record file that is not JSON, or not shaped as its schema says (the message names the field)."""


class RecordTamperedError(ValueError):
    """A record whose content does not match its own ``record_sha256``."""


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, compact, UTF-8 as is, no NaN)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _body(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != HASH_KEY}


def record_hash(record: Mapping[str, Any]) -> str:
    """sha256 of the record's canonical JSON without ``record_sha256``."""
    return hashlib.sha256(canonical_json(_body(record)).encode("utf-8")).hexdigest()


def seal(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its ``record_sha256`` set (any old value replaced)."""
    body = _body(record)
    return {**body, HASH_KEY: record_hash(body)}


def is_sealed(record: Any) -> bool:
    """Whether ``record`` is a mapping whose ``record_sha256`` matches its content (an edited one: no)."""
    return isinstance(record, Mapping) and record.get(HASH_KEY) == record_hash(record)


def read_json(path: str) -> Any:
    """The JSON at ``path``; ``None`` when there is no such file. Raises :class:`RecordFormatError` for a file
    that is not JSON."""
    fs, p = fsspec.core.url_to_fs(path)
    try:
        with fs.open(p, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordFormatError(
            f"{path} is not JSON ({e}); it was not written by this project's writers, or "
            "was cut short: write it again with write_json_atomic"
        ) from e


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` so no reader sees half of it: a temporary file
    and a rename on local disk, one PUT (which object stores apply whole) elsewhere."""
    data = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False).encode("utf-8")
    fs, p = fsspec.core.url_to_fs(path)
    if "/" in p.rstrip("/"):
        fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(p, data)
        return
    tmp = f"{p}.tmp-{os.getpid()}-{time.time_ns()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, p)


def read_sealed(path: str) -> dict[str, Any]:
    """The sealed record at ``path``, refusing a missing file, one without a hash, or one edited since."""
    record = read_json(path)
    if record is None:
        raise FileNotFoundError(
            f"{path}: no such record (the step that writes it has not run, or wrote elsewhere)"
        )
    if not isinstance(record, dict) or HASH_KEY not in record:
        raise RecordTamperedError(
            f"{path} is not a sealed record (no {HASH_KEY}); it was not written by "
            "openlab_records.write_sealed"
        )
    actual = record_hash(record)
    if actual != record[HASH_KEY]:
        raise RecordTamperedError(
            f"{path} was edited after it was written: its content hashes to {actual} but it claims "
            f"{record[HASH_KEY]}; the posted forecast is the one with the claimed hash, this file is not it"
        )
    return record


def write_sealed(path: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """Seal ``record`` and write it atomically; return the sealed record."""
    sealed = seal(record)
    write_json_atomic(path, sealed)
    return sealed
