"""One step's full picture from its status files (paths from marin/status/files.py): status, events,
attempts, provenance, what changed versus its previous version, and its log tail.

"Previous version" is chosen, and the differences computed, by marin/graph/changes.py, as `marin plan` does:
the most recent *other* step with the same name under the prefix (the directories `{name}-{hash8}` next to
this one), created last before this step; when this step is the oldest, the newest other version.
"""

from __future__ import annotations

from typing import Any

from marin.dashboard.diff import field_rows
from marin.dashboard.experiments import (
    UNREADABLE,
    ExperimentIndex,
    IssueLinker,
    _float,
    _str,
    step_ref,
    step_rel,
)
from marin.dashboard.schemas import (
    Attempt,
    LogTail,
    PreviousVersion,
    StepChanges,
    StepDetail,
    StepEvent,
    StepStatus,
)
from marin.dashboard.store import PrefixStore
from marin.graph.changes import previous_version, step_changes, version_names
from marin.status import files as sf
from marin.status.damaged import skipped_message

TERMINAL = ("SUCCESS", "FAILED", "DEP_FAILED", "PREEMPTED")


class StepNotFound(LookupError):
    pass


def step_detail(store: PrefixStore, rel: str, issue_link: IssueLinker, index: ExperimentIndex) -> StepDetail:
    problems: list[str] = []  # state files that cannot be read: one banner, never a 500 (status/damaged.py)
    step = store.read_json_noting(sf.step_json_path(rel), problems)
    status_doc = store.read_json_noting(sf.status_path(rel), problems)
    if not isinstance(step, dict) and not isinstance(status_doc, dict) and not problems:
        raise StepNotFound(
            f"no step at {rel!r}: neither {sf.step_json_path(rel)} nor {sf.status_path(rel)} exists"
        )
    unreadable = status_doc is None and any(p.startswith(store.full(sf.status_path(rel))) for p in problems)
    status = StepStatus.model_validate(status_doc if isinstance(status_doc, dict)
                                       else {"status": UNREADABLE} if unreadable else {})
    step_hash = step.get("hash") if isinstance(step, dict) else status.hash
    experiments = index.containing(step_hash) if isinstance(step_hash, str) else []
    recorded = isinstance(step, dict)
    step = step if isinstance(step, dict) else _from_manifest(index, step_hash, experiments)
    events = _events(store, rel, problems)
    name = _str(step.get("name")) or status.name or rel
    lease = store.read_json_noting(sf.lease_path(rel), problems)
    wandb = store.read_json_noting(f"{rel}/wandb.json", problems)
    ledger = store.read_json_noting(f"{sf.meta_dir(rel)}/interruptions.json", problems)
    return StepDetail(
        path=rel,
        name=name,
        hash=_str(step.get("hash")) or status.hash,
        status=status,
        description=_str(step.get("description")) or "",
        fn=_str(step.get("fn")),
        fn_source_hash=_str(step.get("fn_source_hash")),
        version=None if step.get("version") is None else str(step.get("version")),
        config=step.get("config"),
        identity=step.get("identity"),
        config_class=_str(step.get("config_class")),
        dependencies=[step_ref(store, d) for d in step.get("dependencies") or [] if isinstance(d, dict)],
        resources=step.get("resources"),
        issue=issue_link(_str(step.get("issue"))),
        experiment=_str(step.get("experiment")),
        git_commit=_str(step.get("git_commit")),
        git_dirty=step.get("git_dirty") if isinstance(step.get("git_dirty"), bool) else None,
        packages=_dict(step.get("packages")),
        host=_str(step.get("host")),
        user=_str(step.get("user")),
        created=_float(step.get("created")),
        events=events,
        attempts=attempts(store, rel, events),
        lease=lease if isinstance(lease, dict) else None,
        changes=previous_changes(store, rel, step)
        if recorded
        else StepChanges(
            note="this step never ran, so it has no step.json; its definition comes from the manifest"
        ),
        experiments=experiments,
        recorded=recorded,
        wandb=wandb if isinstance(wandb, dict) else None,
        interruptions=ledger if isinstance(ledger, dict) else None,
        has_metrics=store.info(f"{rel}/metrics.jsonl") is not None,
        has_eval=store.info(f"{rel}/eval.json") is not None,
        active=status.status in ("WAITING", "RUNNING"),
        problems=problems,
    )


def _events(store: PrefixStore, rel: str, problems: list[str]) -> list[StepEvent]:
    """The step's events; lines that cannot be read are skipped and counted in `problems`."""
    events = [
        StepEvent.model_validate(e) for e in store.read_jsonl(sf.events_path(rel)) if isinstance(e, dict)
    ]
    if skipped := store.skipped_lines(sf.events_path(rel)):
        problems.append(skipped_message(sf.events_path(rel), skipped))
    return events


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _from_manifest(index: ExperimentIndex, step_hash: Any, experiments: list[str]) -> dict[str, Any]:
    """What the manifest knows of a step that never ran (DEP_FAILED, or waiting): name and dependencies."""
    entry = index.step_entry(step_hash) if isinstance(step_hash, str) else None
    if entry is None:
        return {}
    deps = [index.step_entry(d) for d in entry.get("dependencies") or [] if isinstance(d, str)]
    found = index.manifest(experiments[0]) if experiments else None
    return {
        "name": entry.get("name"),
        "hash": step_hash,
        "dependencies": [d for d in deps if d is not None],
        "experiment": experiments[0] if experiments else None,
        "issue": found[1].issue.ref if found and found[1].issue else None,
    }


def attempts(store: PrefixStore, rel: str, events: list[StepEvent]) -> list[Attempt]:
    """Attempts seen in the events and in the logs directory, with start, end and outcome."""
    by_n: dict[int, Attempt] = {}
    for e in events:
        if e.attempt is None:
            continue
        a = by_n.setdefault(e.attempt, Attempt(attempt=e.attempt))
        if e.event == "RUNNING" and a.started is None:
            a.started = e.ts
            a.executor = e.executor
        if e.event in TERMINAL:
            a.ended, a.outcome = e.ts, e.event
        elif e.event == "RUNNING" and a.outcome is None:
            a.outcome = "RUNNING"
    for entry in store.ls(sf.logs_dir(rel)):
        n = sf.attempt_of_log(entry["name"])
        if n is not None:
            a = by_n.setdefault(n, Attempt(attempt=n))
            a.log = sf.log_path(rel, n)
            a.log_size = entry["size"]
    return [by_n[n] for n in sorted(by_n)]


def versions(store: PrefixStore, name: str) -> list[tuple[str, dict[str, Any]]]:
    """(relative path, step.json) of every step named `name` under the prefix at its documented location."""
    parent, _, base = name.rpartition("/")
    found = []
    # Names only (no stat per entry): an entry that is not a step's directory has no step.json to read.
    for dirname in version_names(store.names(parent), base):
        rel = f"{parent}/{dirname}" if parent else dirname
        doc = store.read_json(sf.step_json_path(rel))
        if isinstance(doc, dict) and doc.get("name") == name:
            found.append((rel, doc))
    return found


def previous_changes(store: PrefixStore, rel: str, step: dict[str, Any]) -> StepChanges:
    name = str(step.get("name", ""))
    others = [(r, d) for r, d in versions(store, name) if r != rel and d.get("hash") != step.get("hash")]
    found = previous_version(others, _float(step.get("created")) or 0.0)
    if found is None:
        return StepChanges(note=f"no other version of step {name!r} exists under this prefix")
    prev_rel, prev, before = found
    changes = field_rows(step_changes(prev, step, lambda dep: _dep_doc(store, dep)))
    where = "the previous version" if before else "a newer version (this is the oldest one)"
    note = (
        f"{len(changes)} field(s) differ from {where} of {name!r}" if changes else "identical identity fields"
    )
    return StepChanges(
        previous=PreviousVersion(
            name=name, hash=str(prev.get("hash", "")), path=prev_rel, created=_float(prev.get("created"))
        ),
        changes=changes,
        note=note,
    )


def _dep_doc(store: PrefixStore, dep: dict[str, Any]) -> dict[str, Any] | None:
    doc = store.read_json(sf.step_json_path(step_rel(store, dep)))
    return doc if isinstance(doc, dict) else None


def log_tail(
    store: PrefixStore, rel: str, attempt: int | None, offset: int | None, max_bytes: int
) -> LogTail:
    """The end of an attempt's log (the latest attempt by default), or what was appended after `offset`."""
    logs = {n: e for e in store.ls(sf.logs_dir(rel)) if (n := sf.attempt_of_log(e["name"])) is not None}
    if attempt is None:
        status = store.read_json(sf.status_path(rel))
        current = status.get("attempt") if isinstance(status, dict) else None
        live = isinstance(current, int) and store.read_log_range(sf.log_path(rel, current), 0, 0) is not None
        known = isinstance(current, int) and (current in logs or live)
        attempt = current if known else max(logs, default=None)
    if attempt is None:
        return LogTail(attempt=None, path=None, size=0, start=0, end=0, text="", truncated=False)
    path = sf.log_path(rel, attempt)
    # A running attempt's log may be newer than the cached directory listing (or, on an object store, still a
    # set of live chunks): ask storage directly.
    read = store.read_log_range(path, offset, max_bytes)
    if read is None:
        return LogTail(attempt=attempt, path=None, size=0, start=0, end=0, text="", truncated=False)
    data, start, size = read
    text = data.decode("utf-8", errors="replace")
    return LogTail(
        attempt=attempt,
        path=path,
        size=size,
        start=start,
        end=start + len(data),
        text=text,
        truncated=start > 0,
    )
