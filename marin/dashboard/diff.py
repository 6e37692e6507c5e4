"""What changed versus a step's previous version, in the API's terms (`FieldChange` rows).

The differences themselves come from marin/graph/changes.py, the module `marin plan` uses too; this module
only flattens them: a changed dependency is a `dependency {name}` row followed by one
`dependency {name}: {field}` row per difference of the dependency itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marin.dashboard.schemas import FieldChange
from marin.graph.changes import Change, code_changes, dependencies_of, dependency_changes, identity_changes


def step_changes(
    old: dict[str, Any], new: dict[str, Any], dep_doc: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> list[Change]:
    """Differences between two step.json documents: identity, dependencies (explained one level down through
    `dep_doc`, which reads a dependency's step.json), then code."""
    old_deps, new_deps = dependencies_of(old), dependencies_of(new)
    hashes = [{n: str(d.get("hash", "")) for n, d in deps.items()} for deps in (old_deps, new_deps)]
    changes = identity_changes(old, new)
    for change in dependency_changes(*hashes):
        name = change.field.removeprefix("dependency ")
        a = dep_doc(old_deps[name]) if change.kind == "changed" else None
        b = dep_doc(new_deps[name]) if a else None
        because = tuple(identity_changes(a, b)) if a and b else ()
        changes.append(Change(change.field, change.kind, change.old, change.new, because))
    return changes + code_changes(old, new)


def field_rows(changes: Sequence[Change]) -> list[FieldChange]:
    rows = []
    for c in changes:
        rows.append(FieldChange(field=c.field, kind=c.kind, old=c.old, new=c.new))
        rows.extend(
            FieldChange(field=f"{c.field}: {b.field}", kind=b.kind, old=b.old, new=b.new) for b in c.because
        )
    return rows
