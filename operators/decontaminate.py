"""decontaminate: find and remove training documents that contain registered evaluation data.

The method (docs/data.md has the design and the reasons):

1. Refuse training documents whose source file is named like an evaluation split (``test.json``,
   ``validation-00000.parquet``, a ``dev/`` directory...), unless ``allow_eval_like_names``: the GSM8K test
   set leaked into Marin's training data through a bundle that contained a ``test.json``.
2. Fingerprint every evaluation set: the normalised n-grams (default 13, GPT-3 style) of each evaluation
   document, held as an exact sorted hash array, or as a Bloom filter (written with numpy next to the report)
   when the evaluation sets are large. Evaluation documents shorter than ``n`` tokens cannot be checked and
   are counted as such.
3. Stream the training documents once; keep, per training document, the n-grams that hit an evaluation set.
   (With a Bloom filter a false positive only costs memory: contamination is measured on the evaluation side
   against the hashes actually seen in training, so a false hit never matches an evaluation n-gram.)
4. An evaluation document is *contaminated* when at least ``doc_overlap_threshold`` of its n-grams occur in
the
   training data. A training document is *removed* when it alone holds at least that share of a contaminated
   evaluation document (it contains the leak, not just shared boilerplate).
5. Write the filtered training set (same shards, same format; the validation split is copied), ``report.json``
   with the per-evaluation-set contamination and every overlapping pair, then fail if an evaluation set's
   contaminated share exceeds ``max_contamination``, naming the set, the documents and how to proceed.

Mixtures: the training documents of a mixture's sources are the domains of one document dataset (ingest labels
each source's documents with its domain; tokenize's ``train_by_domain`` makes one cache per domain). The
report counts documents, removed and kept documents per domain (``training_domains``) and names the domain of
every overlapping training document, so a leak is traced to the mixture source that carries it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import fsspec
import numpy as np

from moe_trainer.jsonio import write_json_atomic
from operators.documents import (
    iter_documents,
    read_manifest,
    read_shard,
    summarize_split,
    write_manifest,
    write_records,
)
from operators.ngrams import BloomFilter, exact_member, ngram_hashes, normalize

_EVAL_WORDS = {"test", "tests", "testing", "validation", "valid", "val", "dev", "eval", "evaluation",
               "heldout",
               "holdout"}
_SPLIT_RE = re.compile(r"[^a-z0-9]+")
_MAX_LISTED = 10


@dataclass(frozen=True)
class EvalSet:
    """A registered evaluation set."""

    name: str
    """Name used in the report and error messages, e.g. 'gsm8k' or 'held-out python'."""
    path: str
    """A document dataset (its ``split`` is read), or JSONL files/globs (``text`` field), or text files/globs
    (one document per file)."""
    split: str = "validation"
    """Which split of a document dataset holds the evaluation documents."""


@dataclass(frozen=True)
class DecontaminateConfig:
    input_path: str
    """The training documents: a document dataset (its train split is checked and filtered)."""
    eval_sets: tuple[EvalSet, ...]
    """The registered evaluation sets to protect."""
    output_path: str
    """The filtered document dataset, report.json and any Bloom filters."""
    ngram: int = 13
    """n of the n-grams (GPT-3 used 13; Marin's default is 8)."""
    doc_overlap_threshold: float = 0.5
    """Share of an evaluation document's n-grams found in training that makes it contaminated."""
    max_contamination: float = 0.0
    """Highest tolerated share of contaminated documents per evaluation set; above it the step fails."""
    method: Literal["auto", "exact", "bloom"] = "auto"
    """``exact`` hash arrays, a ``bloom`` filter, or ``auto`` (exact up to ``exact_max_ngrams``)."""
    exact_max_ngrams: int = 50_000_000
    """auto switches to a Bloom filter above this many evaluation n-grams (8 bytes each when exact)."""
    bloom_fpr: float = 1e-4
    """Bloom filter false-positive rate."""
    allow_eval_like_names: bool = False
    """Accept training documents from files named like evaluation splits (test/validation/dev...)."""

    def __post_init__(self) -> None:
        if not self.eval_sets:
            raise ValueError("DecontaminateConfig.eval_sets is empty: register at least one evaluation set")
        names = [e.name for e in self.eval_sets]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluation set names must be unique, got {names}")
        if self.ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {self.ngram}")
        if not 0 < self.doc_overlap_threshold <= 1:
            raise ValueError(f"doc_overlap_threshold must be in (0, 1], got {self.doc_overlap_threshold}")
        if not 0 <= self.max_contamination <= 1:
            raise ValueError(f"max_contamination must be in [0, 1], got {self.max_contamination}")
        if self.method not in ("auto", "exact", "bloom"):
            raise ValueError(f"method {self.method!r} is not one of 'auto', 'exact', 'bloom'")


class ContaminationError(RuntimeError):
    """An evaluation set is more contaminated than max_contamination allows."""


def looks_like_eval_split(source: str) -> bool:
    """True when a path component or file-name word is an evaluation-split word (test, validation, dev...)."""
    path = source.split("://", 1)[-1].lower()
    path = re.sub(r":\d+$", "", path)  # a JSONL source carries ":<line>"
    parts = [p for p in path.split("/") if p]
    return any(w in _EVAL_WORDS for part in parts for w in _SPLIT_RE.split(part))


def _eval_documents(es: EvalSet) -> Iterator[dict[str, str]]:
    fs, root = fsspec.core.url_to_fs(es.path)
    if fs.exists(f"{root.rstrip('/')}/manifest.json"):
        yield from iter_documents(es.path, es.split)
        return
    files = fsspec.open_files(es.path, mode="rb", compression="infer")
    if not files:
        raise FileNotFoundError(f"evaluation set {es.name!r}: {es.path} matches no file and is not a "
                                "document "
                                "dataset")
    import json

    for of in sorted(files, key=lambda f: f.full_name):
        with of as f:
            text = f.read().decode("utf-8")
        if of.full_name.endswith((".jsonl", ".jsonl.gz")):
            for i, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    yield {"id": f"{of.full_name}:{i}", "text": json.loads(line)["text"],
                           "source": f"{of.full_name}:{i}"}
        else:
            yield {"id": of.full_name, "text": text, "source": of.full_name}


class _Fingerprint:
    """The n-grams of one evaluation set, exact or in a Bloom filter."""

    def __init__(self, es: EvalSet, config: DecontaminateConfig) -> None:
        self.es, self.n = es, config.ngram
        self.documents = self.too_short = 0
        arrays = []
        for doc in _eval_documents(es):
            self.documents += 1
            h = ngram_hashes(doc["text"], self.n)
            if h.size == 0:
                self.too_short += 1
            arrays.append(h)
        all_h = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, np.uint64)
        self.ngrams = int(all_h.size)
        too_many = self.ngrams > config.exact_max_ngrams
        use_bloom = config.method == "bloom" or (config.method == "auto" and too_many)
        self.method = "bloom" if use_bloom else "exact"
        self.bloom: BloomFilter | None = None
        self.exact = all_h
        if use_bloom:
            self.bloom = BloomFilter(max(self.ngrams, 1), config.bloom_fpr)
            self.bloom.add(all_h)
            self.exact = np.empty(0, np.uint64)

    def member(self, h: np.ndarray) -> np.ndarray:
        return self.bloom.contains(h) if self.bloom is not None else exact_member(self.exact, h)


def _refuse_eval_named(config: DecontaminateConfig, bad: list[str]) -> None:
    if bad and not config.allow_eval_like_names:
        listed = "\n  ".join(bad[:_MAX_LISTED])
        raise ValueError(
            f"decontaminate: {len(bad)} training documents in {config.input_path} come from files named like "
            f"evaluation splits (test/validation/dev...):\n  {listed}\nEvaluation data must not be trained "
            "on "
            "(Marin's GSM8K test set leaked this way). Exclude these files in the ingest step "
            "(Source.exclude), "
            "or, if they are not evaluation data, set allow_eval_like_names=True.")


@dataclass
class _TrainingScan:
    """What one pass over the training documents found: per evaluation set the n-grams seen in training, per
    training document the n-grams that hit each set, and the counts the report needs."""

    seen: list[list[np.ndarray]]
    """Per evaluation set, the hashes of its n-grams found in each training document that hit it."""
    hits: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    """Training document id -> evaluation set index -> the hashes it shares with that set."""
    sources: dict[str, str] = field(default_factory=dict)
    """Source of every training document with a hit."""
    domain_of: dict[str, str] = field(default_factory=dict)
    """Domain (mixture source) of every training document with a hit."""
    per_domain: dict[str, int] = field(default_factory=dict)
    """Training documents per domain."""
    documents: int = 0
    eval_named: list[str] = field(default_factory=list)
    """Sources of training documents named like evaluation splits."""


def _scan_training(config: DecontaminateConfig, prints: list[_Fingerprint]) -> _TrainingScan:
    """Pass 1 over training: which n-grams of each evaluation set appear, and in which training documents."""
    scan = _TrainingScan(seen=[[] for _ in prints])
    for doc in iter_documents(config.input_path, "train"):
        scan.documents += 1
        domain = str(doc.get("domain", ""))
        scan.per_domain[domain] = scan.per_domain.get(domain, 0) + 1
        # judge the path below the source's base directory: where the data lives (a pytest tmp dir, a
        # /home/test/ account) says nothing about what it is
        if looks_like_eval_split(doc.get("relpath", doc["source"])):
            scan.eval_named.append(doc["source"])
        h = ngram_hashes(doc["text"], config.ngram)
        for e, fp in enumerate(prints):
            hit = h[fp.member(h)]
            if hit.size:
                scan.seen[e].append(hit)
                scan.hits.setdefault(doc["id"], {})[e] = hit
                scan.sources[doc["id"]] = doc["source"]
                scan.domain_of[doc["id"]] = domain
    return scan


def _report(
    config: DecontaminateConfig, reports: dict[str, Any], scan: _TrainingScan, removed: set[str], passed: bool
) -> dict[str, Any]:
    """The content of report.json."""
    return {"ngram": config.ngram, "normalization": "lowercase, punctuation removed, whitespace tokens",
            "doc_overlap_threshold": config.doc_overlap_threshold,
            "max_contamination": config.max_contamination,
            "eval_sets": reports, "training": {"documents": scan.documents, "removed": len(removed),
                                               "kept": scan.documents - len(removed)},
            "training_domains": _per_domain(scan.per_domain, removed, scan.domain_of),
            "passed": passed,
            "config": {**asdict(config), "eval_sets": [asdict(e) for e in config.eval_sets]}}


def _print_summary(reports: dict[str, Any]) -> None:
    for name, r in reports.items():
        print(
            f"[decontaminate] {name}: {r['contaminated_documents']}/{r['checked_documents']} evaluation "
            "documents "
            f"contaminated ({r['contamination']:.2%}), {r['removed_training_documents']} training "
            "documents "
            f"removed [{r['method']}]",
            file=sys.stderr,
        )


def decontaminate(config: DecontaminateConfig) -> dict[str, Any]:
    """Check, report and filter; raise ContaminationError when an evaluation set is too contaminated."""
    manifest = read_manifest(config.input_path)
    prints = [_Fingerprint(es, config) for es in config.eval_sets]
    scan = _scan_training(config, prints)
    _refuse_eval_named(config, scan.eval_named)  # before anything is written
    reports, removed = {}, set()
    for e, fp in enumerate(prints):
        seen = np.unique(np.concatenate(scan.seen[e])) if scan.seen[e] else np.empty(0, np.uint64)
        rep, drop = _assess(fp, seen, e, scan.hits, scan.sources, scan.domain_of, config)
        reports[fp.es.name] = rep
        removed |= drop
    _write_filtered(config, manifest, removed)
    for fp in prints:
        if fp.bloom is not None:
            fp.bloom.save(f"{config.output_path.rstrip('/')}/bloom/{_safe(fp.es.name)}")
    failing = [name for name, r in reports.items() if r["contamination"] > config.max_contamination]
    report = _report(config, reports, scan, removed, not failing)
    write_json_atomic(f"{config.output_path.rstrip('/')}/report.json", report)
    _print_summary(reports)
    if failing:
        raise ContaminationError(_failure_message(failing, reports, config))
    return report


def _per_domain(documents: dict[str, int], removed: set[str], domain_of: dict[str, str]) -> dict[str, Any]:
    """Training documents, removed and kept, per domain (per mixture source)."""
    gone: dict[str, int] = {}
    for tid in removed:
        gone[domain_of[tid]] = gone.get(domain_of[tid], 0) + 1
    return {
        d: {"documents": n, "removed": gone.get(d, 0), "kept": n - gone.get(d, 0)}
        for d, n in sorted(documents.items())
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _assess(
    fp: _Fingerprint,
    seen: np.ndarray,
    e: int,
    hits: dict[str, dict[int, np.ndarray]],
    sources: dict[str, str],
    domain_of: dict[str, str],
    config: DecontaminateConfig,
) -> tuple[dict[str, Any], set[str]]:
    """Contamination of one evaluation set and the training documents that hold its leaked documents."""
    overlaps, drop = [], set()
    checked = 0
    for doc in _eval_documents(fp.es):
        h = ngram_hashes(doc["text"], config.ngram)
        if h.size == 0:
            continue
        checked += 1
        share = float(exact_member(seen, h).mean()) if seen.size else 0.0
        if share < config.doc_overlap_threshold:
            continue
        holders = []
        for tid, per_set in hits.items():
            if e in per_set:
                shared = int(exact_member(h, per_set[e]).sum())
                if shared:
                    holders.append((shared, tid))
        holders.sort(reverse=True)
        listed = [
            {
                "id": tid,
                "source": sources[tid],
                "domain": domain_of[tid],
                "shared_ngrams": shared,
                "removed": shared / h.size >= config.doc_overlap_threshold,
            }
            for shared, tid in holders[:_MAX_LISTED]
        ]
        entry = {
            "eval_id": doc["id"],
            "eval_source": doc.get("source", doc["id"]),
            "overlap": share,
            "ngrams": int(h.size),
            "training_documents": listed,
        }
        drop |= {tid for shared, tid in holders if shared / h.size >= config.doc_overlap_threshold}
        overlaps.append(entry)
    rep = {
        "method": fp.method,
        "documents": fp.documents,
        "checked_documents": checked,
        "too_short_documents": fp.too_short,
        "ngrams": fp.ngrams,
        "contaminated_documents": len(overlaps),
        "contamination": len(overlaps) / checked if checked else 0.0,
        "removed_training_documents": len(drop),
        "overlaps": overlaps,
    }
    return rep, drop


def _write_filtered(config: DecontaminateConfig, manifest: dict[str, Any], removed: set[str]) -> None:
    fmt = manifest["file_format"]
    splits = {}
    for split, info in manifest["splits"].items():
        shards = []
        for shard in info["shards"]:
            records = read_shard(config.input_path, shard, fmt)
            if split == "train":
                records = [r for r in records if r["id"] not in removed]
            if records:
                shards.append(write_records(config.output_path, split, shard["name"], records, fmt))
        splits[split] = summarize_split(shards)
    write_manifest(
        config.output_path,
        fmt,
        splits,
        {
            "skipped": manifest.get("skipped", {}),
            "decontaminated_from": config.input_path,
            "removed_training_documents": sorted(removed),
        },
    )


def _failure_message(failing: list[str], reports: dict[str, Any], config: DecontaminateConfig) -> str:
    lines = [f"decontaminate: evaluation data leaked into the training documents of {config.input_path}."]
    for name in failing:
        r = reports[name]
        lines.append(
            f"evaluation set {name!r}: {r['contaminated_documents']} of {r['checked_documents']} "
            "documents "
            f"({r['contamination']:.2%}) share >= {config.doc_overlap_threshold:.0%} of their "
            f"{config.ngram}-grams with training data (max_contamination = "
            f"{config.max_contamination:.2%})"
        )
        for o in r["overlaps"][:_MAX_LISTED]:
            holders = ", ".join(
                f"{t['source']} ({t['shared_ngrams']} shared)" for t in o["training_documents"][:3]
            )
            lines.append(
                f"  - {o['eval_source']} ({o['overlap']:.0%} of its n-grams) found in: {holders or '?'}"
            )
    lines.append(
        f"The filtered training set and the full report are at {config.output_path} (report.json). To "
        "proceed: "
        "remove the leaking sources from the ingest step (Source.exclude) and re-run; or, if this overlap is "
        "expected (shared boilerplate, licence headers), raise max_contamination above the share shown, or "
        "raise "
        "doc_overlap_threshold; the removed training documents stay out of the filtered set either way."
    )
    return "\n".join(lines)


__all__ = [
    "ContaminationError",
    "DecontaminateConfig",
    "EvalSet",
    "decontaminate",
    "looks_like_eval_split",
    "normalize",
]
