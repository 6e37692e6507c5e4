"""The document dataset: what ``ingest`` writes and ``decontaminate`` rewrites, and what ``train_tokenizer``,
``tokenize`` and ``decontaminate`` read.

Layout (any fsspec filesystem)::

    {path}/manifest.json
    {path}/{split}/{shard:05d}.jsonl | .parquet     # split is "train" or "validation"

Every record is ``{"id": str, "text": str, "domain": str, "source": str, "relpath": str}``: ``source`` is the
full URL of the file (and, for JSONL inputs, the line) a document came from; ``relpath`` is that file's path
below the directory its source pattern started from, the part that names the data rather than where it lives,
which is what ``decontaminate`` checks when it refuses files named like evaluation splits. The manifest lists,
per split, every shard with its document count, UTF-8 byte count, sha256 and per-domain counts. Shards are
written atomically (temporary name + rename locally, one object PUT on object stores) and the manifest last,
so a dataset with a manifest is complete.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from moe_trainer.jsonio import write_bytes_atomic, write_json_atomic

DATASET_FORMAT = "documents"
DATASET_VERSION = 1
SPLITS = ("train", "validation")
RECORD_FIELDS = ("id", "text", "domain", "source", "relpath")
FileFormat = Literal["jsonl", "parquet"]


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


@dataclass
class SplitWriter:
    """Writes the documents of one split into shards of about ``shard_bytes`` bytes of text each."""

    root: str
    split: str
    file_format: FileFormat = "jsonl"
    shard_bytes: int = 2 << 20
    shards: list[dict[str, Any]] = field(default_factory=list)
    _buffer: list[dict[str, str]] = field(default_factory=list)
    _buffer_bytes: int = 0

    def add(self, record: dict[str, str]) -> None:
        self._buffer.append(record)
        self._buffer_bytes += len(record["text"].encode("utf-8"))
        if self._buffer_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        self.shards.append(write_records(self.root, self.split, f"{len(self.shards):05d}", self._buffer,
                                         self.file_format))
        self._buffer, self._buffer_bytes = [], 0

    def summary(self) -> dict[str, Any]:
        self.flush()
        return summarize_split(self.shards)


def write_records(root: str, split: str, name: str, records: list[dict[str, str]],
                  file_format: FileFormat) -> dict[str, Any]:
    """Write one shard atomically and return its manifest entry (counts, bytes, sha256, per-domain counts)."""
    rel = f"{split}/{name}.{file_format}"
    data = encode_records(records, file_format)
    write_bytes_atomic(_join(root, rel), data)
    domains: dict[str, dict[str, int]] = {}
    total = 0
    for r in records:
        nbytes = len(r["text"].encode("utf-8"))
        d = domains.setdefault(r["domain"], {"documents": 0, "bytes": 0})
        d["documents"] += 1
        d["bytes"] += nbytes
        total += nbytes
    return {"name": name, "path": rel, "documents": len(records), "bytes": total,
            "sha256": hashlib.sha256(data).hexdigest(), "domains": dict(sorted(domains.items()))}


def summarize_split(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """A split's manifest entry from its shard entries."""
    domains: dict[str, dict[str, int]] = {}
    for s in shards:
        for k, v in s["domains"].items():
            d = domains.setdefault(k, {"documents": 0, "bytes": 0})
            d["documents"] += v["documents"]
            d["bytes"] += v["bytes"]
    return {"shards": shards, "documents": sum(s["documents"] for s in shards),
            "bytes": sum(s["bytes"] for s in shards), "domains": dict(sorted(domains.items()))}


def encode_records(records: list[dict[str, str]], file_format: FileFormat) -> bytes:
    if file_format == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    table = pa.table({k: [r[k] for r in records] for k in RECORD_FIELDS})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def write_manifest(root: str, file_format: FileFormat, splits: dict[str, dict[str, Any]],
                   extra: dict[str, Any]) -> dict[str, Any]:
    manifest = {"format": DATASET_FORMAT, "version": DATASET_VERSION, "file_format": file_format,
                "splits": splits, **extra}
    write_json_atomic(_join(root, "manifest.json"), manifest)
    return manifest


def read_manifest(root: str) -> dict[str, Any]:
    """The manifest of a document dataset, with an error that says which step makes one if it is missing."""
    path = _join(root, "manifest.json")
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        raise FileNotFoundError(f"no document dataset at {root}: manifest.json is missing (point at the "
                                "output "
                                "path of an ingest or decontaminate step)")
    with fs.open(p, "rb") as f:
        manifest = json.load(f)
    if not isinstance(manifest, dict) or manifest.get("format") != DATASET_FORMAT:
        found = f"format={manifest.get('format')!r}" if isinstance(manifest, dict) else "not a JSON object"
        raise ValueError(f"{path} is not a document dataset manifest ({found})")
    return manifest


def read_shard(root: str, shard: dict[str, Any], file_format: FileFormat) -> list[dict[str, str]]:
    """All records of one shard, checked against the manifest's digest."""
    with fsspec.open(_join(root, shard["path"]), "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != shard["sha256"]:
        raise ValueError(f"document shard {_join(root, shard['path'])} does not match the sha256 in its "
                         "manifest; "
                         "it was modified or truncated: re-run the step that wrote it")
    if file_format == "jsonl":
        return [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    # pyarrow is untyped (Any); a shard's table has the string columns the writer gave it
    return cast("list[dict[str, str]]", pq.read_table(io.BytesIO(data)).to_pylist())


def iter_documents(root: str, split: str = "train") -> Iterator[dict[str, str]]:
    """Every record of ``split`` in shard order."""
    manifest = read_manifest(root)
    if split not in manifest["splits"]:
        raise KeyError(f"document dataset {root} has no split {split!r}; it has {sorted(manifest['splits'])}")
    for shard in manifest["splits"][split]["shards"]:
        yield from read_shard(root, shard, manifest["file_format"])
