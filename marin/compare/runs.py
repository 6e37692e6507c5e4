"""Which steps a name means: experiments and steps named by id, name, hash or output path, an experiment's own
steps, and its baseline.

A **run** in a comparison is either one step or one experiment. An experiment stands for its **own** steps:
the steps its manifest names that no older experiment's manifest names (an ablation that imports the
tutorial's data, train and eval steps by identity owns only the steps it added); an experiment that owns
none (a re-run of the same DAG under another id) stands for all of its steps.

Names resolve in this order, and an ambiguous name is an error listing the candidates:
1. an experiment id, exactly, then a unique experiment id that starts with the name (`exp2` for
   `exp2_tiny_moe_aux_free-0a1b2c3d`, or the script's stem);
2. a step's output path (absolute, or relative to the prefix);
3. a step name (the newest experiment naming it decides which version);
4. a step hash, or a unique prefix of at least 6 hex digits.

**Baseline** of an experiment (the dashboard's "compare with its baseline" link, `marin compare EXP` with one
name): the experiment its criterion names (`baseline=` another experiment, or a step another experiment
owns); otherwise the older experiment whose steps it reuses most by identity (ties: the newest). None when
neither exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from marin.compare.source import Source


class CompareError(ValueError):
    """A name that resolves to nothing, or to several things."""


@dataclass(frozen=True)
class StepRef:
    name: str
    hash: str
    rel: str  # output path relative to the prefix


@dataclass(frozen=True)
class Run:
    """One column of a comparison: a label, and the steps whose records it shows."""

    label: str
    kind: str  # "experiment" or "step"
    steps: tuple[StepRef, ...]
    experiment: str | None = None


_HEX = re.compile(r"^[0-9a-f]{6,64}$")


def _created(manifest: dict[str, Any]) -> float:
    value = manifest.get("created")
    return float(value) if isinstance(value, int | float) else 0.0


def _entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in manifest.get("steps") or [] if isinstance(s, dict) and isinstance(s.get("hash"), str)]


def owners(source: Source) -> dict[str, str]:
    """step hash -> the oldest experiment naming it (the source's own cached map when it keeps one: the
    dashboard's index does)."""
    cached = getattr(source, "owners", None)
    if callable(cached):
        found: dict[str, str] = cached()
        return found
    out: dict[str, str] = {}
    for key, m in sorted(source.manifests().items(), key=lambda kv: (_created(kv[1]), kv[0])):
        for entry in _entries(m):
            out.setdefault(entry["hash"], key)
    return out


def _sharing(source: Source, hashes: set[str]) -> dict[str, int]:
    """experiment id -> how many of `hashes` its manifest names."""
    containing = getattr(source, "containing", None)
    counts: dict[str, int] = {}
    if callable(containing):
        for h in hashes:
            for key in containing(h):
                counts[key] = counts.get(key, 0) + 1
        return counts
    for key, m in source.manifests().items():
        shared = len(hashes & {e["hash"] for e in _entries(m)})
        if shared:
            counts[key] = shared
    return counts


def _ref(source: Source, entry: dict[str, Any], table: _StepTable | None = None) -> StepRef:
    out = entry.get("output_path")
    rel = (table or _table(source)).rel_of.get(entry["hash"]) if isinstance(out, str) else None
    rel = rel if rel is not None or not isinstance(out, str) else source.relative(out)
    name, h = str(entry.get("name", "")), str(entry["hash"])
    return StepRef(name=name, hash=h, rel=rel if rel is not None else f"{name}-{h[:8]}")


def own_steps(source: Source, experiment_id: str, owner: dict[str, str] | None = None) -> tuple[StepRef, ...]:
    manifest = source.manifests().get(experiment_id) or {}
    owner = owners(source) if owner is None else owner
    entries = _entries(manifest)
    mine = [e for e in entries if owner.get(e["hash"]) == experiment_id]
    table = _table(source)
    return tuple(_ref(source, e, table) for e in (mine or entries))


def experiment_run(source: Source, experiment_id: str, owner: dict[str, str] | None = None) -> Run:
    return Run(label=experiment_id, kind="experiment", steps=own_steps(source, experiment_id, owner),
               experiment=experiment_id)


def _newest_first(source: Source) -> list[tuple[str, dict[str, Any]]]:
    return sorted(source.manifests().items(), key=lambda kv: (_created(kv[1]), kv[0]), reverse=True)


def _experiment_named(source: Source, name: str) -> str | None:
    manifests = source.manifests()
    if name in manifests:
        return name
    found = sorted(k for k in manifests if k.startswith(name))
    if len(found) > 1:
        raise CompareError(f"{name!r} names {len(found)} experiments ({', '.join(found[:6])}); give the "
                           "full experiment id")
    return found[0] if found else None


@dataclass(frozen=True)
class _StepTable:
    """Every manifest entry by output path (relative), by name and by hash, newest experiment first."""

    by_rel: dict[str, dict[str, Any]]
    by_name: dict[str, list[dict[str, Any]]]
    by_hash: dict[str, dict[str, Any]]
    rel_of: dict[str, str]  # step hash -> its output path relative to the prefix


_TABLE: list[tuple[dict[str, dict[str, Any]], _StepTable]] = []  # one slot: (its manifests, the table)


def _table(source: Source) -> _StepTable:
    """The step table of the source's manifests, rebuilt only when they change (the dashboard's index hands
    out the same dict until a manifest changes; a PrefixSource reads them once)."""
    manifests = source.manifests()
    if _TABLE and _TABLE[0][0] is manifests:
        return _TABLE[0][1]
    table = _StepTable({}, {}, {}, {})
    for _, m in _newest_first(source):
        for entry in _entries(m):
            out = entry.get("output_path")
            rel = source.relative(out) if isinstance(out, str) else None
            if rel is not None:
                table.by_rel.setdefault(rel, entry)
                table.rel_of.setdefault(entry["hash"], rel)
            table.by_name.setdefault(str(entry.get("name", "")), []).append(entry)
            table.by_hash.setdefault(entry["hash"], entry)
    _TABLE[:] = [(manifests, table)]
    return table


def _step_matching(source: Source, name: str) -> list[dict[str, Any]]:
    """Manifest entries (newest experiment first, one per hash) whose output path, name or hash match."""
    absolute = name.startswith("/") or "://" in name
    rel = source.relative(name) if absolute else name.strip("/")
    table = _table(source)
    if rel and rel in table.by_rel:
        return [table.by_rel[rel]]
    if name in table.by_name:
        seen: dict[str, dict[str, Any]] = {}
        for entry in table.by_name[name]:
            seen.setdefault(entry["hash"], entry)
        return list(seen.values())
    if _HEX.match(name):
        return [e for h, e in table.by_hash.items() if h.startswith(name)]
    return []


def resolve(source: Source, name: str, owner: dict[str, str] | None = None) -> Run:
    """The run `name` means (see the module docstring)."""
    experiment = _experiment_named(source, name)
    if experiment is not None:
        return experiment_run(source, experiment, owner)
    found = _step_matching(source, name)
    by_name = [e for e in found if e.get("name") == name]
    if len(by_name) > 1:
        found = by_name[:1]  # a step name: the version the newest experiment uses
    if len(found) > 1:
        hashes = ", ".join(f"{e.get('name')}@{str(e['hash'])[:10]}" for e in found[:6])
        raise CompareError(f"{name!r} matches {len(found)} steps ({hashes}); give a longer hash or the "
                           "output path")
    if not found:
        ids = ", ".join(sorted(source.manifests())[:8]) or "none"
        raise CompareError(f"{name!r} is no experiment id, step output path, step name or step hash under "
                           f"{source.prefix} (experiments there: {ids}); `marin status --prefix "
                           f"{source.prefix}` lists them")
    ref = _ref(source, found[0])
    return Run(label=f"{ref.name}@{ref.hash[:8]}", kind="step", steps=(ref,))


def baseline_of(source: Source, experiment_id: str, owner: dict[str, str] | None = None) -> str | None:
    """The experiment `experiment_id` is compared with by default (see the module docstring)."""
    manifests = source.manifests()
    me = manifests.get(experiment_id)
    if me is None:
        return None
    owner = owners(source) if owner is None else owner
    for c in (me.get("notebook") or {}).get("criteria") or []:
        base = c.get("baseline") if isinstance(c, dict) else None
        if not isinstance(base, dict):
            continue
        kind = base.get("kind")
        named = base.get("experiment") if kind == "experiment" else owner.get(str(base.get("hash")))
        if isinstance(named, str) and named != experiment_id and named in manifests:
            return named
    best: tuple[int, float, str] | None = None
    for key, shared in _sharing(source, {e["hash"] for e in _entries(me)}).items():
        m = manifests.get(key)
        if key == experiment_id or m is None or _created(m) > _created(me):
            continue
        if best is None or (shared, _created(m), key) > best:
            best = (shared, _created(m), key)
    return best[2] if best else None
