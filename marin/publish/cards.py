"""What the site shows beyond the dashboard's pages: data cards and the lab-wide interruption timeline.

A data card is read from the records the data operators write, never from documents: an ingest step's
`manifest.json` (sources, shards, documents), a tokenize step's `tokenize.json` (tokenizer identity, and per
cache and domain the documents and tokens), a decontaminate step's `report.json` (what was checked against
what, what was dropped), and a train step's config (mixture weights by stage and the permutation key of
the shuffle). Everything passes through the redacting store, so a card carries no path or name the policy
hides. The timeline lists every PREEMPTED or FAILED event and every retried attempt of the published steps.
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
    else:
        record = _trim(store.read_json(f"{rel}/{_KINDS[kind]}"))
    return DataCard(step=rel, name=str(info.get("name") or rel), kind=kind, record=record)


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
