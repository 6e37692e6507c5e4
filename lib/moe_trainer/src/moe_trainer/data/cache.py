"""The token cache: THE on-storage format the tokenize step writes and the trainer reads
(docs/token-cache.md).

A cache is a directory (local path, ``gs://``, ``s3://``: everything goes through fsspec)::

    {cache}/manifest.json              # format, tokenizer identity, dtype, eos id, shards, stats
    {cache}/shards/{name}.tokens   # flat little-endian token ids (uint16 if vocab_size <= 65536, else uint32)
    {cache}/shards/{name}.offsets      # little-endian int64 [num_documents + 1]: document i is
                                       #   tokens[offsets[i]:offsets[i+1]] and ends with eos_id
    {cache}/shards/{name}.json         # the shard's record (stats and digests); written LAST = commit marker

Completion is per shard and atomic: the data files are written first (temporary name + rename locally; a
single object PUT on object stores, which only becomes visible once complete) and the shard's ``.json`` record
last, so a shard either has its record and complete data, or it does not count. A crashed writer resumes by
skipping the shards that have a record. ``finalize`` gathers the records into ``manifest.json`` (shards in
name order) and marks the cache finished; readers refuse an unfinished cache unless asked otherwise.

Readers memory-map local shards and read byte ranges through fsspec for remote ones; ``read(start, stop)``
gives random access to the concatenated token stream of all shards.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from moe_trainer.jsonio import read_json, write_atomic, write_json_atomic

CACHE_FORMAT = "moe-token-cache"
CACHE_VERSION = 1
MANIFEST = "manifest.json"
_OFFSET_DTYPE = np.dtype("<i8")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32; always little-endian on storage."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass(frozen=True)
class CacheHeader:
    """What every shard of one cache shares; a resumed writer must match it exactly."""

    tokenizer: dict[str, Any]
    """Tokenizer identity, e.g. {"name": "...", "sha256": "<of tokenizer.json>"}: caches from different
    tokenizers must never be mixed."""
    vocab_size: int
    eos_id: int

    def __post_init__(self) -> None:
        if not 0 <= self.eos_id < self.vocab_size:
            raise ValueError(f"eos_id {self.eos_id} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)


@dataclass
class DomainStats:
    """Per-domain counts: tokens (EOS included), documents, and UTF-8 bytes of the original text."""

    tokens: int = 0
    documents: int = 0
    bytes: int = 0

    def add(self, other: DomainStats) -> None:
        self.tokens += other.tokens
        self.documents += other.documents
        self.bytes += other.bytes


@dataclass
class ShardRecord:
    """One finished shard: file names (relative to the cache), counts, digests and per-domain stats."""

    name: str
    tokens_file: str
    offsets_file: str
    num_tokens: int
    num_documents: int
    num_bytes: int
    tokens_sha256: str
    offsets_sha256: str
    domains: dict[str, DomainStats] = field(default_factory=dict)

    @staticmethod
    def from_json(d: dict[str, Any]) -> ShardRecord:
        doms = {k: DomainStats(**v) for k, v in d.get("domains", {}).items()}
        return ShardRecord(**{**d, "domains": doms})


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def _fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = fsspec.core.url_to_fs(path)
    return fs, root


class _ShardAccumulator:
    """Turns documents into token bytes while hashing them and counting offsets and per-domain stats, so the
    shard streams to storage in one pass without holding it in memory."""

    def __init__(self, shard: str, cache_path: str, header: CacheHeader) -> None:
        self.shard, self.cache_path, self.header = shard, cache_path, header
        self.sha = hashlib.sha256()
        self.offsets = [0]
        self.domains: dict[str, DomainStats] = {}
        self.num_bytes = 0

    def stream(self, documents: Iterable[tuple[Sequence[int] | np.ndarray, str, int]],
               flush_bytes: int = 1 << 22) -> Iterator[bytes]:
        dtype, vocab = self.header.dtype, self.header.vocab_size
        eos = np.array([self.header.eos_id], dtype=dtype)
        pending: list[bytes] = []
        size = 0
        for ids, domain, nbytes in documents:
            arr = np.asarray(ids)
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= vocab):
                raise ValueError(
                    f"shard {self.shard!r} of cache {self.cache_path}: token id outside [0, {vocab}) in a "
                    f"document of domain {domain!r}; the tokenizer does not match vocab_size")
            b = np.concatenate([arr.astype(dtype, copy=False), eos]).tobytes()
            self.sha.update(b)
            self.offsets.append(self.offsets[-1] + arr.size + 1)
            self.domains.setdefault(domain, DomainStats()).add(
                DomainStats(tokens=arr.size + 1, documents=1, bytes=int(nbytes)))
            self.num_bytes += int(nbytes)
            pending.append(b)
            size += len(b)
            if size >= flush_bytes:
                yield b"".join(pending)
                pending, size = [], 0
        if pending:
            yield b"".join(pending)


def write_shard(cache_path: str, name: str, header: CacheHeader,
                documents: Iterable[tuple[Sequence[int] | np.ndarray, str, int]]) -> ShardRecord:
    """Write one shard from ``(token_ids, domain, utf8_bytes)`` per document; EOS is appended to every
    document.

    Runs in any worker (Ray task, subprocess): it touches only this shard's files. The ``.json`` record is
    written last; until it exists the shard is unfinished and a resumed run rewrites it from scratch.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"shard name must be a plain file name (no '/', no leading '.'), got {name!r}")
    fs, root = _fs(cache_path)
    fs.makedirs(_join(root, "shards"), exist_ok=True)
    acc = _ShardAccumulator(name, cache_path, header)
    tokens_file, offsets_file = f"shards/{name}.tokens", f"shards/{name}.offsets"
    write_atomic(fs, _join(root, tokens_file), acc.stream(documents))
    offsets_bytes = np.asarray(acc.offsets, dtype=_OFFSET_DTYPE).tobytes()
    write_atomic(fs, _join(root, offsets_file), [offsets_bytes])
    record = ShardRecord(name=name, tokens_file=tokens_file, offsets_file=offsets_file,
                         num_tokens=acc.offsets[-1], num_documents=len(acc.offsets) - 1,
                         num_bytes=acc.num_bytes,
                         tokens_sha256=acc.sha.hexdigest(),
                         offsets_sha256=hashlib.sha256(offsets_bytes).hexdigest(), domains=acc.domains)
    write_json_atomic(_join(cache_path.rstrip("/"), "shards", f"{name}.json"),
                      {"header": asdict(header), "record": asdict(record)})
    return record


class CacheWriter:
    """Coordinates the shards of one cache: resume bookkeeping and the final manifest.

    Shard contents are written by :func:`write_shard` (possibly in other processes); this object reads the
    shard records back, checks they were made with the same header, and writes ``manifest.json``.
    """

    def __init__(self, path: str, header: CacheHeader, metadata: dict[str, Any] | None = None) -> None:
        self.path, self.header, self.metadata = path.rstrip("/"), header, dict(metadata or {})
        self.fs, self.root = _fs(self.path)
        self.fs.makedirs(_join(self.root, "shards"), exist_ok=True)
        self._clean_stale_temporaries()

    def _clean_stale_temporaries(self) -> None:
        # a writer killed mid-shard leaves "<file>.tmp-xxxx" behind locally; it is never part of the cache
        if isinstance(self.fs, LocalFileSystem):
            for p in self.fs.glob(_join(self.root, "shards", "*.tmp-*")):
                self.fs.rm(p)

    def finished(self) -> dict[str, ShardRecord]:
        """Records of the shards already complete (what a resumed run skips), checked against the header."""
        out = {}
        for p in sorted(self.fs.glob(_join(self.root, "shards", "*.json"))):
            d = read_json(p, self.fs)
            if d["header"] != asdict(self.header):
                raise ValueError(
                    f"token cache {self.path}: shard record {p} was written with header {d['header']}, "
                    f"but this run uses {asdict(self.header)} (a different tokenizer, vocab_size or eos_id). "
                    "Write to a new output path, or delete the old cache to rebuild it.")
            rec = ShardRecord.from_json(d["record"])
            out[rec.name] = rec
        return out

    def write_manifest(self, expected_shards: Sequence[str] | None = None) -> dict[str, Any]:
        """Gather shard records into manifest.json; the cache is finished when every expected shard is."""
        records = self.finished()
        missing = sorted(set(expected_shards or []) - set(records))
        domains: dict[str, DomainStats] = {}
        for rec in records.values():
            for dom, stats in rec.domains.items():
                domains.setdefault(dom, DomainStats()).add(stats)
        shards = [asdict(records[k]) for k in sorted(records)]
        manifest = {
            "format": CACHE_FORMAT, "version": CACHE_VERSION, **asdict(self.header),
            "dtype": self.header.dtype.name, "byteorder": "little",
            "shards": shards, "finished_shards": sorted(records),
            "expected_shards": sorted(expected_shards) if expected_shards is not None else None,
            "is_finished": not missing,
            "totals": {"tokens": sum(s["num_tokens"] for s in shards),
                       "documents": sum(s["num_documents"] for s in shards),
                       "bytes": sum(s["num_bytes"] for s in shards)},
            "domains": {k: asdict(v) for k, v in sorted(domains.items())},
            "metadata": self.metadata,
        }
        write_json_atomic(_join(self.path, MANIFEST), manifest)
        return manifest
def _missing_cache(path: str, fs: fsspec.AbstractFileSystem, root: str) -> str:
    """Why there is no cache at `path`, and the fix: the caches the directory holds, or the closest sibling
    (a subpath typo such as `trian` for `train`), or else that the tokenize step has not written it."""
    head = f"no token cache at {path}: {MANIFEST} is missing"
    if fs.isdir(root):
        manifests = fs.glob(_join(root, "**", MANIFEST))
        found = sorted(p[len(root):].strip("/").rsplit("/", 1)[0] for p in manifests)
        if found:
            return f"{head}; the directory holds caches at {', '.join(found[:8])}: point at one of them"
    parent, _, name = root.rstrip("/").rpartition("/")
    if parent and fs.isdir(parent):
        siblings = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(parent, detail=False))
        close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
        if close:
            return f"{head}; {parent} has {', '.join(siblings[:8])}: did you mean {close[0]!r}?"
    return f"{head} (run the tokenize step first, or point at the cache directory itself)"


class TokenCache:
    """Read side: random access to the concatenated token stream of a finished cache.

    ``read(start, stop)`` returns tokens ``[start, stop)`` of the stream (shards in manifest order);
    ``doc_starts`` holds the global start offset of every document plus the total length at the end.
    Local shards are memory-mapped; remote shards are read by byte range through fsspec.
    """

    def __init__(self, path: str, *, allow_unfinished: bool = False) -> None:
        self.path = path.rstrip("/")
        self.fs, self.root = _fs(self.path)
        manifest_path = _join(self.root, MANIFEST)
        manifest = read_json(manifest_path, self.fs)
        if manifest is None:
            raise FileNotFoundError(_missing_cache(self.path, self.fs, self.root))
        self.manifest: dict[str, Any] = manifest
        if self.manifest.get("format") != CACHE_FORMAT or self.manifest.get("version") != CACHE_VERSION:
            raise ValueError(f"{manifest_path} is not a {CACHE_FORMAT} v{CACHE_VERSION} manifest "
                             f"(format={self.manifest.get('format')!r}, "
                             f"version={self.manifest.get('version')!r})")
        if not self.manifest["is_finished"] and not allow_unfinished:
            expected = set(self.manifest["expected_shards"] or [])
            missing = sorted(expected - set(self.manifest["finished_shards"]))
            raise ValueError(f"token cache {self.path} is unfinished (missing shards {missing[:5]}...); "
                             "re-run "
                             "the tokenize step to complete it, or pass allow_unfinished=True")
        self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self.eos_id: int = self.manifest["eos_id"]
        self.vocab_size: int = self.manifest["vocab_size"]
        self.shards = [ShardRecord.from_json(s) for s in self.manifest["shards"]]
        self._local = isinstance(self.fs, LocalFileSystem)
        self._token_arrays: list[np.ndarray | None] = []
        self._bases = [0]  # global token offset of each shard, plus the total at the end
        starts = []
        for rec in self.shards:
            starts.append(self._load_offsets(rec)[:-1] + self._bases[-1])
            self._append_shard(rec)
        self.num_tokens = int(sum(r.num_tokens for r in self.shards))
        self.num_documents = int(sum(r.num_documents for r in self.shards))
        self.doc_starts = np.concatenate([*starts,
                                          np.array([self.num_tokens], dtype=np.int64)]).astype(np.int64)

    def _append_shard(self, rec: ShardRecord) -> None:
        self._bases.append(self._bases[-1] + rec.num_tokens)
        path = _join(self.root, rec.tokens_file)
        size = self.fs.size(path)
        if size != rec.num_tokens * self.dtype.itemsize:
            raise ValueError(f"token cache {self.path}: {rec.tokens_file} has {size} bytes, the manifest "
                             "says "
                             f"{rec.num_tokens} {self.dtype.name} tokens "
                             f"({rec.num_tokens * self.dtype.itemsize} "
                             "bytes); the shard is truncated or corrupt, re-run tokenize")
        if self._local and rec.num_tokens:
            self._token_arrays.append(np.memmap(path, dtype=self.dtype, mode="r", shape=(rec.num_tokens,)))
        else:
            self._token_arrays.append(None)

    def _load_offsets(self, rec: ShardRecord) -> np.ndarray:
        with self.fs.open(_join(self.root, rec.offsets_file), "rb") as f:
            offsets = np.frombuffer(f.read(), dtype=_OFFSET_DTYPE).astype(np.int64)
        if offsets.size != rec.num_documents + 1 or offsets[-1] != rec.num_tokens:
            raise ValueError(f"token cache {self.path}: {rec.offsets_file} holds {offsets.size} offsets "
                             "ending at "
                             f"{offsets[-1] if offsets.size else None}, but the manifest says "
                             f"{rec.num_documents} "
                             f"documents and {rec.num_tokens} tokens; the shard is corrupt, re-run tokenize")
        return offsets

    # ---- public read API
    @property
    def domains(self) -> dict[str, DomainStats]:
        return {k: DomainStats(**v) for k, v in self.manifest["domains"].items()}

    @property
    def num_bytes(self) -> int:
        return int(self.manifest["totals"]["bytes"])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the whole stream, as a fresh array of the cache dtype."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside the cache's [0, {self.num_tokens})")
        bases = self._bases
        out = np.empty(stop - start, dtype=self.dtype)
        i = int(np.searchsorted(bases, start, side="right")) - 1
        pos = start
        while pos < stop:
            lo, hi = pos - bases[i], min(stop, bases[i + 1]) - bases[i]
            if hi > lo:
                out[pos - start: pos - start + hi - lo] = self._read_shard(i, lo, hi)
            pos = bases[i] + hi
            i += 1
        return out

    def _read_shard(self, i: int, lo: int, hi: int) -> np.ndarray:
        arr = self._token_arrays[i]
        if arr is not None:
            return arr[lo:hi]
        item = self.dtype.itemsize
        raw = self.fs.cat_file(_join(self.root, self.shards[i].tokens_file), start=lo * item, end=hi * item)
        return np.frombuffer(raw, dtype=self.dtype)

    def document(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` (its trailing EOS included)."""
        return self.read(int(self.doc_starts[i]), int(self.doc_starts[i + 1]))

    def verify(self) -> None:
        """Recompute every shard's digests; raise naming the first shard whose files do not match."""
        for rec in self.shards:
            for file, want in ((rec.tokens_file, rec.tokens_sha256), (rec.offsets_file, rec.offsets_sha256)):
                sha = hashlib.sha256()
                with self.fs.open(_join(self.root, file), "rb") as f:
                    while chunk := f.read(1 << 22):
                        sha.update(chunk)
                if sha.hexdigest() != want:
                    raise ValueError(f"token cache {self.path}: {file} has sha256 {sha.hexdigest()}, the "
                                     "manifest "
                                     f"records {want}; the file was modified or truncated, re-run tokenize")
