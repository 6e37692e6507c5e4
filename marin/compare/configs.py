"""The config difference between the steps of two runs, field by field, whatever the steps are called.

Each step of the other run is paired with the baseline run's step that runs the same function and differs
from it in the fewest identity fields (`marin.graph.changes.most_similar`, the rule `marin plan` uses for a
renamed step); the differences are `marin.graph.changes.step_changes`, the one implementation behind the
plan's `changed` lines and the dashboard's "what changed" panel. Steps both runs share (same hash) differ in
nothing and are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin.compare.runs import Run, StepRef
from marin.compare.source import Source
from marin.graph.changes import Change, dependencies_of, identity_of, most_similar, step_changes
from marin.status.files import step_json_path


@dataclass(frozen=True)
class StepPair:
    base: StepRef
    other: StepRef
    changes: tuple[Change, ...]

    def to_json(self) -> dict[str, Any]:
        return {"base": {"name": self.base.name, "hash": self.base.hash, "path": self.base.rel},
                "other": {"name": self.other.name, "hash": self.other.hash, "path": self.other.rel},
                "changes": [_change_json(c) for c in self.changes]}


def _change_json(c: Change) -> dict[str, Any]:
    return {"field": c.field, "kind": c.kind, "old": c.old, "new": c.new, "text": c.describe(),
            "because": [_change_json(b) for b in c.because]}


def _doc(source: Source, ref: StepRef) -> dict[str, Any] | None:
    doc = source.read_json(step_json_path(ref.rel))
    return doc if isinstance(doc, dict) else None


def _dep_doc(source: Source, entry: dict[str, Any]) -> dict[str, Any] | None:
    out = entry.get("output_path")
    rel = source.relative(out) if isinstance(out, str) else None
    doc = source.read_json(step_json_path(rel)) if rel is not None else None
    return doc if isinstance(doc, dict) else None


def step_pairs(source: Source, base: Run, other: Run) -> list[StepPair]:
    """Every step of `other` not in `base`, with its most similar step of `base` and the differences."""
    shared = {r.hash for r in base.steps}
    candidates = [(r, d) for r in base.steps if (d := _doc(source, r)) is not None]
    paired: dict[str, str] = {}  # a step of `other` -> the baseline step it was paired with
    out = []
    for ref in other.steps:  # manifest order: dependencies first
        doc = _doc(source, ref)
        if ref.hash in shared or doc is None:
            continue
        deps = [str(d.get("hash")) for d in dependencies_of(doc).values()]
        found = most_similar(identity_of(doc), doc.get("fn"), candidates, [paired.get(h, h) for h in deps])
        if found is None:
            continue
        base_ref, base_doc, _ = found
        paired[ref.hash] = base_ref.hash
        changes = step_changes(base_doc, doc, lambda e: _dep_doc(source, e))
        out.append(StepPair(base_ref, ref, tuple(changes)))
    return out
