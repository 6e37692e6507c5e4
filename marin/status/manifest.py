"""The experiment manifest `{prefix}/experiments/{script stem}-{hash8}.json` (docs/formats.md).

One manifest per distinct DAG of a script; each run appends to `runs`. Updates are read-modify-write: two
executors starting the same experiment at the same instant can lose one `runs` entry on an object store (the
steps' own status files are unaffected).
"""

from __future__ import annotations

import time
from typing import Any

from marin.definition.placeholders import join
from marin.status.files import read_json, write_json
from marin.storage.fs import Storage


def manifest_path(prefix: str, experiment_id: str) -> str:
    return join(prefix, f"experiments/{experiment_id}.json")


def start_run(storage: Storage, prefix: str, experiment_id: str, *, script: str, description: str,
              issue: str | None, provenance: dict[str, Any], steps: list[dict[str, Any]], run_id: str,
              args: list[str]) -> None:
    path = manifest_path(prefix, experiment_id)
    now = time.time()
    data = read_json(storage, path) or {"id": experiment_id, "created": now, "runs": []}
    data.update({"id": experiment_id, "script": script, "description": description, "issue": issue,
                 "git_commit": provenance.get("git_commit"), "user": provenance.get("user"),
                 "host": provenance.get("host"), "updated": now, "steps": steps})
    data.setdefault("runs", []).append({"run_id": run_id, "started": now, "ended": None, "status": "RUNNING",
                                         "user": provenance.get("user"), "args": args, "publisher_errors": []})
    write_json(storage, path, data)


def end_run(storage: Storage, prefix: str, experiment_id: str, run_id: str, status: str,
            publisher_errors: list[dict[str, Any]]) -> None:
    path = manifest_path(prefix, experiment_id)
    data = read_json(storage, path) or {"id": experiment_id, "runs": []}
    now = time.time()
    data["updated"] = now
    for run in reversed(data.get("runs", [])):
        if run.get("run_id") == run_id:
            run.update({"ended": now, "status": status, "publisher_errors": publisher_errors})
            break
    write_json(storage, path, data)


def list_manifests(storage: Storage, prefix: str) -> list[dict[str, Any]]:
    names = storage.listdir(join(prefix, "experiments")) or []
    out = []
    for name in sorted(names):
        if name.endswith(".json"):
            data = read_json(storage, join(prefix, f"experiments/{name}"))
            if data:
                out.append(data)
    return out
