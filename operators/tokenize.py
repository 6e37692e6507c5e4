"""tokenize: a document dataset -> the trainer's token cache (docs/token-cache.md), one cache shard per input
shard.

Outputs under ``output_path``::

    train/                    # one token cache: the train split, all domains
    train/{domain}/           # instead, with train_by_domain: one cache per domain (the sources of a mixture)
    validation/{domain}/      # one token cache per domain of the validation split (per-domain loss and bpb)
    tokenize.json             # where the caches are, the tokenizer identity, per-domain stats

Shards are tokenized in parallel: as Ray tasks when Ray is initialised (the executor's Ray backend), otherwise
in a process pool of ``num_workers`` (one worker runs in-process). Each worker loads the tokenizer once and
encodes documents in batches with ``encode_batch_fast`` (no offsets: the cache never needs them) and special
tokens encoded as text: EOS is placed only by the cache writer, one after every document.

Resume: a shard is skipped when every cache shard it produces has its record (the per-shard commit marker of
the cache format), so a re-run after a crash tokenizes only the shards that had not finished. The caches'
manifests are (re)written at the end with ``is_finished`` once every expected shard exists.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from moe_trainer.data.cache import CacheHeader, CacheWriter, DomainStats, write_shard
from moe_trainer.jsonio import write_json_atomic
from operators.documents import FileFormat, read_manifest, read_shard
from operators.train_tokenizer import load_tokenizer

_TOKENIZERS: dict[str, Tokenizer] = {}  # per worker process: load each tokenizer once


@dataclass(frozen=True)
class TokenizeConfig:
    input_path: str
    """A document dataset (output of ingest or decontaminate)."""
    tokenizer_path: str
    """Output of train_tokenizer (tokenizer.json + tokenizer_info.json)."""
    output_path: str
    """Where the caches are written."""
    num_workers: int | None = None
    """Worker processes when not on Ray (None: one per CPU core; 1: in this process)."""
    batch_docs: int = 256
    """Documents per encode_batch call."""
    backend: Literal["auto", "ray", "processes"] = "auto"
    """``auto``: Ray tasks when Ray is initialised, else processes; ``ray`` requires Ray to be up."""
    train_by_domain: bool = False
    """Write the train split as one cache per domain, ``train/{domain}/``, so a train step can mix the domains
    with weights of its own (``mixture``) instead of in their natural proportions."""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "ray", "processes"):
            raise ValueError(f"backend {self.backend!r} is not one of 'auto', 'ray', 'processes'")
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 or None, got {self.num_workers}")
        if self.batch_docs < 1:
            raise ValueError(f"batch_docs must be >= 1, got {self.batch_docs}")


@dataclass(frozen=True)
class _Task:
    """One input shard and the cache shard(s) it becomes: {domain or "*": cache path}."""

    split: str
    shard: dict[str, Any]
    targets: dict[str, str]


def _tokenizer(path: str) -> Tokenizer:
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = load_tokenizer(path)[0]
    return _TOKENIZERS[path]


def _encoded(tok: Tokenizer, docs: list[dict[str, str]], batch: int,
             dtype: np.dtype) -> Iterator[tuple[np.ndarray, str, int]]:
    for i in range(0, len(docs), batch):
        chunk = docs[i:i + batch]
        encodings = tok.encode_batch_fast([d["text"] for d in chunk], add_special_tokens=False)
        for doc, enc in zip(chunk, encodings, strict=True):
            yield np.asarray(enc.ids, dtype=dtype), doc["domain"], len(doc["text"].encode("utf-8"))


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to tokenize one input shard (picklable for Ray and process pools)."""

    input_path: str
    file_format: FileFormat
    task: _Task
    tokenizer_path: str
    header: CacheHeader
    batch_docs: int


def tokenize_shard(job: ShardJob) -> dict[str, Any]:
    """Tokenize one input shard into its cache shard(s); runs in a worker.

    Returns ``{"caches": {cache path: {"tokens", "documents"}}, "cpu_s", "wall_s"}``: the worker's own CPU and
    wall seconds for this shard (reading, encoding, writing), from which the step reports tokens per
    CPU-second.
    """
    cpu0, wall0 = time.process_time(), time.perf_counter()
    task, header = job.task, job.header
    docs = read_shard(job.input_path, task.shard, job.file_format)
    tok = _tokenizer(job.tokenizer_path)
    out: dict[str, Any] = {}
    for domain, cache_path in task.targets.items():
        selected = docs if domain == "*" else [d for d in docs if d["domain"] == domain]
        rec = write_shard(cache_path, task.shard["name"], header,
                          _encoded(tok, selected, job.batch_docs, header.dtype))
        out[cache_path] = {"tokens": rec.num_tokens, "documents": rec.num_documents}
    return {"caches": out, "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}


def _plan(config: TokenizeConfig, manifest: dict[str, Any]) -> tuple[list[_Task], dict[str, list[str]]]:
    """All tasks, and for each cache path the shard names it must end up with."""
    root = config.output_path.rstrip("/")
    tasks: list[_Task] = []
    expected: dict[str, list[str]] = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            if split == "train" and not config.train_by_domain:
                targets = {"*": f"{root}/train"}
            else:
                targets = {d: f"{root}/{split}/{d}" for d in sorted(shard["domains"])}
            for path in targets.values():
                expected.setdefault(path, []).append(shard["name"])
            tasks.append(_Task(split, shard, targets))
    return tasks, expected


def _pool_context() -> multiprocessing.context.BaseContext:
    """fork while this process has no other thread (cheapest); otherwise a fork server that has imported this
    module once, so workers start without re-importing numpy, tokenizers and pyarrow (spawn would, per
    worker)."""
    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _run(tasks: list[_Task], config: TokenizeConfig, file_format: FileFormat,
         header: CacheHeader) -> list[dict[str, Any]]:
    """Run every shard job on Ray, a process pool or in-process; return the jobs' results."""
    jobs = [ShardJob(config.input_path, file_format, t, config.tokenizer_path, header, config.batch_docs)
            for t in tasks]
    on_ray = False
    if config.backend != "processes":
        import ray

        on_ray = ray.is_initialized()
        if config.backend == "ray" and not on_ray:
            raise RuntimeError("tokenize: backend='ray' but Ray is not initialised; call ray.init() (or run "
                               "the "
                               "step on the executor's Ray backend), or use backend='auto'")
    workers = min(config.num_workers or os.cpu_count() or 1, max(len(jobs), 1))
    results: list[dict[str, Any]] = []
    if on_ray:
        remote = ray.remote(num_cpus=1, max_retries=2)(tokenize_shard)
        pending = [remote.remote(job) for job in jobs]
        with _progress(len(jobs), config) as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                results.append(_advance(bar, ray.get(ready[0])))
    elif workers == 1:
        with _progress(len(jobs), config) as bar:
            for job in jobs:
                results.append(_advance(bar, tokenize_shard(job)))
    else:
        # the pool forks its workers at the first submit, before the progress bar starts tqdm's monitor thread
        with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
            futures = [pool.submit(tokenize_shard, job) for job in jobs]
            with _progress(len(jobs), config) as bar:
                for fut in as_completed(futures):
                    results.append(_advance(bar, fut.result()))
    return results


def _progress(pending: int, config: TokenizeConfig) -> tqdm:
    return tqdm(total=pending, desc=f"tokenize {config.output_path.rstrip('/').rsplit('/', 1)[-1]}",
                unit="shard", file=sys.stderr, dynamic_ncols=True)


def _advance(bar: tqdm, result: dict[str, Any]) -> dict[str, Any]:
    bar.update(1)
    bar.set_postfix(tokens=sum(v["tokens"] for v in result["caches"].values()), refresh=False)
    return result


def tokenize(config: TokenizeConfig) -> dict[str, Any]:
    """Tokenize every shard not already finished, then write the cache manifests and tokenize.json."""
    manifest = read_manifest(config.input_path)
    _, info = load_tokenizer(config.tokenizer_path)
    header = CacheHeader(tokenizer={k: info[k] for k in ("sha256", "kind", "source", "eos_token")},
                         vocab_size=info["vocab_size"], eos_id=info["eos_id"])
    tasks, expected = _plan(config, manifest)
    writers = {path: CacheWriter(path, header, metadata={"documents": config.input_path,
                                                         "tokenizer_path": config.tokenizer_path})
               for path in expected}
    finished = {path: set(w.finished()) for path, w in writers.items()}
    pending = [t for t in tasks if any(t.shard["name"] not in finished[p] for p in t.targets.values())]
    if len(pending) < len(tasks):
        print(f"[tokenize] resuming: {len(tasks) - len(pending)} of {len(tasks)} shards already finished",
              file=sys.stderr)
    wall0 = time.perf_counter()
    results = _run(pending, config, manifest["file_format"], header)
    wall = time.perf_counter() - wall0
    tokens = sum(v["tokens"] for r in results for v in r["caches"].values())
    cpu = sum(r["cpu_s"] for r in results)
    work = {"shards": len(results), "tokens": tokens, "wall_seconds": wall, "worker_cpu_seconds": cpu,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "tokens_per_worker_cpu_s": tokens / cpu if cpu > 0 else 0.0}
    root = config.output_path.rstrip("/")
    caches = {path: writers[path].write_manifest(names) for path, names in expected.items()}
    train_paths = {p for p in caches if p == f"{root}/train" or p.startswith(f"{root}/train/")}
    summary = {"train": "train" if f"{root}/train" in caches else None,
               "train_domains": {p.rsplit("/", 1)[1]: p[len(root) + 1:] for p in sorted(train_paths)
                                 if p != f"{root}/train"},
               "validation": {p.rsplit("/", 1)[1]: p[len(root) + 1:] for p in caches if p not in train_paths},
               "tokenizer": info, "resumed_shards": len(tasks) - len(pending), "work": work,
               "header": asdict(header),
               "stats": {p[len(root) + 1:]: {"totals": m["totals"], "domains": m["domains"]}
                         for p, m in caches.items()}}
    write_json_atomic(f"{root}/tokenize.json", summary)
    for path in sorted(train_paths):
        doms = {k: DomainStats(**v) for k, v in caches[path]["domains"].items()}
        print(f"[tokenize] {path[len(root) + 1:]}: " + ", ".join(f"{k} {v.tokens} tokens / {v.bytes} bytes"
                                                                 for k, v in doms.items()), file=sys.stderr)
    return summary
