"""The experiment manifest `{prefix}/experiments/{script stem}-{hash8}.json` (docs/formats.md).

One manifest per distinct DAG of a script; each run appends to `runs`. Updates are compare-and-swap (exclusive
create for the first run, a conditional replace on the version that was read afterwards, retried on conflict),
so two executors starting or ending runs of the same experiment at the same instant both land, on every store
with conditional writes (local, s3://, gs:// with google-cloud-storage; see docs/concepts.md, "Leases").
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from marin.definition.placeholders import join
from marin.errors import CorruptFileError, NoExperimentsError, StepDefinitionError, StorageError
from marin.jsonio import json_text, parse_json
from marin.status import damaged
from marin.status import files as sf
from marin.status.files import read_record
from marin.storage.base import Storage
from marin.storage.lease import ProcessId

CAS_TRIES = 50


Rebuild = Callable[[str | None, str], "dict[str, Any] | None"]


def _update(storage: Storage, path: str, change: Callable[[dict[str, Any] | None], dict[str, Any]],
            rebuild: Rebuild | None = None) -> None:
    """Apply `change` to the record at `path` atomically with respect to other writers of it. A record that
    cannot be read is moved aside (status/damaged.py) and `change` gets `rebuild(moved_to, why)` instead
    (None: it starts a new record), with a warning: nothing of it is overwritten."""
    for attempt in range(CAS_TRIES):
        try:
            current = storage.read_versioned(path)
            data = parse_json(current.text, path) if current is not None else None
            if data is not None and not isinstance(data, dict):
                raise CorruptFileError(f"a JSON {type(data).__name__}, not an object")
        except (CorruptFileError, UnicodeDecodeError) as e:
            why = f"{type(e.__cause__ or e).__name__}: {e.__cause__ or e}"
            moved = _set_aside(storage, path, why)
            if moved is None:
                continue  # another writer moved it (or repaired it) first: read again
            fresh = rebuild(moved, why) if rebuild is not None else None
            if storage.create_exclusive(path, json_text(change(fresh))):
                return
            continue
        if current is None:
            if storage.create_exclusive(path, json_text(change(None))):
                return
        elif storage.replace_if(path, json_text(change(data)), current.token):
            return
        time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # another writer won: back off, re-read, retry
    raise StorageError(f"could not update the experiment manifest {path}: {CAS_TRIES} concurrent writers won "
                       "in a "
                       "row. Fix: retry the run; if it persists, check that nothing rewrites the file in a "
                       "loop")


def _set_aside(storage: Storage, path: str, why: str) -> str | None:
    """Move the unreadable record at `path` aside and say so; None if it was no longer there or readable
    (a concurrent writer got to it first: the file it moved back is left in place)."""
    moved = damaged.move_aside(storage, path)
    if moved is None:
        return None
    try:
        readable = damaged.read_checked(storage, moved) is not None
    except CorruptFileError:
        readable = False
    if readable:  # a writer replaced the damaged file between our read and our move: put its file back
        if not storage.exists(path):
            storage.move(moved, path)
        return None
    print(f"marin: warning: {damaged.damaged_message(path, why)}\nmarin: it was moved to {moved} and "
          "is rebuilt from the steps' own records", file=sys.stderr, flush=True)
    return moved


def _recovered_runs(storage: Storage, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs the steps' own events name (one per run id: its first and last event, and how its steps
    ended in it: FAILED if one failed or was cut short, SUCCESS if all succeeded, else UNKNOWN)."""
    runs: dict[str, dict[str, Any]] = {}
    last: dict[tuple[str, str], str] = {}  # (run id, step output path) -> the step's last event in that run
    for step in steps:
        out = step.get("output_path")
        events, _ = sf.read_events_counted(storage, out) if isinstance(out, str) else ([], 0)
        for e in events:
            rid, ts = e.get("run_id"), e.get("ts")
            if not isinstance(rid, str) or not isinstance(ts, int | float):
                continue
            run = runs.setdefault(rid, {"run_id": rid, "started": ts, "ended": ts, "status": "UNKNOWN",
                                        "user": None, "args": [], "publisher_errors": [], "recovered": True})
            run["started"], run["ended"] = min(run["started"], ts), max(run["ended"], ts)
            if e.get("event") in sf.STATUSES:
                last[(rid, str(out))] = str(e.get("event"))
    for rid, run in runs.items():
        ends = [ev for (r, _), ev in last.items() if r == rid]
        if any(ev in (sf.FAILED, sf.DEP_FAILED, sf.PREEMPTED) for ev in ends):
            run["status"] = "FAILED"
        elif ends and all(ev == sf.SUCCESS for ev in ends):
            run["status"] = "SUCCESS"
    return sorted(runs.values(), key=lambda r: r["started"])


def rebuild_from_steps(storage: Storage, experiment_id: str, steps: list[dict[str, Any]]) -> Rebuild:
    """How a damaged manifest of `experiment_id` is rebuilt: its runs recovered from `steps`' events
    (`recovered: true`; their args and user are not in the steps' records), and a `rebuilt` note naming the
    damaged file kept aside."""

    def rebuild(moved: str | None, why: str) -> dict[str, Any]:
        runs = _recovered_runs(storage, steps)
        note = {"at": time.time(), "moved_to": moved, "why": why, "runs_recovered": len(runs)}
        return {"id": experiment_id, "created": runs[0]["started"] if runs else time.time(), "runs": runs,
                "steps": steps, "rebuilt": [note]}

    return rebuild


update_json = _update  # the same compare-and-swap update, for the other records under experiments/ (verdicts)

EXPERIMENTS_DIR = "experiments"  # under the prefix: one manifest per experiment


def manifest_path(prefix: str, experiment_id: str) -> str:
    return join(prefix, f"{EXPERIMENTS_DIR}/{experiment_id}.json")


class NotebookFrozenError(StepDefinitionError):
    """A run declares a hypothesis or criterion other than the one its experiment id was first run with."""


def _freeze_notebook(data: dict[str, Any], experiment_id: str, notebook: dict[str, Any] | None,
                     run_id: str, now: float, amendable: bool = False, judged: bool = False) -> None:
    """Record `notebook` (hypothesis, criteria, tags: marin/execution/notebook.py) the first time one is
    declared; a different one later replaces it only while `amendable` (no verdict recorded yet), the
    previous text kept in `notebook_amendments`; otherwise it is refused (docs/notebook.md)."""
    if notebook is None:
        return
    frozen = data.get("notebook")
    if frozen is None and judged:  # a verdict, yet nothing frozen: the manifest that froze it is lost
        raise NotebookFrozenError(
            f"experiment {experiment_id} has a recorded verdict, but its manifest holds no frozen "
            "hypothesis/criterion (it was damaged and moved aside to a *.corrupt-* file, or deleted): this "
            "run cannot freeze its own in that one's place. Fix: restore the manifest (its `notebook` block "
            "from the moved-aside file or a copy), or register a new experiment by renaming the script")
    if isinstance(frozen, dict) and frozen.get("sha256") != notebook.get("sha256"):
        if not amendable:
            was, now_sha = str(frozen.get("sha256"))[:12], str(notebook.get("sha256"))[:12]
            raise NotebookFrozenError(
                f"experiment {experiment_id} was first run with another hypothesis/criterion (notebook "
                f"sha256 {was}, frozen by run {frozen.get('frozen_by')}), and a verdict was recorded; "
                f"this run declares {now_sha}. A hypothesis is never edited after launch once it has a "
                "verdict. Fix: restore the recorded one (hypothesis: "
                f"{str(frozen.get('hypothesis'))[:120]!r}), or register a new experiment by renaming the "
                "script (the experiment id is the script's stem plus the DAG's hash)")
        previous = {k: frozen.get(k) for k in ("hypothesis", "criteria", "tags", "sha256", "frozen",
                                                 "frozen_by")}
        data.setdefault("notebook_amendments", []).append(
            {"at": now, "run_id": run_id, "sha256": notebook.get("sha256"), "previous": previous})
        data["notebook"] = {**notebook, "frozen": now, "frozen_by": run_id}
        return
    if not isinstance(frozen, dict):
        data["notebook"] = {**notebook, "frozen": now, "frozen_by": run_id}


def start_run(storage: Storage, prefix: str, experiment_id: str, *, script: str, description: str,
              issue: str | None, provenance: dict[str, Any], steps: list[dict[str, Any]], run_id: str,
              args: list[str], now: float | None = None, notebook: dict[str, Any] | None = None,
              amendable: bool = False, executor: str | None = None, judged: bool = False) -> None:
    """Add a RUNNING run to the experiment's manifest (made if absent); `now` defaults to the clock.
    `notebook` is frozen into it by the first run that declares one; a change is recorded as an amendment
    while `amendable` (no verdict recorded yet), else refused (NotebookFrozenError), as is freezing one at
    all when the experiment was `judged` but its manifest holds none (lost with a damaged manifest).
    `executor` (its id) and this process are recorded with the run; a RUNNING run whose process is provably
    gone (on this machine) is closed as DRIVER_LOST on the way."""
    now = time.time() if now is None else now

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "created": now, "runs": []}
        _freeze_notebook(data, experiment_id, notebook, run_id, now, amendable, judged)
        data.update({"id": experiment_id, "script": script, "description": description, "issue": issue,
                     "git_commit": provenance.get("git_commit"), "user": provenance.get("user"),
                     "host": provenance.get("host"), "updated": now, "steps": steps})
        _close_gone_runs(data, executor, now)
        run = {"run_id": run_id, "started": now, "ended": None, "status": "RUNNING",
               "user": provenance.get("user"), "args": args, "publisher_errors": []}
        if executor is not None:  # who runs it: a later run on this machine can prove it gone (lease.py)
            process = ProcessId.current()
            run.update({"executor": executor, "process": process.to_dict() if process else None})
        if os.environ.get("MARIN_JOB_SUBMISSION_ID"):  # a driver started by `marin submit` (cluster-run.md)
            run["job"] = os.environ["MARIN_JOB_SUBMISSION_ID"]
        data.setdefault("runs", []).append(run)
        return data

    _update(storage, manifest_path(prefix, experiment_id), change,
            rebuild_from_steps(storage, experiment_id, steps))


DRIVER_LOST = "DRIVER_LOST"  # a run whose executor (driver) was lost: closed by whoever detected it


def _close(run: dict[str, Any], *, ended: float, detected: float, by: str | None, message: str) -> None:
    run.update({"status": DRIVER_LOST, "ended": ended,
                "interrupted": {"cause": "driver_lost", "detected": detected, "by": by, "message": message}})


def _close_gone_runs(data: dict[str, Any], executor: str | None, now: float) -> None:
    """Close every RUNNING run of `data` whose executor's process is provably gone (same machine)."""
    for run in data.get("runs") or []:
        if not isinstance(run, dict) or run.get("status") != "RUNNING":
            continue
        process = ProcessId.parse(run.get("process"))
        gone = process.gone() if process is not None else None
        if gone is not None:
            _close(run, ended=now, detected=now, by=executor,
                   message=f"executor {run.get('executor')} was lost: {gone}")


def close_lost_run(storage: Storage, prefix: str, experiment_id: str, run_id: str, *, ended: float,
                   by: str, message: str) -> bool:
    """Close run `run_id` of the experiment as DRIVER_LOST if its manifest still says RUNNING (a later
    executor took over a step it ran, and found its executor lost); True if it did."""
    path = manifest_path(prefix, experiment_id)
    found = read_record(storage, path)
    runs = [r for r in (found or {}).get("runs", []) if isinstance(r, dict)]
    if not any(r.get("run_id") == run_id and r.get("status") == "RUNNING" for r in runs):
        return False
    now = time.time()

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "runs": []}
        for run in data.get("runs", []):
            if isinstance(run, dict) and run.get("run_id") == run_id and run.get("status") == "RUNNING":
                _close(run, ended=ended, detected=now, by=by, message=message)
                data["updated"] = now
        return data

    _update(storage, path, change)
    return True


def end_run(storage: Storage, prefix: str, experiment_id: str, run_id: str, status: str,
            publisher_errors: list[dict[str, Any]], now: float | None = None,
            steps: list[dict[str, Any]] | None = None) -> None:
    """Record how the run ended; `now` defaults to the clock; `steps` (the manifest's) rebuild it if it was
    damaged meanwhile."""
    now = time.time() if now is None else now

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "runs": []}
        data["updated"] = now
        if not any(r.get("run_id") == run_id for r in data.get("runs", [])):  # the manifest was rebuilt
            data.setdefault("runs", []).append({"run_id": run_id, "started": None, "args": [],
                                                "recovered": True})
        for run in reversed(data.get("runs", [])):
            if run.get("run_id") == run_id:
                run.update({"ended": now, "status": status, "publisher_errors": publisher_errors})
                break
        return data

    _update(storage, manifest_path(prefix, experiment_id), change,
            rebuild_from_steps(storage, experiment_id, steps or []))


def add_publisher_errors(storage: Storage, prefix: str, experiment_id: str, run_id: str,
                         errors: list[dict[str, Any]]) -> None:
    """Append errors that came after the run ended (an after-run hook such as --publish) to its run's
    `publisher_errors`; nothing when the run is not in the manifest."""
    if not errors:
        return

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "runs": []}
        for run in reversed(data.get("runs", [])):
            if run.get("run_id") == run_id:
                run["publisher_errors"] = [*(run.get("publisher_errors") or []), *errors]
                break
        return data

    _update(storage, manifest_path(prefix, experiment_id), change)


def record_driver_loss(storage: Storage, prefix: str, experiment_id: str, *, job: str, ended: float | None,
                       message: str) -> None:
    """A submitted driver was lost: its run ends DRIVER_LOST and the experiment's `interruptions` gains an
    entry.

    Idempotent per job (a restarted supervisor may record the same loss twice)."""
    now = time.time()

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "runs": []}
        for run in data.get("runs", []):
            if run.get("job") == job and run.get("status") == "RUNNING":
                run.update({"ended": ended or now, "status": "DRIVER_LOST"})
        entries = data.setdefault("interruptions", [])
        if not any(e.get("job") == job for e in entries):
            entries.append({"cause": "driver_lost", "job": job, "at": ended or now, "detected": now,
                            "message": message})
        data["updated"] = now
        return data

    _update(storage, manifest_path(prefix, experiment_id), change)


def list_manifests(storage: Storage, prefix: str,
                   problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Every readable manifest under the prefix; each unreadable one is named in `problems` (with the fix)
    when a list is given, never skipped in silence."""
    names = storage.listdir(join(prefix, "experiments")) or []
    out = []
    for name in sorted(names):
        if name.endswith(".json"):
            try:
                data = damaged.read_checked(storage, join(prefix, f"experiments/{name}"))
            except CorruptFileError as e:
                if problems is not None:
                    problems.append(str(e))
                continue
            if data:
                out.append(data)
    return out


def require_manifests(storage: Storage, prefix: str,
                      problems: list[str] | None = None) -> list[dict[str, Any]]:
    """`list_manifests`, or NoExperimentsError when the prefix holds none: the one error every read command
    (status, catalogue, verdict, issue, predictions, compare) gives for a wrong `--prefix`. A prefix whose
    manifests are all damaged holds experiments: they are named in `problems` (when given), not refused."""
    seen: list[str] = []
    manifests = list_manifests(storage, prefix, seen)
    if problems is not None:
        problems.extend(seen)
    if not manifests and not seen:
        raise NoExperimentsError(prefix)
    return manifests
