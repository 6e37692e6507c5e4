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
from marin.status import damaged
from marin.storage.base import Storage
from marin.storage.listed_cache import remember

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
DAMAGED_RECORD = "DAMAGED_RECORD"  # an unreadable status.json was moved aside before a new attempt
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
    JSON object, also reads as None. For views that show what they can; anything that decides or rewrites
    from a record reads it with `damaged.read_checked` (status/damaged.py: named, moved aside, never
    overwritten)."""
    try:
        data = jsonio.read_json(storage, path)
    except CorruptFileError:
        return None
    return data if isinstance(data, dict) else None


def read_status(storage: Storage, output_path: str) -> dict[str, Any] | None:
    """The step's status.json, None when absent or unreadable (the lenient form, for code that only needs
    to know whether a status it wrote is there; see `read_status_checked`)."""
    return read_record(storage, status_path(output_path))


def read_status_checked(storage: Storage, output_path: str) -> dict[str, Any] | None:
    """The step's status.json, None when absent; `CorruptFileError` naming the path and the fix when it
    cannot be read (status/damaged.py): what the plan, `marin status` and the executor use."""
    return damaged.read_checked(storage, status_path(output_path))


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
    waiting: str | None = None,
) -> dict[str, Any]:
    """Write status.json (docs/formats.md); `now` (default: the clock) is its `updated` time; `outputs` is a
    SUCCESS's output-manifest summary (marin/storage/outputs.py); `waiting`: what a WAITING attempt waits for
    (a gang's hosts)."""
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
    if waiting is not None:
        record["waiting"] = waiting
    text = jsonio.json_text(record)
    storage.write_text(status_path(output_path), text)
    if not storage.is_local:  # the next plan on this machine need not read it back (storage/listed_cache.py)
        remember(storage, status_path(output_path), text)
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
    """Append one event line to events.jsonl; `ts` defaults to the clock (see `EventWriter` for a writer
    that appends more than once)."""
    storage.append_text(events_path(output_path), _event_line(event, attempt, run_id, executor, message, ts,
                                                              extra))


class EventWriter:
    """One writer's appends to a step's events.jsonl (a worker's RUNNING and SUCCESS of one attempt) that
    remember what they wrote, so an object store is not read back before each append. On an object store
    an append is a read and a rewrite (two round trips, `Storage.append_text`). Here the first append of a
    `fresh` step (its first attempt: no events yet) is a create-if-absent that answers with the object's
    version (`Storage.create_versioned`), and the next one rewrites that very version with one more line
    (`Storage.replace_if`): one request each. A refused condition (the file existed, or someone else
    appended meanwhile, or a retried request of this writer that had landed) falls back to a read of the
    file with its version and a rewrite of that version, repeated while someone else writes in between, so
    no line another writer added is ever overwritten, and a line that is already there is not written
    twice. On local disk every append is the OS's `O_APPEND`. The file's format is unchanged."""

    def __init__(self, storage: Storage, output_path: str, *, fresh: bool) -> None:
        self.storage, self.path = storage, events_path(output_path)
        self._create = fresh and not storage.is_local
        self._known: tuple[str, Any] | None = None  # (the text this writer left, its version token)

    def append(self, event: str, *, attempt: int, run_id: str, executor: str, message: str = "",
               ts: float | None = None, **extra: Any) -> None:
        line = _event_line(event, attempt, run_id, executor, message, ts, extra)
        create, known = self._create, self._known
        self._create, self._known = False, None
        if create:
            created, token = self.storage.create_versioned(self.path, line)
            if created:
                self._known = (line, token) if token is not None else None
                return
        elif known is not None and self.storage.replace_if(self.path, known[0] + line, known[1]):
            return
        if self.storage.is_local:
            self.storage.append_text(self.path, line)
        else:
            self._append_conditionally(line)

    def _append_conditionally(self, line: str) -> None:
        """The refused condition's way out: read the file with its version and rewrite that very version with
        the line added, again until no one else wrote in between. A line already in the file is not added
        twice: a conditional write whose answer was lost is retried by the client library
        (google-cloud-storage and botocore do), and the retry's refusal does not mean the first request
        failed. The line is unique
        (its clock, run and attempt), so finding it means this writer's earlier request landed."""
        for _ in range(_CONDITIONAL_TRIES):
            found = self.storage.read_versioned(self.path)
            if found is None:
                created, _token = self.storage.create_versioned(self.path, line)
                if created:
                    return
                continue
            if line in found.text.splitlines(keepends=True):
                return
            text = found.text if not found.text or found.text.endswith("\n") else found.text + "\n"
            if self.storage.replace_if(self.path, text + line, found.token):
                return
        # contended each time: the plain read-and-rewrite, as before
        self.storage.append_text(self.path, line)


_CONDITIONAL_TRIES = 20


def _event_line(event: str, attempt: int, run_id: str, executor: str, message: str, ts: float | None,
                extra: dict[str, Any]) -> str:
    record = {"ts": time.time() if ts is None else ts, "event": event, "attempt": attempt, "run_id": run_id,
              "executor": executor, "message": message, **extra}
    return json.dumps(record) + "\n"


def read_events(storage: Storage, output_path: str) -> list[dict[str, Any]]:
    """The step's events, oldest first; lines that cannot be read are skipped (see `read_events_counted`)."""
    return read_events_counted(storage, output_path)[0]


def read_events_counted(storage: Storage, output_path: str) -> tuple[list[dict[str, Any]], int]:
    """(the step's events, how many lines were skipped: cut short, binary or not an object)."""
    return damaged.parse_jsonl(storage.read_bytes(events_path(output_path)))


def attempts_on_record(storage: Storage, output_path: str) -> int:
    """The highest attempt number a step's records still show when its status cannot be read: from its
    events and from the log files present (`logs/attempt-{N}.log`, `attempt-{N}.rank-{K}.log`)."""
    events, _ = read_events_counted(storage, output_path)
    highest = max((e["attempt"] for e in events if isinstance(e.get("attempt"), int)), default=0)
    for name in storage.listdir(logs_dir(output_path)) or []:
        found = attempt_of_log(name.split(".", 1)[0] + ".log")
        highest = max(highest, found or 0)
    return highest
