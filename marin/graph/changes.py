"""What changed between two versions of a step: the one implementation behind `marin plan`'s `changed` list
and the dashboard's "what changed" panel, so the two cannot disagree.

Versions. The versions of a step named `a/b` are the directories `a/b-{hash8}` side by side under the prefix
whose step.json names the step `a/b`. `version_names` picks them from a parent directory's entries;
`previous_version` chooses the one to compare with: the one created last before the step (a step that has
not run yet counts as created now), or, when the step is the oldest, the newest other one.

Differences. `identity_changes(old, new)` compares what enters identity (a step.json or an identity
document): `version`, `pinned_output_path` and every leaf of the identity config (`config.optimizer.lr`;
lists element by element; a `$type` as `config.x type`). Dependency placeholders (`{"$dep": hash,
"subpath": ...}`) are compared by subpath only: a changed dependency is one `dependency_changes` entry,
which the caller explains one level down with the dependency's own identity changes (`because`).
`code_changes` reports `fn` and `fn_source_hash`: they do not change identity, but explain different
results. Each difference is a `Change`; `describe()` is its one-line text (`config.lr: 0.001 -> 0.002`).
`step_changes` puts the three together for two step.json documents, whatever their names: a dependency
removed under one name and added under another (an ablation's renamed train step feeding a renamed eval)
is one `dependency {old} -> {new}` change when the two are the only such pair or run the same function.

Steps of different names. An ablation usually renames the step it changes (`train/tiny_moe` ->
`train/tiny_moe-aux_free`), so no same-name version exists. `most_similar` then pairs a step with the
candidate that runs the same function (`fn`) and differs from it in the fewest identity fields (ties: the
newest); `marin plan` uses it for a step with no same-name version among the step directories next to it,
and `marin compare` to pair the steps of two runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

HASH8 = re.compile(r"-[0-9a-f]{8}$")
MISSING: Any = object()
K = TypeVar("K")


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference. `kind` is changed, added or removed; a dependency's `because` holds its own changes."""

    field: str
    kind: str
    old: Any = None
    new: Any = None
    because: tuple[Change, ...] = ()

    @property
    def is_dependency(self) -> bool:
        return self.field.startswith("dependency ")

    def describe(self) -> str:
        if self.is_dependency and self.kind != "changed":
            return f"{self.field} {self.kind}"
        if self.is_dependency:
            if self.because:
                return f"{self.field} changed: {'; '.join(c.describe() for c in self.because[:3])}"
            return f"{self.field} changed (hash {str(self.old)[:8]} -> {str(self.new)[:8]})"
        old = MISSING if self.kind == "added" else self.old
        new = MISSING if self.kind == "removed" else self.new
        return f"{self.field}: {_show(old)} -> {_show(new)}"


def _show(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = repr(value) if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def version_stem(dirname: str) -> str | None:
    """`a-b` for a directory named `a-b-0123abcd` (a step's output directory), else None."""
    return HASH8.sub("", dirname) if HASH8.search(dirname) else None


def version_names(entries: Iterable[str], base: str) -> list[str]:
    """The entries of a parent directory that are versions of the step whose last name part is `base`."""
    return [e for e in entries if version_stem(e) == base]


def previous_version(
    versions: Sequence[tuple[K, dict[str, Any]]], created: float | None
) -> tuple[K, dict[str, Any], bool] | None:
    """(key, step.json, whether it is older) of the version to compare a step created at `created` with
    (None: not run yet), chosen among the other versions (key, step.json); None when there is none."""
    if not versions:
        return None

    def when(version: tuple[K, dict[str, Any]]) -> float:
        return _created(version[1])

    before = [v for v in versions if created is None or when(v) <= created]
    key, doc = max(before or versions, key=lambda v: (when(v), str(v[0])))
    return key, doc, bool(before)


def _created(doc: dict[str, Any]) -> float:
    value = doc.get("created")
    return float(value) if isinstance(value, int | float) else 0.0


def identity_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The identity document of a step.json (its `identity`), or `doc` itself when it is one already."""
    ident = doc.get("identity")
    return ident if isinstance(ident, dict) else doc


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Differences between two identity documents (or step.json files), dependencies' hashes excluded."""
    a, b = identity_of(old), identity_of(new)
    out = [
        Change(key, "changed", a.get(key), b.get(key))
        for key in ("version", "pinned_output_path")
        if a.get(key) != b.get(key)
    ]
    _walk(a.get("config", {}), b.get("config", {}), "config", out)
    return out


def _is_dep(value: Any) -> bool:
    return isinstance(value, dict) and "$dep" in value


def _walk(old: Any, new: Any, path: str, out: list[Change]) -> None:
    if _is_dep(old) and _is_dep(new):
        if old.get("subpath") != new.get("subpath"):
            out.append(Change(f"{path}.subpath", "changed", old.get("subpath"), new.get("subpath")))
    elif isinstance(old, dict) and isinstance(new, dict) and not _is_dep(old) and not _is_dep(new):
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if key != "$type" else f"{path} type"
            _walk(old.get(key, MISSING), new.get(key, MISSING), sub, out)
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else MISSING
            _walk(a, new[i] if i < len(new) else MISSING, f"{path}[{i}]", out)
    elif old is MISSING:
        out.append(Change(path, "added", None, new))
    elif new is MISSING:
        out.append(Change(path, "removed", old, None))
    elif old != new or type(old) is not type(new):
        out.append(Change(path, "changed", old, new))


def dependencies_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A step.json's dependencies by name ({"name", "hash", "output_path"} each)."""
    deps = doc.get("dependencies") or []
    return {d["name"]: d for d in deps if isinstance(d, dict) and isinstance(d.get("name"), str)}


def dependency_changes(old: dict[str, str], new: dict[str, str]) -> list[Change]:
    """Dependencies (name -> hash) added, removed or with another hash, by name."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            kind = "changed" if a and b else ("added" if b else "removed")
            out.append(Change(f"dependency {name}", kind, a, b))
    return out


def code_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """`fn` and `fn_source_hash` differences between two step.json files (not identity: results)."""
    keys = ("fn", "fn_source_hash")
    return [Change(k, "changed", old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def most_similar(
    identity: dict[str, Any], fn: str | None, candidates: Sequence[tuple[K, dict[str, Any]]],
    expected_deps: Iterable[str] = (),
) -> tuple[K, dict[str, Any], list[Change]] | None:
    """(key, step.json, identity changes) of the candidate (key, step.json) running `fn` whose identity
    differs least from `identity`; ties go to the one with most dependencies among `expected_deps` (the
    hashes the step's own dependencies were paired with: an eval of a renamed train step pairs with the
    eval of the train step that one was paired with), then to the newest (`created`). None when no
    candidate runs `fn`."""
    expected = set(expected_deps)
    best: tuple[tuple[int, int, float], K, dict[str, Any], list[Change]] | None = None
    for key, doc in candidates:
        if fn is not None and doc.get("fn") != fn:
            continue
        changes = identity_changes(doc, identity)
        deps = {str(d.get("hash")) for d in dependencies_of(doc).values()}
        rank = (len(changes), -len(deps & expected), -_created(doc))
        if best is None or rank < best[0]:
            best = (rank, key, doc, changes)
    return None if best is None else (best[1], best[2], best[3])


def pair_renamed(changes: list[Change], old_deps: dict[str, dict[str, Any]],
                  new_deps: dict[str, dict[str, Any]],
                  dep_doc: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[Change]:
    """Dependencies removed under one name and added under another, paired (see the module docstring)."""
    removed = [c for c in changes if c.kind == "removed"]
    added = [c for c in changes if c.kind == "added"]
    pairs: list[tuple[Change, Change, dict[str, Any] | None, dict[str, Any] | None]] = []
    docs = {c.field: dep_doc((old_deps if c.kind == "removed" else new_deps)[c.field[11:]])
            for c in removed + added}
    for r in removed:
        same = [a for a in added if (docs[a.field] or {}).get("fn") == (docs[r.field] or {}).get("fn")
                and docs[a.field] is not None]
        match = same[0] if same else (added[0] if len(removed) == 1 and len(added) == 1 else None)
        if match is not None:
            added.remove(match)
            pairs.append((r, match, docs[r.field], docs[match.field]))
    paired = {id(c) for p in pairs for c in p[:2]}
    out = [c for c in changes if id(c) not in paired]
    for r, a, old, new in pairs:
        because = tuple(identity_changes(old, new)) if old and new else ()
        out.append(Change(f"{r.field} -> {a.field[11:]}", "changed", r.old, a.new, because))
    return out


def step_changes(
    old: dict[str, Any], new: dict[str, Any], dep_doc: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> list[Change]:
    """Differences between two step.json documents, whatever their names: identity, dependencies (explained
    one level down through `dep_doc`, which reads a dependency's step.json from its
    {"name", "hash", "output_path"} entry), then code."""
    old_deps, new_deps = dependencies_of(old), dependencies_of(new)
    hashes = [{n: str(d.get("hash", "")) for n, d in deps.items()} for deps in (old_deps, new_deps)]
    changes = identity_changes(old, new)
    deps = []
    for change in dependency_changes(*hashes):
        name = change.field.removeprefix("dependency ")
        a = dep_doc(old_deps[name]) if change.kind == "changed" else None
        b = dep_doc(new_deps[name]) if a else None
        because = tuple(identity_changes(a, b)) if a and b else ()
        deps.append(Change(change.field, change.kind, change.old, change.new, because))
    if old.get("name") != new.get("name"):
        deps = pair_renamed(deps, old_deps, new_deps, dep_doc)
    return changes + deps + code_changes(old, new)
