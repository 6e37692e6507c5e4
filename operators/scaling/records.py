"""Frozen JSON records: canonical form, their own sha256, and reading them back with the hash checked.

A record (``prediction.json``, ``verdict.json``) carries ``record_sha256``: the sha256 of the record's
canonical JSON *without* that key (sorted keys, no whitespace, UTF-8, no NaN or infinity; the RFC 8785
habit). Anyone can recompute it with ``json.dumps(record_without_hash, sort_keys=True, separators=(",",
":"), ensure_ascii=False, allow_nan=False)``, so an edit of the file after the fact is detected, and the
hash quoted in the issue comment pins which record was posted. The engine (marin/tracking/predictions.py)
checks records with the same rule; docs/scaling-ladder.md states the format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import fsspec

from moe_trainer.data.cache import write_json_atomic

HASH_KEY = "record_sha256"


class RecordTamperedError(ValueError):
    """A record's content does not match its own ``record_sha256``."""


def canonical(record: dict[str, Any]) -> str:
    """The canonical JSON text of ``record`` minus its hash key."""
    body = {k: v for k, v in record.items() if k != HASH_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def record_hash(record: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(record).encode("utf-8")).hexdigest()


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its ``record_sha256`` set."""
    body = {k: v for k, v in record.items() if k != HASH_KEY}
    return {**body, HASH_KEY: record_hash(body)}


def write_record(path: str, record: dict[str, Any]) -> dict[str, Any]:
    """Seal and write ``record`` atomically; return the sealed record."""
    sealed = seal(record)
    write_json_atomic(path, sealed)
    return sealed


def read_json(path: str) -> Any:
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        raise FileNotFoundError(path)
    with fs.open(p, "r") as f:
        return json.load(f)


def read_record(path: str) -> dict[str, Any]:
    """The record at ``path``, refusing one whose content does not match its ``record_sha256``."""
    record = read_json(path)
    if not isinstance(record, dict) or HASH_KEY not in record:
        raise RecordTamperedError(
            f"{path} is not a sealed record (no {HASH_KEY}); it was not written by "
            "operators.scaling.records.write_record"
        )
    actual = record_hash(record)
    if actual != record[HASH_KEY]:
        raise RecordTamperedError(
            f"{path} was edited after it was written: its content hashes to {actual} but "
            f"it claims {record[HASH_KEY]}; the posted forecast is the one with the "
            "claimed hash, this file is not it"
        )
    return record
