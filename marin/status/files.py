"""The per-step status files under `{output_path}/.marin/` (see docs/formats.md for the exact contract)."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from typing import Any

from marin import jsonio
from marin.definition.placeholders import join
from marin.errors import CorruptFileError
from marin.storage.base import Storage

WAITING, RUNNING, SUCCESS, FAILED, DEP_FAILED, PREEMPTED = (
    "WAITING",
    "RUNNING",
    "SUCCESS",
    "FAILED",
    "DEP_FAILED",
    "PREEMPTED",
)
STATUSES = (WAITING, RUNNING, SUCCESS, FAILED, DEP_FAILED, PREEMPTED)
LEASE_TAKEOVER = "LEASE_TAKEOVER"
_LOG_NAME = re.compile(r"^attempt-(\d+)\.log$")


def meta_dir(output_path: str) -> str:
    return join(output_path, ".marin")


def status_path(output_path: str) -> str:
    return join(output_path, ".marin/status.json")


def events_path(output_path: str) -> str:
    return join(output_path, ".marin/events.jsonl")


def step_json_path(output_path: str) -> str:
    return join(output_path, ".marin/step.json")


def lease_path(output_path: str) -> str:
    return join(output_path, ".marin/lease.json")


def log_relpath(attempt: int) -> str:
    return f"logs/attempt-{attempt}.log"


def attempt_of_log(name: str) -> int | None:
    """The attempt whose log is the file `name` in the logs directory (`attempt-3.log` -> 3), else None."""
    found = _LOG_NAME.match(name)
    return int(found.group(1)) if found else None


def log_path(output_path: str, attempt: int) -> str:
    return join(output_path, f".marin/{log_relpath(attempt)}")


def logs_dir(output_path: str) -> str:
    """The directory of a step's attempt logs (`attempt-{n}.log`)."""
    return join(output_path, ".marin/logs")


def new_executor_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def read_record(storage: Storage, path: str) -> dict[str, Any] | None:
    """An engine record (a JSON object: status, step, manifest, verdicts, ledger, progress) at `path`, or None
    when it does not exist. The lenient form of `marin.jsonio.read_json`: a file that is not JSON, or not a
    JSON object, also reads as None (a torn write on a store without atomic PUT; callers treat it as absent
    and rewrite it)."""
    try:
        data = jsonio.read_json(storage, path)
    except CorruptFileError:
        return None
    return data if isinstance(data, dict) else None


def read_status(storage: Storage, output_path: str) -> dict[str, Any] | None:
    return read_record(storage, status_path(output_path))


def write_status(
    storage: Storage,
    output_path: str,
    *,
    name: str,
    hash: str,
    status: str,
    attempt: int,
    run_id: str,
    executor: str,
    previous: dict[str, Any] | None,
    started: float | None = None,
    ended: float | None = None,
    error: dict[str, Any] | None = None,
    now: float | None = None,
    outputs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write status.json (docs/formats.md); `now` (default: the clock) is its `updated` time; `outputs` is a
    SUCCESS's output-manifest summary (marin/storage/outputs.py)."""
    now = time.time() if now is None else now
    record = {
        "name": name,
        "hash": hash,
        "status": status,
        "attempt": attempt,
        "run_id": run_id,
        "executor": executor,
        "created": (previous or {}).get("created") or now,
        "updated": now,
        "started": started,
        "ended": ended,
        "error": error,
        "log": log_relpath(attempt) if attempt > 0 else None,
    }
    if outputs is not None:
        record["outputs"] = outputs
    jsonio.write_json(storage, status_path(output_path), record)
    return record


def append_event(
    storage: Storage,
    output_path: str,
    event: str,
    *,
    attempt: int,
    run_id: str,
    executor: str,
    message: str = "",
    ts: float | None = None,
    **extra: Any,
) -> None:
    """Append one event line to events.jsonl; `ts` defaults to the clock."""
    record = {"ts": time.time() if ts is None else ts, "event": event, "attempt": attempt, "run_id": run_id,
              "executor": executor,
              "message": message, **extra}
    storage.append_text(events_path(output_path), json.dumps(record) + "\n")


def read_events(storage: Storage, output_path: str) -> list[dict[str, Any]]:
    text = storage.read_text(events_path(output_path)) or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
