"""The plan: for every step, what an executor would do now and why.

Actions: `run`; `skip` (already succeeded, or not needed because everything that uses it succeeded);
`wait` (held by a live lease of another executor); `blocked` (a dependency failed and will not be re-run);
`failed` (failed before; re-run only with `--force-run-failed`). `changed` explains, field by field, why a
step that ran earlier under this prefix with the same name now has a different hash.

Planning reads storage but writes nothing. It lists each parent directory of the output paths once instead
of probing every step, so planning a fresh 10,000-step DAG costs one listing.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from marin.definition.source import fn_source_hash
from marin.graph.changes import diff_identity
from marin.graph.dag import Graph, Node
from marin.status.files import (
    DEP_FAILED,
    FAILED,
    PREEMPTED,
    RUNNING,
    SUCCESS,
    WAITING,
    lease_path,
    read_json,
    status_path,
    step_json_path,
)
from marin.storage.base import Storage
from marin.storage.lease import LeaseInfo

RUN, SKIP, WAIT, BLOCKED, FAILED_ACTION = "run", "skip", "wait", "blocked", "failed"
HASH8 = re.compile(r"-[0-9a-f]{8}$")


@dataclasses.dataclass
class PlanEntry:
    name: str
    hash: str
    output_path: str
    action: str
    reason: str
    changed: list[str]
    warnings: list[str]
    dependencies: list[str]
    previous: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    node: Node | None = dataclasses.field(default=None, repr=False)
    previous_hash: str | None = None  # set with `changed`: the hash of the earlier run it is compared with

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hash": self.hash,
            "output_path": self.output_path,
            "action": self.action,
            "reason": self.reason,
            "changed": self.changed,
            "warnings": self.warnings,
            "dependencies": self.dependencies,
            "previous_status": (self.previous or {}).get("status"),
            "previous_hash": self.previous_hash,
        }


@dataclasses.dataclass
class Plan:
    prefix: str
    entries: list[PlanEntry]
    warnings: list[str]
    not_selected: int

    def by_action(self, action: str) -> list[PlanEntry]:
        return [e for e in self.entries if e.action == action]

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.action] = counts.get(e.action, 0) + 1
        return {"prefix": self.prefix, "counts": counts, "not_selected": self.not_selected,
                "warnings": self.warnings, "steps": [e.to_json() for e in self.entries]}

    def table(self) -> str:
        lines = [f"plan under {self.prefix}:"]
        width = max((len(e.name) for e in self.entries), default=4)
        for e in self.entries:
            lines.append(f"  {e.action:<7} {e.name:<{width}} {e.hash[:8]}  {e.reason}")
            since = f" since {e.previous_hash[:8]}" if e.previous_hash else ""
            lines.extend(f"  {'':<7} {'':<{width}}           changed{since}: {c}" for c in e.changed)
            lines.extend(f"  {'':<7} {'':<{width}}           warning: {w}" for w in e.warnings)
        if self.not_selected:
            lines.append(f"  ({self.not_selected} steps not selected by --run-only)")
        lines.extend(f"warning: {w}" for w in self.warnings)
        counts = self.to_json()["counts"]
        lines.append("  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        return "\n".join(lines)


def _map(storage: Storage, fn: Callable[[str], Any], items: Sequence[str]) -> list[Any]:
    if storage.is_local or len(items) < 4:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(fn, items))


class Scan:
    """What storage holds for the DAG's output paths: parent listings and existing status files."""

    def __init__(self, storage: Storage, paths: Sequence[str]) -> None:
        self.storage = storage
        parents = sorted({posixpath.dirname(p) for p in paths})
        listings = _map(storage, storage.listdir, parents)
        self.listing = {p: set(names or ()) for p, names in zip(parents, listings, strict=True)}
        present = [p for p in paths if posixpath.basename(p) in self.listing[posixpath.dirname(p)]]
        statuses = _map(storage, lambda p: read_json(storage, status_path(p)), present)
        self.status: dict[str, dict[str, Any] | None] = dict(zip(present, statuses, strict=True))
        self._stems: dict[str, dict[str, list[str]]] = {}

    def siblings(self, output_path: str) -> list[str]:
        """Other output paths of a step with the same name under the same prefix."""
        parent, base = posixpath.split(output_path)
        by_stem = self._stems.get(parent)
        if by_stem is None:
            by_stem = {}
            for n in self.listing.get(parent, ()):
                if HASH8.search(n):
                    by_stem.setdefault(HASH8.sub("", n), []).append(n)
            self._stems[parent] = by_stem  # built once per parent: a re-plan of 10,000 steps stays linear
        return [posixpath.join(parent, n) for n in by_stem.get(HASH8.sub("", base), ()) if n != base]


def select(graph: Graph, run_only: Sequence[str] | None, previous: Callable[[Node], dict[str, Any] | None],
           warnings: list[str]) -> set[int]:
    """Nodes to consider: the roots and their dependencies, not descending below succeeded steps."""
    if run_only:
        patterns = [re.compile(r) for r in run_only]
        roots = [n for n in graph.nodes if any(p.search(n.name) for p in patterns)]
        for p in patterns:
            if not any(p.search(n.name) for n in graph.nodes):
                warnings.append(f"--run-only {p.pattern!r} matches no step")
    else:
        roots = list(graph.targets)
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        if (previous(node) or {}).get("status") != SUCCESS:
            stack.extend(node.deps)
    return needed


def make_plan(
    graph: Graph,
    prefix: str,
    storage: Storage,
    *,
    run_only: Sequence[str] | None = None,
    force_run_failed: bool = False,
    now: float | None = None,
) -> Plan:
    now = time.time() if now is None else now
    paths = {id(n): n.output_path(prefix) for n in graph.nodes}
    scan = Scan(storage, list(paths.values()))
    warnings = list(graph.warnings)

    def previous(node: Node) -> dict[str, Any] | None:
        return scan.status.get(paths[id(node)])

    needed = select(graph, run_only, previous, warnings)
    entries: list[PlanEntry] = []
    by_node: dict[int, PlanEntry] = {}
    for node in graph.nodes:
        if id(node) not in needed:
            if run_only:
                continue
            entry = _entry(node, paths[id(node)], SKIP, "not needed: every step that uses it already succeeded",
                           previous(node))
        else:
            entry = _decide(node, paths[id(node)], previous(node), by_node, storage, force_run_failed, now)
            if entry.action == RUN and entry.previous is None:
                entry.previous_hash, entry.changed = _explain(node, paths[id(node)], scan, storage, by_node)
            elif entry.action == SKIP and entry.previous is not None:
                entry.warnings.extend(_code_drift(node, paths[id(node)], storage))
        by_node[id(node)] = entry
        entries.append(entry)
    return Plan(prefix, entries, warnings, len(graph.nodes) - len(needed) if run_only else 0)


def _entry(node: Node, path: str, action: str, reason: str, prev: dict[str, Any] | None) -> PlanEntry:
    return PlanEntry(node.name, node.hash, path, action, reason, [], [], [d.hash for d in node.deps], prev, node)


def _decide(node: Node, path: str, prev: dict[str, Any] | None, by_node: dict[int, PlanEntry], storage: Storage,
            force_run_failed: bool, now: float) -> PlanEntry:
    status = (prev or {}).get("status")
    if status == SUCCESS:
        return _entry(node, path, SKIP, f"already succeeded (attempt {prev.get('attempt')})", prev)  # type: ignore[union-attr]
    if status == FAILED and not force_run_failed:
        err = (prev or {}).get("error") or {}
        return _entry(node, path, FAILED_ACTION,
                      f"failed previously ({err.get('type')}: {str(err.get('message'))[:100]}); "
                      "re-run it with --force-run-failed", prev)
    for dep in node.deps:
        dep_entry = by_node.get(id(dep))
        if dep_entry is not None and dep_entry.action in (FAILED_ACTION, BLOCKED):
            verb = "failed previously" if dep_entry.action == FAILED_ACTION else "is blocked"
            return _entry(node, path, BLOCKED, f"dependency {dep.name} {verb}", prev)
    if status in (RUNNING, WAITING):
        lease_text = storage.read_text(lease_path(path))
        lease = LeaseInfo.parse(lease_text) if lease_text else None
        if lease is not None and not lease.is_stale(now):
            return _entry(node, path, WAIT, f"running under executor {lease.owner} "
                          f"(heartbeat {now - lease.heartbeat:.0f} s ago); will wait and reuse its result", prev)
        owner = lease.owner if lease else (prev or {}).get("executor")
        age = f"no heartbeat for {now - lease.heartbeat:.0f} s" if lease else "no lease"
        return _entry(node, path, RUN, f"stale lease of executor {owner} ({age}) will be taken over", prev)
    reasons = {
        FAILED: "failed previously; re-running (--force-run-failed)",
        DEP_FAILED: "a dependency failed in an earlier run; re-running",
        PREEMPTED: "preempted in an earlier run; re-running",
        None: "not run yet under this prefix",
    }
    return _entry(node, path, RUN, reasons.get(status, f"previous status {status}; re-running"), prev)


def _explain(node: Node, path: str, scan: Scan, storage: Storage,
             by_node: dict[int, PlanEntry]) -> tuple[str | None, list[str]]:
    """(hash of the latest earlier run of the same name under this prefix, the differences that explain it)."""
    candidates = scan.siblings(path)[:20]
    if not candidates:
        return None, []
    infos = [i for i in _map(storage, lambda p: read_json(storage, step_json_path(p)), candidates) if i]
    if not infos:
        return None, []
    prev = max(infos, key=lambda i: float(i.get("created") or 0))
    out = diff_identity(prev.get("identity") or {}, node.identity)
    prev_deps = {d["name"]: d for d in prev.get("dependencies", []) if isinstance(d, dict) and "name" in d}
    cur_names = {d.name for d in node.deps}
    for dep in node.deps:
        old = prev_deps.get(dep.name)
        if old is None:
            out.append(f"dependency {dep.name} added")
        elif old.get("hash") != dep.hash:
            out.append(_explain_dep(dep, old, storage, by_node))
    out.extend(f"dependency {name} removed" for name in sorted(set(prev_deps) - cur_names))
    if not out:
        out.append("no field differs: the hashing scheme or the encoding of a value type changed")
    return str(prev.get("hash", "")) or None, out


def _explain_dep(dep: Node, old: dict[str, Any], storage: Storage, by_node: dict[int, PlanEntry]) -> str:
    head = f"dependency {dep.name} changed"
    old_info = read_json(storage, step_json_path(str(old.get("output_path", "")))) if old.get("output_path") else None
    if old_info and old_info.get("identity"):
        diffs = diff_identity(old_info["identity"], dep.identity)
        if diffs:
            return f"{head}: {'; '.join(diffs[:3])}"
    upstream = [c for c in (by_node[id(dep)].changed if id(dep) in by_node else []) if c.startswith("dependency")]
    if upstream:
        text = upstream[0]
        return f"{head}: {text if len(text) < 200 else text[:197] + '...'}"
    return f"{head} (hash {str(old.get('hash'))[:8]} -> {dep.hash[:8]})"


def _code_drift(node: Node, path: str, storage: Storage) -> list[str]:
    info = read_json(storage, step_json_path(path))
    recorded = (info or {}).get("fn_source_hash")
    current = fn_source_hash(node.step.fn)
    if recorded and current and recorded != current:
        return [f"code drift: the source of {node.step.fn_path} changed since this step ran; its result is "
                "reused as is (set Step(version=...) to re-address it on purpose)"]
    return []


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=1)
