"""What changed versus a step's previous version, in the API's terms (`FieldChange` rows).

The differences themselves come from marin/graph/changes.py (`step_changes`, re-exported here), the module
`marin plan` and `marin compare` use too; this module only flattens them: a changed dependency is a
`dependency {name}` row followed by one `dependency {name}: {field}` row per difference of the dependency
itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from marin.dashboard.schemas import FieldChange
from marin.graph.changes import Change, step_changes

__all__ = ["field_rows", "step_changes"]


def field_rows(changes: Sequence[Change]) -> list[FieldChange]:
    rows = []
    for c in changes:
        rows.append(FieldChange(field=c.field, kind=c.kind, old=c.old, new=c.new))
        rows.extend(
            FieldChange(field=f"{c.field}: {b.field}", kind=b.kind, old=b.old, new=b.new) for b in c.because
        )
    return rows
