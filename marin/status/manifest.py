"""The experiment manifest `{prefix}/experiments/{script stem}-{hash8}.json` (docs/formats.md).

One manifest per distinct DAG of a script; each run appends to `runs`. Updates are compare-and-swap (exclusive
create for the first run, a conditional replace on the version that was read afterwards, retried on conflict),
so two executors starting or ending runs of the same experiment at the same instant both land, on every store
with conditional writes (local, s3://, gs:// with google-cloud-storage; see docs/concepts.md, "Leases").
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

from marin.definition.placeholders import join
from marin.errors import CorruptFileError, NoExperimentsError, StepDefinitionError, StorageError
from marin.jsonio import json_text, parse_json
from marin.status.files import read_record
from marin.storage.base import Storage

CAS_TRIES = 50


def _update(storage: Storage, path: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> None:
    """Apply `change` to the manifest at `path` atomically with respect to other writers of it."""
    for attempt in range(CAS_TRIES):
        current = storage.read_versioned(path)
        if current is None:
            if storage.create_exclusive(path, json_text(change(None))):
                return
        else:
            try:
                data = parse_json(current.text, path)
            except CorruptFileError:
                data = None  # unreadable (a torn write by an old version): rebuilt from this run's facts
            if storage.replace_if(path, json_text(change(data if isinstance(data, dict) else None)),
                                  current.token):
                return
        time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # another writer won: back off, re-read, retry
    raise StorageError(f"could not update the experiment manifest {path}: {CAS_TRIES} concurrent writers won "
                       "in a "
                       "row. Fix: retry the run; if it persists, check that nothing rewrites the file in a "
                       "loop")


update_json = _update  # the same compare-and-swap update, for the other records under experiments/ (verdicts)

EXPERIMENTS_DIR = "experiments"  # under the prefix: one manifest per experiment


def manifest_path(prefix: str, experiment_id: str) -> str:
    return join(prefix, f"{EXPERIMENTS_DIR}/{experiment_id}.json")


class NotebookFrozenError(StepDefinitionError):
    """A run declares a hypothesis or criterion other than the one its experiment id was first run with."""


def _freeze_notebook(data: dict[str, Any], experiment_id: str, notebook: dict[str, Any] | None,
                     run_id: str, now: float, amendable: bool = False) -> None:
    """Record `notebook` (hypothesis, criteria, tags: marin/execution/notebook.py) the first time one is
    declared; a different one later replaces it only while `amendable` (no verdict recorded yet), the
    previous text kept in `notebook_amendments`; otherwise it is refused (docs/notebook.md)."""
    if notebook is None:
        return
    frozen = data.get("notebook")
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
              amendable: bool = False) -> None:
    """Add a RUNNING run to the experiment's manifest (made if absent); `now` defaults to the clock.
    `notebook` is frozen into it by the first run that declares one; a change is recorded as an amendment
    while `amendable` (no verdict recorded yet), else refused (NotebookFrozenError)."""
    now = time.time() if now is None else now

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "created": now, "runs": []}
        _freeze_notebook(data, experiment_id, notebook, run_id, now, amendable)
        data.update({"id": experiment_id, "script": script, "description": description, "issue": issue,
                     "git_commit": provenance.get("git_commit"), "user": provenance.get("user"),
                     "host": provenance.get("host"), "updated": now, "steps": steps})
        run = {"run_id": run_id, "started": now, "ended": None, "status": "RUNNING",
               "user": provenance.get("user"), "args": args, "publisher_errors": []}
        if os.environ.get("MARIN_JOB_SUBMISSION_ID"):  # a driver started by `marin submit` (cluster-run.md)
            run["job"] = os.environ["MARIN_JOB_SUBMISSION_ID"]
        data.setdefault("runs", []).append(run)
        return data

    _update(storage, manifest_path(prefix, experiment_id), change)


def end_run(storage: Storage, prefix: str, experiment_id: str, run_id: str, status: str,
            publisher_errors: list[dict[str, Any]], now: float | None = None) -> None:
    """Record how the run ended; `now` defaults to the clock."""
    now = time.time() if now is None else now

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"id": experiment_id, "runs": []}
        data["updated"] = now
        for run in reversed(data.get("runs", [])):
            if run.get("run_id") == run_id:
                run.update({"ended": now, "status": status, "publisher_errors": publisher_errors})
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


def list_manifests(storage: Storage, prefix: str) -> list[dict[str, Any]]:
    names = storage.listdir(join(prefix, "experiments")) or []
    out = []
    for name in sorted(names):
        if name.endswith(".json"):
            data = read_record(storage, join(prefix, f"experiments/{name}"))
            if data:
                out.append(data)
    return out


def require_manifests(storage: Storage, prefix: str) -> list[dict[str, Any]]:
    """`list_manifests`, or NoExperimentsError when the prefix holds none: the one error every read command
    (status, catalogue, verdict, issue, predictions, compare) gives for a wrong `--prefix`."""
    manifests = list_manifests(storage, prefix)
    if not manifests:
        raise NoExperimentsError(prefix)
    return manifests
