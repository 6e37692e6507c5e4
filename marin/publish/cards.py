"""What the site shows beyond the dashboard's pages: data cards and the lab-wide interruption timeline.

A data card is read from the records the data operators write, never from documents: an ingest step's
`manifest.json` (sources, shards, documents), a tokenize step's `tokenize.json` (tokenizer identity, and per
cache and domain the documents and tokens), a decontaminate step's `report.json` (what was checked against
what, what was dropped), and a train step's config (mixture weights by stage and the permutation key of
the shuffle). A mixture's card also follows its sources to the tokenize step that made their caches (the
documents and tokens of each source) and from there to the decontaminate step that filtered those documents
(its report), so one card answers what the model was trained on; those steps are the train step's own
dependencies, so they belong to the same (public) experiment, and the card's digest includes theirs.
Everything passes through the redacting store, so a card carries no path or name the policy hides.
The timeline lists every PREEMPTED or FAILED event and every retried attempt of the published steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin.dashboard.store import PrefixStore

_KINDS = {"ingest": "manifest.json", "tokenize": "tokenize.json", "decontaminate": "report.json"}
_TRAIN_KEYS = ("mixture", "mixture_stages", "train_sources", "permutation_key", "shuffle_key", "data_seed",
               "seed")
_DROP = ("shards", "files", "documents_list", "paths")


@dataclass(frozen=True)
class DataCard:
    step: str
    """The step's path relative to the prefix (its page is steps/<step>.html)."""
    name: str
    kind: str
    """ingest, tokenize, decontaminate or train (mixture and shuffle)."""
    record: dict[str, Any] = field(default_factory=dict)
    """The operator's record, redacted, without per-file lists."""
    reads: tuple[str, ...] = ()
    """The other steps whose records the card shows (a mixture's tokenize and decontaminate steps)."""


def _kind(fn: str) -> str | None:
    module = fn.split(":")[0]
    for kind in (*_KINDS, "train"):
        if module.endswith(f"operators.{kind}"):
            return kind
    return None


def _trim(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if k not in _DROP}


def data_card(store: PrefixStore, rel: str) -> DataCard | None:
    """The data card of the step at `rel`, or None when it is no data step."""
    info = store.read_json(f"{rel}/.marin/step.json")
    if not isinstance(info, dict):
        return None
    kind = _kind(str(info.get("fn") or ""))
    if kind is None:
        return None
    if kind == "train":
        raw = info.get("config")
        config: dict[str, Any] = raw if isinstance(raw, dict) else {}
        record = {k: config[k] for k in _TRAIN_KEYS if k in config}
        if not record.get("mixture"):
            return None
        record.update(_mixture_sources(store, config))
        reads = tuple(sorted({str(e["step"]) for e in record["sources"].values() if e.get("step")}
                             | set(record["decontamination"])))
        return DataCard(step=rel, name=str(info.get("name") or rel), kind=kind, record=record, reads=reads)
    record = _trim(store.read_json(f"{rel}/{_KINDS[kind]}"))
    return DataCard(step=rel, name=str(info.get("name") or rel), kind=kind, record=record)


def _step_of(store: PrefixStore, rel: str, kind: str) -> tuple[str, dict[str, Any]] | None:
    """The step of `kind` whose output holds the prefix-relative path `rel` (its path and step.json)."""
    rel = rel.strip("/")
    while rel:
        info = store.read_json(f"{rel}/.marin/step.json")
        if isinstance(info, dict):
            return (rel, info) if _kind(str(info.get("fn") or "")) == kind else None
        rel = rel.rpartition("/")[0]
    return None


def _mixture_sources(store: PrefixStore, config: dict[str, Any]) -> dict[str, Any]:
    """Each mixture source's cache with its documents and tokens (the tokenize step's record), and the
    decontamination report of the documents those caches were made from."""
    stages = [st.get("weights") or {} for st in config.get("mixture_stages") or [] if isinstance(st, dict)]
    names = sorted({*(config.get("mixture") or {}), *(n for w in stages if isinstance(w, dict) for n in w)})
    raw_named = config.get("train_sources")
    named: dict[str, Any] = raw_named if isinstance(raw_named, dict) else {}
    sources: dict[str, Any] = {}
    decon: dict[str, Any] = {}
    for name in names:
        cache = str(named.get(name) or f"{str(config.get('train_cache') or '').rstrip('/')}/{name}")
        entry: dict[str, Any] = {"cache": cache}
        found = _step_of(store, cache, "tokenize")
        if found is not None:
            rel, info = found
            record = store.read_json(f"{rel}/tokenize.json")
            stats = (record.get("stats") if isinstance(record, dict) else None) or {}
            split = cache[len(rel):].strip("/")
            totals = (stats.get(split) or {}).get("totals") or {}
            entry.update(step=rel, documents=totals.get("documents"), tokens=totals.get("tokens"))
            raw_config = info.get("config")
            step_config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
            cleaned = _step_of(store, str(step_config.get("input_path") or ""), "decontaminate")
            if cleaned is not None and cleaned[0] not in decon:
                decon[cleaned[0]] = _trim(store.read_json(f"{cleaned[0]}/report.json"))
        sources[name] = entry
    return {"sources": sources, "decontamination": decon}


@dataclass(frozen=True)
class Interruption:
    ts: float
    experiment: str
    step: str
    event: str
    attempt: int | None
    message: str


def interruptions(store: PrefixStore, rel: str, experiment: str) -> list[Interruption]:
    """The step's interruptions: PREEMPTED/FAILED events and attempts after the first."""
    out = []
    for e in store.read_jsonl(f"{rel}/.marin/events.jsonl"):
        kind, attempt = str(e.get("event") or ""), e.get("attempt")
        retried = kind == "RUNNING" and isinstance(attempt, int) and attempt > 1
        if kind in ("PREEMPTED", "FAILED") or retried:
            out.append(Interruption(ts=float(e.get("ts") or 0.0), experiment=experiment, step=rel,
                                    event="RETRY" if retried else kind,
                                    attempt=attempt if isinstance(attempt, int) else None,
                                    message=str(e.get("message") or "")[:300]))
    return out
