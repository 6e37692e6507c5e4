"""What changed versus a step's previous version, in the API's terms (`FieldChange` rows).

The differences themselves come from marin/graph/changes.py (`step_changes`), the module `marin plan` and
`marin compare` use too (`marin.dashboard.diff.step_changes`, its old name, still works and raises a
DeprecationWarning); this module only flattens them: a changed dependency is a
`dependency {name}` row followed by one `dependency {name}: {field}` row per difference of the dependency
itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from marin.dashboard.schemas import FieldChange
from marin.graph.changes import Change

__all__ = ["field_rows"]


def field_rows(changes: Sequence[Change]) -> list[FieldChange]:
    rows = []
    for c in changes:
        rows.append(FieldChange(field=c.field, kind=c.kind, old=c.old, new=c.new))
        rows.extend(
            FieldChange(field=f"{c.field}: {b.field}", kind=b.kind, old=b.old, new=b.new) for b in c.because
        )
    return rows


def __getattr__(name: str) -> Any:
    """`step_changes` moved to marin.graph.changes: the old import keeps working and warns."""
    if name == "step_changes":
        from marin.graph import changes

        warnings.warn("marin.dashboard.diff.step_changes is deprecated: import step_changes from "
                      "marin.graph.changes", DeprecationWarning, stacklevel=2)
        return changes.step_changes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
