"""Field-level differences between two versions of a step (what changed, and so why the hash changed).

Two step.json files of the same step name are compared on what enters identity: `version`, every field of the
identity config (placeholders included, never physical paths) and the dependencies. A dependency whose hash
changed is explained one level down (its own field changes), which is the question a researcher asks: "the
train step re-ran because tokenize's vocab_size went from 512 to 1024". The function source hash is reported
too: it does not change identity but explains a difference in results.
"""

from __future__ import annotations

from typing import Any

from marin.dashboard.schemas import FieldChange

_ABSENT = object()


def flatten(value: Any, prefix: str) -> dict[str, Any]:
    """{"config.optimizer.lr": 0.001, "config.layers[0]": 4, ...}; empty containers are kept as leaves."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict) and v and not _is_placeholder(v):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
        elif isinstance(v, list) and v:
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
        else:
            out[path] = v
    return out


def _is_placeholder(v: dict[str, Any]) -> bool:
    # {"$dep": hash, "subpath": ...} reads better as one value than as two fields.
    return "$dep" in v


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> list[FieldChange]:
    """Differences between two step.json documents, identity first."""
    old_id, new_id = _identity(old), _identity(new)
    changes = _compare(flatten(old_id, ""), flatten(new_id, ""))
    old_deps, new_deps = _deps(old), _deps(new)
    for name in sorted(set(old_deps) | set(new_deps)):
        a, b = old_deps.get(name), new_deps.get(name)
        if a != b:
            kind = "changed" if a and b else ("added" if b else "removed")
            changes.append(FieldChange(field=f"dependency {name}", kind=kind, old=a, new=b))
    if old.get("fn") != new.get("fn"):
        changes.append(FieldChange(field="fn", kind="changed", old=old.get("fn"), new=new.get("fn")))
    if old.get("fn_source_hash") != new.get("fn_source_hash"):
        changes.append(
            FieldChange(
                field="fn_source_hash",
                kind="changed",
                old=old.get("fn_source_hash"),
                new=new.get("fn_source_hash"),
            )
        )
    return changes


def _identity(doc: dict[str, Any]) -> dict[str, Any]:
    raw = doc.get("identity")
    ident: dict[str, Any] = raw if isinstance(raw, dict) else {}
    config = ident.get("config", doc.get("config"))
    return {"version": ident.get("version", doc.get("version")), "config": config}


def _deps(doc: dict[str, Any]) -> dict[str, str]:
    out = {}
    for d in doc.get("dependencies") or []:
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            out[d["name"]] = str(d.get("hash", ""))
    return out


def _compare(a: dict[str, Any], b: dict[str, Any]) -> list[FieldChange]:
    changes = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if x is _ABSENT:
            changes.append(FieldChange(field=key, kind="added", new=y))
        elif y is _ABSENT:
            changes.append(FieldChange(field=key, kind="removed", old=x))
        elif x != y or type(x) is not type(y):
            changes.append(FieldChange(field=key, kind="changed", old=x, new=y))
    return changes
