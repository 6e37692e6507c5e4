"""Ingest: raw sources -> a sharded document dataset (operators/documents.py) with a train/validation split.

Sources are local files, globs, or any fsspec URL (gs://, s3://, https://, compressed files are decompressed
by extension). A source's ``kind`` says how a file becomes documents: ``files`` (each file is one document),
``jsonl`` (each line is a JSON object with a text field) or ``pydoc_topics`` (the Python documentation topics
that ship with CPython in ``pydoc_data.topics``, one document per topic: real English prose on every machine).

Bad input never crashes the step halfway and is never dropped silently: binary files (a NUL byte in the first
8 KiB), undecodable UTF-8, empty or whitespace-only documents, malformed JSONL lines and exact duplicates are
counted per reason in the manifest's ``skipped`` table, with example paths, and printed at the end. A source
pattern that matches no file at all is a configuration error and stops the step before anything is written.

The split is deterministic and content-based: a document goes to validation when
``sha256(split_salt + text)`` falls below ``validation_fraction`` of the hash space, so the same text lands in
the same split whatever its file name or the order of sources, and exact duplicates cannot straddle the split.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import fsspec

from operators.documents import FileFormat, SplitWriter, write_manifest

SourceKind = Literal["files", "jsonl", "pydoc_topics"]
_SNIFF_BYTES = 8192
_MAX_EXAMPLES = 20


@dataclass(frozen=True)
class Source:
    """One group of inputs sharing a domain label."""

    domain: str
    """Domain label of every document from this source (per-domain statistics and evaluation use it)."""
    paths: tuple[str, ...] = ()
    """Files, globs (``**`` recurses) or fsspec URLs. Unused for ``kind="pydoc_topics"``."""
    kind: SourceKind = "files"
    """How a file becomes documents: ``files``, ``jsonl`` or ``pydoc_topics``."""
    exclude: tuple[str, ...] = ()
    """Substrings; a matched path containing any of them is left out (counted as ``excluded``)."""
    text_field: str = "text"
    """For ``jsonl``: the field holding the document text."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.domain):
            raise ValueError(f"Source.domain {self.domain!r} must be a label of letters, digits, '_', '.', "
                             "'-' "
                             "(it names per-domain validation caches), e.g. 'python' or 'prose'")
        if self.kind not in ("files", "jsonl", "pydoc_topics"):
            raise ValueError(f"Source.kind {self.kind!r} is not one of 'files', 'jsonl', 'pydoc_topics'")
        if self.kind != "pydoc_topics" and not self.paths:
            raise ValueError(f"Source for domain {self.domain!r} has no paths; give files, globs or URLs")


@dataclass(frozen=True)
class IngestConfig:
    sources: tuple[Source, ...]
    """Where the documents come from."""
    output_path: str
    """Where the dataset is written (manifest.json, train/, validation/)."""
    validation_fraction: float = 0.05
    """Share of documents (by content hash) held out for validation."""
    split_salt: str = "split-v1"
    """Changing it reshuffles which documents are held out."""
    file_format: FileFormat = "jsonl"
    """Shard file format: ``jsonl`` or ``parquet``."""
    shard_bytes: int = 2 << 20
    """Approximate UTF-8 bytes of text per shard (the unit of parallelism of tokenize)."""
    decode_errors: Literal["skip", "replace"] = "skip"
    """Undecodable UTF-8: ``skip`` the document, or ``replace`` bad bytes with U+FFFD and keep it (counted
    either way)."""
    deduplicate: bool = True
    """Drop exact duplicate texts (counted as ``duplicate``)."""

    def raw_input_paths(self) -> tuple[str, ...]:
        """Files read that no config value names: the module behind ``kind="pydoc_topics"`` (the engine
        fingerprints them as raw inputs; paths and globs in `sources` are config values)."""
        if not any(s.kind == "pydoc_topics" for s in self.sources):
            return ()
        import pydoc_data.topics

        return (str(pydoc_data.topics.__file__),)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("IngestConfig.sources is empty; give at least one Source")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.file_format not in ("jsonl", "parquet"):
            raise ValueError(f"file_format {self.file_format!r} is not one of 'jsonl', 'parquet'")
        if self.decode_errors not in ("skip", "replace"):
            raise ValueError(f"decode_errors {self.decode_errors!r} is not one of 'skip', 'replace'")
        if self.shard_bytes < 1:
            raise ValueError(f"shard_bytes must be >= 1, got {self.shard_bytes}")


@dataclass
class _Skips:
    """Counts and example locations of everything that did not become a document, by reason."""

    table: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        entry = self.table.setdefault(reason, {"count": 0, "examples": []})
        entry["count"] += 1
        if len(entry["examples"]) < _MAX_EXAMPLES:
            entry["examples"].append(where)


def _base(pattern: str) -> str:
    """The directory a pattern starts from: everything before the first component holding a glob character."""
    path = fsspec.core.url_to_fs(pattern)[1]
    parts = path.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "*?["):
            return "/".join(parts[:i])
    return "/".join(parts[:-1])


def _expand(source: Source) -> list[tuple[fsspec.core.OpenFile, str]]:
    """(file, path relative to its pattern's base directory) for every file a source matches."""
    files: list[tuple[fsspec.core.OpenFile, str]] = []
    for pattern in source.paths:
        matched = fsspec.open_files(pattern, mode="rb", compression="infer")
        if not matched:
            raise FileNotFoundError(f"ingest source {pattern!r} (domain {source.domain!r}) matches no file; "
                                    "check the path or glob (use '**' to recurse into directories)")
        base = _base(pattern)
        files.extend((of, of.path[len(base):].lstrip("/") if of.path.startswith(base) else of.path)
                     for of in matched)
    return sorted(files, key=lambda f: f[0].full_name)


def _decode(raw: bytes, where: str, policy: str, skips: _Skips) -> str | None:
    if b"\x00" in raw[:_SNIFF_BYTES]:
        skips.add("binary", where)
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        skips.add("undecodable", where)
        if policy == "skip":
            return None
        text = raw.decode("utf-8", errors="replace")
    return text.removeprefix("\ufeff")


def _raw_documents(source: Source, config: IngestConfig, skips: _Skips) -> Iterator[tuple[str, str, str]]:
    """(text, where, relpath) for every candidate document of a source, before empty/duplicate checks."""
    if source.kind == "pydoc_topics":
        from pydoc_data.topics import topics

        for name in sorted(topics):
            yield topics[name], f"pydoc_data.topics:{name}", f"pydoc_data/topics/{name}"
        return
    for of, relpath in _expand(source):
        where = of.full_name
        if any(x in where for x in source.exclude):
            skips.add("excluded", where)
            continue
        with of as f:
            raw = f.read()
        if source.kind == "files":
            text = _decode(raw, where, config.decode_errors, skips)
            if text is not None:
                yield text, where, relpath
            continue
        for lineno, line in enumerate(raw.splitlines(), start=1):
            loc = f"{where}:{lineno}"
            if not line.strip():
                continue
            decoded = _decode(line, loc, config.decode_errors, skips)
            if decoded is None:
                continue
            try:
                obj = json.loads(decoded)
                text = obj[source.text_field]
                if not isinstance(text, str):
                    raise TypeError(f"field {source.text_field!r} is {type(text).__name__}, not a string")
            except (ValueError, KeyError, TypeError):
                skips.add("malformed_jsonl", loc)
                continue
            yield text, loc, relpath


def _in_validation(text: str, config: IngestConfig) -> bool:
    digest = hashlib.sha256((config.split_salt + "\0" + text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < config.validation_fraction * 2**64


def ingest(config: IngestConfig) -> dict[str, Any]:
    """Read every source, write train/validation shards and manifest.json; return the manifest."""
    for source in config.sources:  # fail on a pattern that matches nothing before writing anything
        if source.kind != "pydoc_topics":
            _expand(source)
    skips, seen = _Skips(), set()
    writers = {split: SplitWriter(config.output_path, split, config.file_format, config.shard_bytes)
               for split in ("train", "validation")}
    for source in config.sources:
        for text, where, relpath in _raw_documents(source, config, skips):
            if not text.strip():
                skips.add("empty", where)
                continue
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if config.deduplicate:
                if digest in seen:
                    skips.add("duplicate", where)
                    continue
                seen.add(digest)
            split = "validation" if _in_validation(text, config) else "train"
            writers[split].add({"id": digest[:24], "text": text, "domain": source.domain, "source": where,
                                "relpath": relpath})
    splits = {name: w.summary() for name, w in writers.items()}
    if not splits["train"]["documents"]:
        raise ValueError(f"ingest into {config.output_path} produced no training documents (skipped: "
                         f"{ {k: v['count'] for k, v in skips.table.items()} }); check the sources")
    manifest = write_manifest(config.output_path, config.file_format, splits, {
        "skipped": dict(sorted(skips.table.items())),
        "config": {**asdict(config), "sources": [asdict(s) for s in config.sources]},
    })
    _print_summary(config, splits, skips)
    return manifest


def _print_summary(config: IngestConfig, splits: dict[str, dict[str, Any]], skips: _Skips) -> None:
    parts = [f"{s}: {v['documents']} docs, {v['bytes'] / 1e6:.2f} MB, {len(v['shards'])} shards"
             for s, v in splits.items()]
    print(f"[ingest] {config.output_path}: " + "; ".join(parts), file=sys.stderr)
    for reason, entry in sorted(skips.table.items()):
        print(f"[ingest] skipped {entry['count']} ({reason}), e.g. {entry['examples'][0]}", file=sys.stderr)
