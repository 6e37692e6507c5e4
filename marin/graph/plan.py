"""The plan: for every step, what an executor would do now and why.

Actions: `run`; `skip` (already succeeded, or not needed because everything that uses it succeeded);
`wait` (held by a live lease of another executor); `blocked` (a dependency failed and will not be re-run);
`failed` (failed before; re-run only with `--force-run-failed`). `changed` explains, field by field, why a
step that ran earlier under this prefix with the same name now has a different hash; a step with no earlier
run of its name (an ablation that renamed the step it changes) is compared with the most similar earlier
step running the same function in the same directory (`marin.graph.changes.most_similar`), and its first
`changed` line says which (`compared with train/tiny_moe: no earlier step named ...`), for up to
`CROSS_NAME_BUDGET` steps per plan. `--force-run NAME` re-runs the named steps although they succeeded, and
every step that depends on them (`forced` on their entries).

Planning reads storage but writes nothing there. It lists each parent directory of the output paths once
instead of probing every step, so planning a fresh 10,000-step DAG costs one listing. On an object store the
status.json files whose listed checksum matches a local copy are not read again (`read_statuses`; the copy
lives in the user's cache directory, marin/storage/listed_cache.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import posixpath
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from marin.definition.source import fn_source_hash
from marin.graph.changes import (
    Change,
    dependencies_of,
    dependency_changes,
    identity_changes,
    most_similar,
    pair_renamed,
    previous_version,
    version_names,
    version_stem,
)
from marin.graph.dag import Graph, Node
from marin.status import damaged
from marin.status.files import (
    DEP_FAILED,
    FAILED,
    PREEMPTED,
    RUNNING,
    SUCCESS,
    WAITING,
    lease_path,
    read_record,
    status_path,
    step_json_path,
)
from marin.storage.base import Storage
from marin.storage.lease import LeaseInfo
from marin.storage.listed_cache import read_listed
from marin.storage.listing import WHOLE_PARENT_MIN as WHOLE_PARENT_MIN  # re-exported (tests name it here)
from marin.storage.listing import FileInfo, whole_parents
from marin.storage.outputs import OutputCheck, check_listed, recorded_step_facts

RUN, SKIP, WAIT, BLOCKED, FAILED_ACTION = "run", "skip", "wait", "blocked", "failed"
CROSS_NAME_BUDGET = 200
"""Steps per plan that may be compared with a step of another name: each such search reads up to 32
step.json files (once per plan) and diffs them, so a fresh 10,000-step DAG next to many others is not
planned 32 times over; the steps beyond it simply get no `changed` lines, as before issue 33."""

def damaged_status(message: str) -> dict[str, Any]:
    """What the plan keeps for a step whose status.json cannot be read: no status, the message naming the
    file and the fix. The executor reads it again under the step's lease before it decides anything."""
    return {"status": None, "_damaged": message}


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
    forced: bool = False  # named by --force-run, or depends on a step that is: runs although it succeeded
    changes: list[Change] = dataclasses.field(default_factory=list, repr=False)  # `changed`, structured

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
            "forced": self.forced,
        }


@dataclasses.dataclass
class Plan:
    prefix: str
    entries: list[PlanEntry]
    warnings: list[str]
    not_selected: int

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


# A parent directory with at least WHOLE_PARENT_MIN succeeded steps to check (and at least half of its
# entries) is listed whole, recursively, once; the others' output paths are listed one by one: the rule is
# marin/storage/listing.py's `whole_parents`, which the dashboard's store shares.


def output_listings(storage: Storage, paths: Sequence[str], entries: dict[str, set[str]],
                    listed: dict[str, dict[str, FileInfo] | None] | None = None,
                    singles: bool = True) -> dict[str, dict[str, FileInfo] | None]:
    """The listing of every output path in `paths`, in one concurrent batch of listings: a parent directory
    that holds mostly these steps (`WHOLE_PARENT_MIN`; `entries`: the parents' listings) is listed whole and
    split by step (one paged listing instead of one per step; on S3 and GCS 1,000 objects a page), the rest
    per output path (none with `singles=False`). `listed`: listings this plan made already (taken as they
    are). The steps' files are read from the store either way: no listing is kept between plans."""
    listed = listed or {}
    by_parent: dict[str, list[str]] = {}
    for p in paths:
        if p not in listed:
            by_parent.setdefault(posixpath.dirname(p), []).append(p)
    whole = whole_parents(by_parent, lambda d: len(entries.get(d, ())))
    single = [p for d, ps in by_parent.items() if d not in whole for p in ps] if singles else []
    found = storage.list_many(whole + single)
    out: dict[str, dict[str, FileInfo] | None] = {p: listed[p] for p in paths if p in listed}
    out.update(zip(single, found[len(whole):], strict=True))
    for parent, files in zip(whole, found[:len(whole)], strict=True):
        split: dict[str, dict[str, FileInfo]] = {}
        for name, info in (files or {}).items():
            head, _, rest = name.partition("/")
            if rest:
                split.setdefault(head, {})[rest] = info
        out.update((p, split.get(posixpath.basename(p))) for p in by_parent[parent])
    return out


STATUS_IN_OUTPUT = ".marin/status.json"
"""status.json relative to its output path (`status_path`), as an output path's listing names it."""


def read_statuses(storage: Storage, paths: Sequence[str], entries: dict[str, set[str]],
                  ) -> tuple[list[bytes | None], dict[str, dict[str, FileInfo] | None]]:
    """The status.json bytes of each output path in `paths` (all present in their parents' listings), and
    the output listings made on the way. On an object store the parents holding mostly these steps are
    listed whole first: each status.json's entry there (size, checksum, generation) lets the local cache of
    status files answer for an unchanged one (marin/storage/listed_cache.py: never stale, since the listing
    is this plan's); the rest is read in one batch. A step whose status changed since the listing gets no
    listing here (its caller lists it again). On local disk: one batch of reads, no listing."""
    listed = {} if storage.is_local else output_listings(storage, paths, entries, singles=False)
    items = [(status_path(p), (listed.get(p) or {}).get(STATUS_IN_OUTPUT)) for p in paths]
    texts, moved = read_listed(storage, items)
    # a status written after the listing (absent from it, present when read) makes that listing stale too
    moved.update(path for (path, info), data in zip(items, texts, strict=True) if info is None and data)
    return texts, {p: v for p, v in listed.items() if status_path(p) not in moved}


class Scan:
    """What storage holds for the DAG's output paths: parent listings and existing status files."""

    def __init__(self, storage: Storage, paths: Sequence[str]) -> None:
        self.storage = storage
        parents = sorted({posixpath.dirname(p) for p in paths})
        listings = _map(storage, storage.listdir, parents)
        self.listing = {p: set(names or ()) for p, names in zip(parents, listings, strict=True)}
        present = [p for p in paths if posixpath.basename(p) in self.listing[posixpath.dirname(p)]]
        # one concurrent batch of reads, however many steps, less those the cache answers for
        texts, listed = read_statuses(storage, present, self.listing)
        self.status: dict[str, dict[str, Any] | None] = {
            p: damaged.parse_lenient(status_path(p), text, damaged_status)  # damaged: named (damaged_status)
            for p, text in zip(present, texts, strict=True)}
        self._stems: dict[str, dict[str, list[str]]] = {}
        self._docs: dict[str, dict[str, Any] | None] = {}  # step.json of other-name candidates, read once
        self.cross_name_budget = CROSS_NAME_BUDGET
        # Outputs checked before reuse: one listing per succeeded step (marin/storage/outputs.py)
        succeeded = [p for p, s in self.status.items() if s and s.get("status") == SUCCESS]
        checked = [p for p in succeeded if isinstance(self.status[p].get("outputs"), dict)]  # type: ignore[union-attr]
        self.unchecked = len(succeeded) - len(checked)  # recorded before output manifests: trusted as before
        self.listings = output_listings(storage, checked, self.listing, listed)
        self.outputs: dict[str, OutputCheck] = {
            p: check_listed(storage, p, self.status[p]["outputs"], listing)  # type: ignore[index]
            for p, listing in self.listings.items()}

    def succeeded(self, path: str) -> bool:
        """SUCCESS recorded, and its outputs still the ones that succeeded (or recorded before manifests)."""
        check = self.outputs.get(path)
        return (self.status.get(path) or {}).get("status") == SUCCESS and (check is None or check.ok)

    def siblings(self, output_path: str) -> list[str]:
        """Other output paths of a step with the same name under the same prefix (marin/graph/changes.py)."""
        parent, base = posixpath.split(output_path)
        by_stem = self._stems.get(parent)
        if by_stem is None:
            by_stem = {}
            for n in self.listing.get(parent, ()):
                stem = version_stem(n)
                if stem is not None:
                    by_stem.setdefault(stem, []).append(n)
            self._stems[parent] = by_stem  # built once per parent: a re-plan of 10,000 steps stays linear
        stem = version_stem(base) or base
        return [posixpath.join(parent, n) for n in version_names(by_stem.get(stem, ()), stem) if n != base]

    def step_docs(self, paths: Sequence[str]) -> list[dict[str, Any] | None]:
        """The step.json of each path, each read at most once per plan."""
        missing = [p for p in paths if p not in self._docs]
        found = self.storage.read_many([step_json_path(q) for q in missing])
        for p, data in zip(missing, found, strict=True):
            self._docs[p] = damaged.parse_lenient(step_json_path(p), data)
        return [self._docs[p] for p in paths]

    def others(self, output_path: str, limit: int = 32) -> list[str]:
        """Output paths of steps with *other* names in the same directory, the `limit` names most like this
        step's first (candidates for `most_similar` when no same-name version exists)."""
        parent, base = posixpath.split(output_path)
        self.siblings(output_path)  # builds the parent's stems
        stem = version_stem(base) or base
        by_stem = self._stems.get(parent, {})
        names = sorted((s for s in by_stem if s != stem),
                       key=lambda s: (-difflib.SequenceMatcher(None, s, stem).ratio(), s))
        return [posixpath.join(parent, n) for s in names for n in sorted(by_stem[s])][:limit]


def forced_nodes(graph: Graph, names: Sequence[str] | None) -> set[int]:
    """The nodes `--force-run` names (exact step names) and every node that depends on them, by id."""
    if not names:
        return set()
    by_name = {n.name: n for n in graph.nodes}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        known = sorted(by_name)
        raise ValueError(f"--force-run {' '.join(unknown)}: no such step in this experiment; its steps are "
                         f"{', '.join(known[:30])}{' ...' if len(known) > 30 else ''}")
    dependents = graph.dependents()
    forced: set[int] = set()
    stack = [by_name[name] for name in names]
    while stack:
        node = stack.pop()
        if id(node) not in forced:
            forced.add(id(node))
            stack.extend(dependents[id(node)])
    return forced


def select(graph: Graph, run_only: Sequence[str] | None, succeeded: Callable[[Node], bool],
           warnings: list[str], forced: set[int] | None = None) -> set[int]:
    """Nodes to consider: the roots and their dependencies, not descending below succeeded steps unless they
    are forced. The roots are `--run-only`'s matches, else the targets and the forced nodes: under
    `--run-only` a forced step counts only where the selection reaches it (`_check_forced_selected`)."""
    forced = forced or set()
    if run_only:
        patterns = [re.compile(r) for r in run_only]
        roots = [n for n in graph.nodes if any(p.search(n.name) for p in patterns)]
        for p in patterns:
            if not any(p.search(n.name) for n in graph.nodes):
                warnings.append(f"--run-only {p.pattern!r} matches no step")
    else:
        roots = list(graph.targets) + [n for n in graph.nodes if id(n) in forced]
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        if not succeeded(node) or id(node) in forced:
            stack.extend(node.deps)
    return needed


def _check_forced_selected(graph: Graph, names: Sequence[str] | None, run_only: Sequence[str] | None,
                           needed: set[int]) -> None:
    """`--force-run STEP` with `--run-only`: STEP must be one the selection runs (a match or a dependency of
    one); otherwise the two flags contradict each other, and neither silently wins."""
    if not names or not run_only:
        return
    by_name = {n.name: n for n in graph.nodes}
    outside = [name for name in names if id(by_name[name]) not in needed]
    if outside:
        listed, selection = " ".join(outside), " ".join(run_only)
        raise ValueError(
            f"--force-run {listed}: not among the steps --run-only {selection} selects (its matches and "
            f"their dependencies), so it would not run; add it to --run-only (--run-only {selection} "
            f"{' '.join(re.escape(n) for n in outside)}) or leave out --run-only or --force-run {listed}")


def make_plan(
    graph: Graph,
    prefix: str,
    storage: Storage,
    *,
    run_only: Sequence[str] | None = None,
    force_run_failed: bool = False,
    force_run: Sequence[str] | None = None,
    now: float | None = None,
) -> Plan:
    now = time.time() if now is None else now
    paths = {id(n): n.output_path(prefix) for n in graph.nodes}
    scan = Scan(storage, list(paths.values()))
    warnings = list(graph.warnings)

    def previous(node: Node) -> dict[str, Any] | None:
        return scan.status.get(paths[id(node)])

    forced = forced_nodes(graph, force_run)
    needed = select(graph, run_only, lambda n: scan.succeeded(paths[id(n)]), warnings,
                    forced)
    _check_forced_selected(graph, force_run, run_only, needed)
    # step.json of every reused step (code drift, raw inputs under `warn`) and of every other step recorded
    # before (a damaged one is named: the run moves it aside), read concurrently up front
    infos = _reused_infos(graph, paths, needed, scan)
    if scan.unchecked:
        warnings.append(f"{scan.unchecked} succeeded step(s) were recorded before output manifests: their "
                        "outputs are trusted without a check (their next run records one)")
    entries: list[PlanEntry] = []
    by_node: dict[int, PlanEntry] = {}
    for node in graph.nodes:
        outputs = scan.outputs.get(paths[id(node)])
        if id(node) not in needed:
            if run_only:
                continue
            entry = _entry(node, paths[id(node)], SKIP,
                           "not needed: every step that uses it already succeeded",
                           previous(node))
            if outputs is not None and not outputs.ok:
                entry.warnings.append(outputs.describe() + " (not re-run: nothing that needs it will run)")
        else:
            entry = _decide(node, paths[id(node)], previous(node), by_node, storage, force_run_failed, now,
                            outputs, forced=id(node) in forced)
            if entry.action == RUN and entry.previous is None:
                entry.previous_hash, entry.changed, entry.changes = _explain(node, paths[id(node)], scan,
                                                                             storage,
                                                                             by_node)
            elif entry.action == SKIP and entry.previous is not None:
                entry.warnings.extend(_code_drift(node, infos.get(paths[id(node)])))
            info = infos.get(paths[id(node)])
            if entry.action != SKIP and isinstance(info, str):
                entry.warnings.append(f"{info} (this run moves it aside before it writes a new one)")
        by_node[id(node)] = entry
        entries.append(entry)
    return Plan(prefix, entries, warnings, len(graph.nodes) - len(needed) if run_only else 0)


def _entry(node: Node, path: str, action: str, reason: str, prev: dict[str, Any] | None) -> PlanEntry:
    return PlanEntry(node.name, node.hash, path, action, reason, [], [], [d.hash for d in node.deps], prev,
                     node)


def _blocked(node: Node, path: str, prev: dict[str, Any] | None,
             by_node: dict[int, PlanEntry]) -> PlanEntry | None:
    """BLOCKED when a dependency failed previously (or is blocked itself), else None."""
    for dep in node.deps:
        dep_entry = by_node.get(id(dep))
        if dep_entry is not None and dep_entry.action in (FAILED_ACTION, BLOCKED):
            verb = "failed previously" if dep_entry.action == FAILED_ACTION else "is blocked"
            return _entry(node, path, BLOCKED, f"dependency {dep.name} {verb}", prev)
    return None


def _decide(node: Node, path: str, prev: dict[str, Any] | None, by_node: dict[int, PlanEntry],
            storage: Storage,
            force_run_failed: bool, now: float, outputs: OutputCheck | None = None,
            forced: bool = False) -> PlanEntry:
    status = (prev or {}).get("status")
    if (prev or {}).get("_damaged"):  # blocked by a failed dependency, or run again; named either way
        entry = _blocked(node, path, prev, by_node) or _entry(
            node, path, RUN, "status.json cannot be read: run again as a new attempt (the earlier attempts' "
            "logs and outputs are kept)", prev)
        entry.warnings.append(str(prev["_damaged"]))  # type: ignore[index]
        return entry
    if forced and status in (SUCCESS, FAILED):
        forced_entry = _forced(node, path, prev, by_node)
        if forced_entry is not None:
            return forced_entry
    if status == SUCCESS and outputs is not None and not outputs.ok:
        return _entry(node, path, RUN, f"{outputs.describe()}; re-running", prev)
    if status == SUCCESS:
        entry = _entry(node, path, SKIP, f"already succeeded (attempt {prev.get('attempt')})", prev)  # type: ignore[union-attr]
        if outputs is not None and outputs.added:
            entry.warnings.append(outputs.describe() + " (reused: added files are not a reason to re-run)")
        return entry
    if status == FAILED and not force_run_failed:
        err = (prev or {}).get("error") or {}
        return _entry(node, path, FAILED_ACTION,
                      f"failed previously ({err.get('type')}: {str(err.get('message'))[:100]}); "
                      "re-run it with --force-run-failed", prev)
    blocked = _blocked(node, path, prev, by_node)
    if blocked is not None:
        return blocked
    if status in (RUNNING, WAITING):
        lease_text = storage.read_text(lease_path(path))
        lease = LeaseInfo.parse(lease_text) if lease_text else None
        lost = lease.lost(now) if lease is not None else "no lease"
        if lease is not None and lost is None:
            return _entry(node, path, WAIT, f"running under executor {lease.owner} "
                          f"(heartbeat {now - lease.heartbeat:.0f} s ago); will wait and reuse its result",
                          prev)
        owner = lease.owner if lease else (prev or {}).get("executor")
        return _entry(node, path, RUN, f"stale lease of executor {owner} ({lost}) will be taken over; its "
                      "attempt is recorded as interrupted", prev)
    reasons = {
        FAILED: "failed previously; re-running (--force-run-failed)",
        DEP_FAILED: "a dependency failed in an earlier run; re-running",
        PREEMPTED: "preempted in an earlier run; re-running",
        None: "not run yet under this prefix",
    }
    return _entry(node, path, RUN, reasons.get(status, f"previous status {status}; re-running"), prev)


def _forced(node: Node, path: str, prev: dict[str, Any] | None,
            by_node: dict[int, PlanEntry]) -> PlanEntry | None:
    """The entry of a step `--force-run` re-runs (None when a dependency failed: it stays blocked)."""
    for dep in node.deps:
        dep_entry = by_node.get(id(dep))
        if dep_entry is not None and dep_entry.action in (FAILED_ACTION, BLOCKED):
            return None
    upstream = [d.name for d in node.deps if (e := by_node.get(id(d))) is not None and e.forced]
    was = f"{(prev or {}).get('status', '').lower()} before (attempt {(prev or {}).get('attempt')})"
    reason = (f"forced by --force-run: {was}; re-running" if not upstream
              else f"dependency {upstream[0]} is forced to re-run (--force-run): {was}; re-running")
    entry = _entry(node, path, RUN, reason, prev)
    entry.forced = True
    return entry


def _explain(node: Node, path: str, scan: Scan, storage: Storage,
             by_node: dict[int, PlanEntry]) -> tuple[str | None, list[str], list[Change]]:
    """(hash of the latest earlier run of the same name under this prefix, the differences that explain it,
    as text and structured)."""
    candidates = scan.siblings(path)
    docs = scan.step_docs(candidates)
    found = previous_version([(p, d) for p, d in zip(candidates, docs, strict=True)
                              if d and d.get("name", node.name) == node.name], None)
    intro: list[str] = []
    others = scan.others(path) if found is None and scan.cross_name_budget > 0 else []
    if others:
        scan.cross_name_budget -= 1
        docs = scan.step_docs(others)
        expected = [(by_node[id(d)].previous_hash if id(d) in by_node else None) or d.hash for d in node.deps]
        similar = most_similar(node.identity, node.step.fn_path,
                               [(p, d) for p, d in zip(others, docs, strict=True) if d], expected)
        if similar is None:
            return None, [], []
        found = (similar[0], similar[1], True)
        intro = [f"compared with {similar[1].get('name')}: no earlier step named {node.name} here; it is the "
                 "most similar earlier step running the same function"]
    if found is None:
        return None, [], []
    _, prev, _ = found
    changes = identity_changes(prev, node.identity)
    old_deps = dependencies_of(prev)
    new_deps = {d.name: d for d in node.deps}
    changes += [_dependency_change(c, old_deps, new_deps, storage)
                for c in dependency_changes({n: str(d.get("hash")) for n, d in old_deps.items()},
                                            {n: d.hash for n, d in new_deps.items()})]
    if intro:  # a renamed step's renamed dependencies: `dependency train/a -> train/a-lr2 changed: ...`
        changes = _pair_dependencies(changes, old_deps, new_deps, storage)
    text = intro + [_describe(c, new_deps, by_node) for c in changes]
    if node.inputs is not None and node.inputs.identity_component():  # what the raw inputs changed
        text += node.inputs.changes(prev.get("raw_inputs"))
    if not text:
        text.append("no field differs: the hashing scheme or the encoding of a value type changed")
    return str(prev.get("hash", "")) or None, text, changes


def _dependency_change(change: Change, old_deps: dict[str, dict[str, Any]], new_deps: dict[str, Node],
                       storage: Storage) -> Change:
    """A changed dependency, explained by its own identity changes when its earlier step.json is readable."""
    name = change.field.removeprefix("dependency ")
    old_path = old_deps[name].get("output_path") if change.kind == "changed" else None
    old_info = read_record(storage, step_json_path(str(old_path))) if old_path else None
    if not old_info or not old_info.get("identity"):
        return change
    return dataclasses.replace(change, because=tuple(identity_changes(old_info, new_deps[name].identity)))


def _pair_dependencies(changes: list[Change], old_deps: dict[str, dict[str, Any]], new_deps: dict[str, Node],
                       storage: Storage) -> list[Change]:
    def doc(entry: dict[str, Any]) -> dict[str, Any] | None:
        node = entry.get("node")
        if isinstance(node, Node):
            return {"fn": node.step.fn_path, "identity": node.identity}
        path = entry.get("output_path")
        return read_record(storage, step_json_path(str(path))) if path else None

    plain = [c for c in changes if not c.is_dependency]
    deps = [c for c in changes if c.is_dependency]
    return plain + pair_renamed(deps, old_deps, {n: {"node": d} for n, d in new_deps.items()}, doc)


def _describe(change: Change, new_deps: dict[str, Node], by_node: dict[int, PlanEntry]) -> str:
    """The plan's line for a change; a changed dependency without its own differences is explained by the
    dependency changes the plan found upstream of it."""
    if not change.is_dependency or change.kind != "changed" or change.because:
        return change.describe()
    dep = new_deps[change.field.removeprefix("dependency ").split(" -> ")[-1]]
    found = by_node[id(dep)].changed if id(dep) in by_node else []
    upstream = [c for c in found if c.startswith("dependency")] or [c for c in found if c.startswith("raw ")]
    if upstream:
        text = upstream[0]
        return f"{change.field} changed: {text if len(text) < 200 else text[:197] + '...'}"
    return change.describe()


def _reused_infos(graph: Graph, paths: dict[int, str], needed: set[int],
                  scan: Scan) -> dict[str, dict[str, Any] | str | None]:
    """What the plan needs of the step.json of each needed step recorded before: code drift and raw inputs
    under `warn` for a reused one, and whether it can be read at all (a damaged one is named; the run moves it
    aside). A succeeded step's step.json that the output listing shows unchanged since SUCCESS (same checksum
    as recorded in the status) is not read: its `fn_source_hash` is in the status (storage/outputs.py
    `recorded_step_facts`). The others are read in one concurrent batch."""
    infos: dict[str, dict[str, Any] | str | None] = {}
    unread: list[str] = []
    for node in graph.nodes:
        path = paths[id(node)]
        if id(node) not in needed or scan.status.get(path) is None:
            continue
        if not scan.succeeded(path):
            unread.append(path)
            continue
        summary = (scan.status.get(path) or {}).get("outputs")
        facts = recorded_step_facts(summary, scan.listings.get(path)) if isinstance(summary, dict) else None
        warn = node.inputs is not None and node.inputs.policy == "warn"  # needs the recorded raw inputs
        if facts is not None and not warn:
            infos[path] = {"fn_source_hash": facts.get("fn_source_hash")}
        else:
            unread.append(path)
    infos.update(zip(unread, _checked_infos(scan.storage, unread), strict=True))
    return infos


def _checked_infos(storage: Storage, paths: Sequence[str]) -> list[dict[str, Any] | str | None]:
    """The step.json of reused steps, read in one concurrent batch; the damaged-file message (str) for one
    that cannot be read."""
    return [damaged.parse_lenient(step_json_path(path), data, str)
            for path, data in zip(paths, storage.read_many([step_json_path(p) for p in paths]), strict=True)]


def _code_drift(node: Node, info: dict[str, Any] | str | None) -> list[str]:
    """Warnings about a reused result (`info`: its step.json, or why it cannot be read): its function's
    source changed, or (policy `warn`) a raw input did."""
    if isinstance(info, str):
        return [info]
    recorded = (info or {}).get("fn_source_hash")
    current = fn_source_hash(node.step.fn)
    out = []
    if recorded and current and recorded != current:
        out.append(f"code drift: the source of {node.step.fn_path} changed since this step ran; its result "
                   "is reused as is (set Step(version=...) to re-address it on purpose)")
    if node.inputs is not None and node.inputs.policy == "warn" and isinstance((info or {}).get("raw_inputs"),
                                                                               dict):
        out.extend(f"{c} since this step ran; its result is reused (raw-input policy warn)"
                   for c in node.inputs.changes(info["raw_inputs"]) if c.startswith("raw input "))  # type: ignore[index]
    return out


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=1)
