"""The experiments under a prefix: an index of their manifests, filtering, and one experiment's full picture.

`{prefix}/experiments/*.json` is listed at most once per cache TTL; only manifests whose signature (mtime,
etag...) changed are re-read, in one batched `cat` (concurrent on object stores). Filtering and paging then
run in memory, so listing 1,000 experiments costs one directory listing and a sort.

An experiment's state in the list is its latest run's status from the manifest (RUNNING, SUCCESS, FAILED);
the experiment page adds every step's own status.json. Its steps and their graph are a pure function of the
manifest and of what this request read of each status.json (`StepViews`): they are built again only when one
of those changed, never trusted longer than the reads they come from.
"""

from __future__ import annotations

import datetime as dt
import posixpath
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marin.dashboard.dag import layout
from marin.dashboard.schemas import (
    Dag,
    ExperimentDetail,
    ExperimentList,
    ExperimentSummary,
    IssueLink,
    RunSummary,
    StepError,
    StepRef,
)
from marin.dashboard.store import PrefixStore, signature
from marin.errors import CorruptFileError
from marin.jsonio import parse_json
from marin.status import files as sf
from marin.status.damaged import damaged_message
from marin.status.manifest import EXPERIMENTS_DIR

NEVER_RUN = "NEVER_RUN"
NOT_STARTED = "NOT_STARTED"
UNREADABLE = "UNREADABLE"  # a step whose status.json cannot be read
IssueLinker = Callable[[str | None], IssueLink | None]


_GITHUB_REF = re.compile(r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#([0-9]+)$")


def github_issue_link(ref: str | None) -> IssueLink | None:
    """'owner/repo#12' -> a link to the GitHub issue; anything else is shown as text, never linked."""
    if not ref:
        return None
    m = _GITHUB_REF.match(ref)
    if m:
        return IssueLink(ref=ref, url=f"https://github.com/{m.group(1)}/issues/{m.group(2)}")
    return IssueLink(ref=ref)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class ExperimentIndex:
    """Experiment manifests of one prefix, kept fresh by signature."""

    def __init__(self, store: PrefixStore, issue_link: IssueLinker = github_issue_link):
        self.store = store
        self.issue_link = issue_link
        self._manifests: dict[str, tuple[Any, dict[str, Any], ExperimentSummary]] = {}
        self._problems: dict[str, str] = {}
        self._by_hash: dict[str, list[str]] = {}  # step hash -> experiments naming it, newest first
        self._entries: dict[str, dict[str, Any]] = {}  # step hash -> its entry in the newest such manifest
        self._owners: dict[str, str] = {}  # step hash -> the oldest experiment naming it
        self._map: dict[str, dict[str, Any]] = {}
        self._newest: list[ExperimentSummary] = []  # every summary, newest first (the list's order)
        self._authors: list[str] = []
        self._refreshed = -1e18
        self._lock = threading.Lock()
        self.step_views = StepViews(store)

    # ----------------------------------------------------------------------------------------- refresh
    def refresh(self) -> None:
        if self.store.fresh_since(self._refreshed):
            return
        with self._lock:
            if self.store.fresh_since(self._refreshed):
                return
            entries = {
                e["name"][: -len(".json")]: e
                for e in self.store.ls(EXPERIMENTS_DIR)
                if e["type"] == "file" and e["name"].endswith(".json")
            }
            stale = [
                k
                for k, e in entries.items()
                if k not in self._manifests or self._manifests[k][0] != signature(e["info"])
            ]
            data = self.store.cat_many([f"{EXPERIMENTS_DIR}/{k}.json" for k in stale])
            for key in stale:
                rel = f"{EXPERIMENTS_DIR}/{key}.json"
                raw = data.get(rel)
                try:
                    if isinstance(raw, Exception):
                        raise raw
                    manifest = parse_json(raw, rel) if raw is not None else None
                    if not isinstance(manifest, dict):
                        raise ValueError("the manifest is not a JSON object")
                except (ValueError, OSError) as e:
                    cause = e.__cause__ or e
                    self._problems[key] = damaged_message(rel, f"{type(cause).__name__}: {cause}")
                    self._manifests.pop(key, None)
                    continue
                self._problems.pop(key, None)
                self._manifests[key] = (
                    signature(entries[key]["info"]),
                    manifest,
                    self._summary(key, manifest),
                )
            removed = set(self._manifests) - set(entries)
            for key in removed:
                del self._manifests[key]
            for key in set(self._problems) - set(entries):
                del self._problems[key]
            if stale or removed:
                self._index_steps()
            self._refreshed = time.monotonic()

    def _index_steps(self) -> None:
        by_hash: dict[str, list[str]] = {}
        entries: dict[str, dict[str, Any]] = {}
        newest_first = sorted(
            self._manifests.items(), key=lambda kv: (kv[1][2].created or 0, kv[0]), reverse=True
        )
        for key, (_, manifest, _) in newest_first:
            for entry in manifest.get("steps") or []:
                if isinstance(entry, dict) and isinstance(entry.get("hash"), str):
                    by_hash.setdefault(entry["hash"], []).append(key)
                    entries.setdefault(entry["hash"], entry)
        self._by_hash, self._entries = by_hash, entries
        self._owners = {h: keys[-1] for h, keys in by_hash.items()}
        self._map = {k: m for k, (_, m, _) in self._manifests.items()}
        # sorted once per change of the manifests, not per list request
        self._newest = sorted((s for _, _, s in self._manifests.values()),
                              key=lambda s: (s.created or 0, s.id), reverse=True)
        self._authors = sorted({s.user for s in self._newest if s.user})

    def _summary(self, key: str, m: dict[str, Any]) -> ExperimentSummary:
        runs = [RunSummary.model_validate(r) for r in m.get("runs") or [] if isinstance(r, dict)]
        last = runs[-1] if runs else None
        raw_steps = m.get("steps")
        steps: list[Any] = raw_steps if isinstance(raw_steps, list) else []
        return ExperimentSummary(
            id=key,
            script=_str(m.get("script")),
            description=_str(m.get("description")) or "",
            # The link is resolved per response (the local tracker may learn the issue later).
            issue=IssueLink(ref=m["issue"]) if isinstance(m.get("issue"), str) and m["issue"] else None,
            user=_str(m.get("user")),
            host=_str(m.get("host")),
            git_commit=_str(m.get("git_commit")),
            created=_float(m.get("created")),
            updated=_float(m.get("updated")),
            state=(last.status or "UNKNOWN") if last else NEVER_RUN,
            n_steps=len(steps),
            n_runs=len(runs),
            last_run=last,
        )

    # ----------------------------------------------------------------------------------------- queries
    def query(
        self,
        *,
        q: str | None = None,
        state: str | None = None,
        issue: str | None = None,
        author: str | None = None,
        since: dt.date | None = None,
        until: dt.date | None = None,
        offset: int = 0,
        limit: int = 25,
    ) -> ExperimentList:
        self.refresh()
        items = self._newest  # filtered below into new lists, never changed in place
        if q:
            needle = q.lower()
            items = [s for s in items if needle in _haystack(s)]
        if issue:
            items = [s for s in items if s.issue is not None and issue.lower() in s.issue.ref.lower()]
        if author:
            items = [s for s in items if (s.user or "").lower() == author.lower()]
        if since:
            lo = dt.datetime.combine(since, dt.time(), dt.UTC).timestamp()
            items = [s for s in items if (s.created or 0) >= lo]
        if until:
            hi = dt.datetime.combine(until + dt.timedelta(days=1), dt.time(), dt.UTC).timestamp()
            items = [s for s in items if (s.created or 0) < hi]
        counts: dict[str, int] = {}
        for s in items:
            counts[s.state] = counts.get(s.state, 0) + 1
        if state:
            wanted = {x.strip().upper() for x in state.split(",") if x.strip()}
            items = [s for s in items if s.state in wanted]
        return ExperimentList(
            total=len(items),
            offset=offset,
            limit=limit,
            items=[self._linked(s) for s in items[offset : offset + limit]],
            state_counts=counts,
            problems=sorted(self._problems.values()),
        )

    def _linked(self, s: ExperimentSummary) -> ExperimentSummary:
        return s.model_copy(update={"issue": self.issue_link(s.issue.ref)}) if s.issue else s

    def authors(self) -> list[str]:
        self.refresh()
        return self._authors

    def manifests(self) -> list[dict[str, Any]]:
        """Every readable manifest (kept fresh like the list), for views built on them (the catalogue)."""
        self.refresh()
        return [m for _, m, _ in self._manifests.values()]

    def signed_manifests(self) -> list[tuple[str, Any, dict[str, Any]]]:
        """(id, signature, manifest) of every readable manifest: a view caching what it derives from a
        manifest knows when that manifest changed (the alert index)."""
        self.refresh()
        return [(k, sig, m) for k, (sig, m, _) in self._manifests.items()]

    def signature_of(self, key: str) -> Any:
        """The manifest file's signature as last read (None: no such experiment)."""
        self.refresh()
        found = self._manifests.get(key)
        return found[0] if found else None

    def manifest_map(self) -> dict[str, dict[str, Any]]:
        """Every readable manifest by experiment id (rebuilt only when a manifest changed)."""
        self.refresh()
        return self._map

    def owners(self) -> dict[str, str]:
        """step hash -> the oldest experiment naming it: the one that owns it (marin/compare/runs.py)."""
        self.refresh()
        return self._owners

    def problem(self, key: str) -> str | None:
        """Why the manifest `key` cannot be read (the path and the fix), or None."""
        self.refresh()
        return self._problems.get(key)

    def known(self, key: str) -> dict[str, Any] | None:
        """The manifest `key` as last read, without looking at the store (None: never read): what an
        experiment page reads ahead from (marin/dashboard/read_ahead.py), never what it shows."""
        found = self._manifests.get(key)
        return found[1] if found else None

    def manifest(self, key: str) -> tuple[dict[str, Any], ExperimentSummary] | None:
        self.refresh()
        found = self._manifests.get(key)
        return (found[1], found[2]) if found else None

    def containing(self, step_hash: str) -> list[str]:
        """Ids of the experiments whose manifest names this step, newest first."""
        self.refresh()
        return list(self._by_hash.get(step_hash, []))

    def step_entry(self, step_hash: str) -> dict[str, Any] | None:
        """The step's entry (name, hash, output_path, dependency hashes) in the newest manifest naming it."""
        self.refresh()
        return self._entries.get(step_hash)

    def for_issue(self, ref: str) -> list[str]:
        self.refresh()
        return sorted(k for k, (_, _, s) in self._manifests.items() if s.issue and s.issue.ref == ref)

    def detail(self, key: str) -> ExperimentDetail | None:
        found = self.manifest(key)
        if found is None:
            return None
        manifest, summary = found
        summary = self._linked(summary)
        steps, dag = self.step_views.steps(key, manifest)
        counts: dict[str, int] = {}
        for s in steps:
            counts[s.status] = counts.get(s.status, 0) + 1
        runs = [RunSummary.model_validate(r) for r in manifest.get("runs") or [] if isinstance(r, dict)]
        active = summary.state == "RUNNING" or any(s.status in ("WAITING", "RUNNING") for s in steps)
        problems = [s.error.message for s in steps if s.status == UNREADABLE and s.error and s.error.message]
        last_args = runs[-1].args if runs else []
        return ExperimentDetail(
            **summary.model_dump(),
            script_args=last_args,
            runs=runs,
            steps=steps,
            step_counts=counts,
            dag=dag,
            active=active,
            problems=problems,
        )


def _haystack(s: ExperimentSummary) -> str:
    parts = [
        s.id,
        s.script or "",
        s.description,
        s.issue.ref if s.issue else "",
        s.user or "",
        s.git_commit or "",
    ]
    return "\n".join(parts).lower()


def step_rel(store: PrefixStore, entry: dict[str, Any]) -> str:
    """Where a step's files are, relative to the prefix: its recorded output path when it lies under this
    prefix (pinned paths included), else the documented layout `{name}-{hash8}` (a prefix copied
    elsewhere)."""
    out = entry.get("output_path")
    if isinstance(out, str):
        rel = store.relative(out)
        if rel:
            return rel
    return f"{entry.get('name')}-{str(entry.get('hash', ''))[:8]}"


_UNREAD = object()


def step_ref(store: PrefixStore, entry: dict[str, Any], status: Any = _UNREAD, rel: str | None = None
             ) -> StepRef:
    """A step named in a manifest (or step.json's dependencies) with its current status.json (`status`: as
    already read by `PrefixStore.read_json_many`, a CorruptFileError when it could not be; `rel`: its
    `step_rel` when known)."""
    rel = step_rel(store, entry) if rel is None else rel
    problems: list[str] = []
    if status is _UNREAD:
        status = store.read_json_noting(sf.status_path(rel), problems)
    elif isinstance(status, CorruptFileError):
        problems.append(str(status))
    status = status if isinstance(status, dict) else {}
    if problems:  # unreadable: named with the fix, never shown as not started (status/damaged.py)
        status = {"status": UNREADABLE, "error": {"type": "CorruptFile", "message": problems[0]}}
    started, ended = _float(status.get("started")), _float(status.get("ended"))
    error = status.get("error")
    deps = entry.get("dependencies") or []
    return StepRef(
        name=str(entry.get("name", "")),
        hash=str(entry.get("hash", "")),
        path=rel,
        status=_str(status.get("status")) or NOT_STARTED,
        attempt=status.get("attempt") if isinstance(status.get("attempt"), int) else None,
        started=started,
        ended=ended,
        duration=(ended - started) if started is not None and ended is not None else None,
        error=StepError.model_validate(error) if isinstance(error, dict) else None,
        dependencies=[
            d if isinstance(d, str) else str(d.get("hash", "")) for d in deps if isinstance(d, str | dict)
        ],
    )


@dataclass
class _StepsView:
    """One manifest's steps: where their status files are, and the steps and graph last built from them."""

    manifest: dict[str, Any]  # the parsed manifest these come from (compared by identity)
    entries: list[dict[str, Any]]
    rels: list[str]
    paths: list[str]  # each step's status.json
    parents: list[str]  # the directory above each step (`read_json_many` may list it whole)
    # the statuses (one per step) the steps and graph were last built from, with them: one tuple, replaced
    # whole, so a concurrent request never pairs one build's statuses with another's steps
    built: tuple[list[Any], list[StepRef], Dag] | None = None


class StepViews:
    """An experiment page's steps (`StepRef`) and laid-out graph, rebuilt only when what they are built from
    changed: the manifest (the same parsed object while its signature is the same) or a step's status as this
    request read it (`PrefixStore.read_json_many` returns the same parsed object for a file that did not
    change, and a new one for a file that did). Every status is read (checked against the store) on every
    request as before; only the work of turning 1,000 unchanged statuses into models and laying out the graph
    again is saved (about half of a later load's CPU on a 1,000-step page, and most of its garbage).

    Bounded: the `KEPT` experiments last asked for."""

    KEPT = 16

    def __init__(self, store: PrefixStore) -> None:
        self.store = store
        self._views: OrderedDict[str, _StepsView] = OrderedDict()
        self._lock = threading.Lock()

    def _view(self, key: str, manifest: dict[str, Any]) -> _StepsView:
        with self._lock:
            view = self._views.get(key)
            if view is not None and view.manifest is manifest:
                self._views.move_to_end(key)
                return view
        entries = [s for s in manifest.get("steps") or [] if isinstance(s, dict)]
        rels = [step_rel(self.store, e) for e in entries]
        view = _StepsView(manifest, entries, rels, [sf.status_path(r) for r in rels],
                          [posixpath.dirname(r) for r in rels])
        with self._lock:
            self._views[key] = view
            self._views.move_to_end(key)
            while len(self._views) > self.KEPT:
                self._views.popitem(last=False)
        return view

    def read_statuses(self, key: str, manifest: dict[str, Any]) -> tuple[_StepsView, list[Any]]:
        """The steps of the manifest `key` (as parsed: `manifest`), and what `PrefixStore.read_json_many`
        reads of their status.json now, one per step."""
        view = self._view(key, manifest)
        found = self.store.read_json_many(view.paths, view.parents)
        return view, [found[p] for p in view.paths]

    def steps(self, key: str, manifest: dict[str, Any]) -> tuple[list[StepRef], Dag]:
        """The manifest's steps with their current status, and their graph laid out."""
        view, statuses = self.read_statuses(key, manifest)
        built = view.built
        if (built is not None and len(built[0]) == len(statuses)
                and all(a is b for a, b in zip(built[0], statuses, strict=True))):
            return built[1], built[2]
        steps = [step_ref(self.store, entry, status, rel)
                 for entry, status, rel in zip(view.entries, statuses, view.rels, strict=True)]
        dag = layout(steps)
        view.built = (statuses, steps, dag)
        return steps, dag
