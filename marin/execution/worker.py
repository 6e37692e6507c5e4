"""The worker side of a step: keep its status files, capture stdout/stderr into the attempt's log, call
`fn(config)`, report back.

The same function runs in a forked local process and inside a Ray task. The executor acquires the step's lease
before it submits an attempt. The worker first checks that the lease still names its executor (see
`_refusal`), then writes the attempt's records as the lease holder's agent: `step.json` (first attempt of a
run) and RUNNING (status and event) when it really starts; once `fn` returned, the output manifest
(marin/storage/outputs.py: inside the SUCCESS status for a step of few files, else `.marin/outputs.json`,
written first) and then SUCCESS (status and event) -
only after checking the lease again, so a worker whose executor lost the lease never marks the step SUCCESS -
and then it releases the lease for its executor (SUCCESS is final: the executor has nothing left to write).
On an object store, where each write is a round trip, what does not depend on another goes at once: step.json
with RUNNING's status and event; the lease check with the listing of the outputs; the attempt log's upload
with all of the end's records (the result is reported once all are done).
Failures are reported back and recorded by the executor, which decides about retries. Writing here instead
of in the driver keeps the driver's per-step work to the lease and the submission: on an object store every
record is a round trip, and a thousand of them in one driver thread would serialize the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from marin.execution.attempt import HOST, AttemptResult, Outcome, StepRecord
from marin.status import damaged, interruptions
from marin.status import files as sf
from marin.status.interruptions import PROGRESS_ENV
from marin.status.live_log import LogShipper
from marin.status.lock import PATCH_FILE
from marin.storage.base import Storage
from marin.storage.fs import storage_for
from marin.storage.lease import LeaseInfo
from marin.storage.outputs import record_listed_outputs

# Credentials the platform itself uses (the issue tracker's token). A step never sees them unless its own
# `env` passes one explicitly, so a step that prints its environment cannot leak them into its log.
PLATFORM_SECRETS = ("GITHUB_TOKEN", "GH_TOKEN")
ATTEMPT_ENV = "MARIN_ATTEMPT"


def _holds(record: StepRecord, holder: LeaseInfo | None) -> bool:
    """The lease names the attempt's executor, in the holding the attempt was submitted under (an executor
    that lost its lease and took it back has a new `acquired`: attempts from before are not its agents)."""
    return holder is not None and holder.owner == record.executor and (
        record.lease_acquired is None or holder.acquired == record.lease_acquired)


def _refusal(record: StepRecord, delivered_once: bool) -> AttemptResult | None:
    """None if the attempt may run. Otherwise what to report instead of running it:
    - this very attempt's SUCCESS is already recorded (Ray re-ran a task whose worker died after finishing it,
      before its result reached the executor): that result stands, and `lease_released` says whether the lease
      is already gone; not read when the backend hands each attempt to a worker once (`delivered_once`: the
      local backend, whose retry is a new attempt), since no earlier run of this attempt can exist;
    - the lease no longer names the executor's holding (taken over while this attempt was queued): lease lost.
    """
    storage = storage_for(record.output_path)
    if delivered_once:
        lease = storage.read_text(sf.lease_path(record.output_path))
        if _holds(record, LeaseInfo.parse(lease) if lease else None):
            return None
        return _lease_lost("the executor no longer held the step's lease when the attempt was to start; "
                           "it did not run")
    # both read at once (one round trip on an object store)
    status_data, lease_data = storage.read_many([sf.status_path(record.output_path),
                                                 sf.lease_path(record.output_path)])
    status = damaged.parse_lenient(sf.status_path(record.output_path), status_data) or {}
    holder = LeaseInfo.parse(lease_data.decode("utf-8")) if lease_data else None
    if (status.get("status") == sf.SUCCESS and status.get("attempt") == record.attempt
            and status.get("run_id") == record.run_id and status.get("executor") == record.executor):
        return AttemptResult(Outcome.SUCCESS, started=status.get("started"), ended=status.get("ended"),
                             lease_released=not _holds(record, holder))
    if _holds(record, holder):
        return None
    return _lease_lost("the executor no longer held the step's lease when the attempt was to start; "
                       "it did not run")


def _together(storage: Storage, *calls: Callable[[], Any]) -> list[Any]:
    """Independent calls at once on an object store (each is a round trip there), in order on local disk;
    returns their results once all are done, raising the first failure."""
    if storage.is_local:
        return [call() for call in calls]
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


@contextlib.contextmanager
def _meanwhile(work: Callable[[], None] | None) -> Iterator[None]:
    """Run `work` (the attempt log's upload) in a thread while the block writes the step's records; wait for
    it at the end, raising its failure there."""
    if work is None:
        yield
        return
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(work)
        yield
    future.result()


def _note_step_json(outputs: dict[str, Any], record: StepRecord) -> None:
    """The summary's `step_json` (the checksum the store listed for step.json) becomes `{"checksum",
    "fn_source_hash"}` when this attempt wrote step.json, so a plan that lists the same checksum knows the
    recorded source hash without reading the file (storage/outputs.py `recorded_step_facts`); dropped
    otherwise."""
    checksum = outputs.pop("step_json", None)
    if checksum is None or record.step_json is None:
        return
    try:
        source = json.loads(record.step_json).get("fn_source_hash")
    except (ValueError, AttributeError):
        return
    if isinstance(source, str):
        outputs["step_json"] = {"checksum": checksum, "fn_source_hash": source}


def _lease_lost(message: str, started: float | None = None, ended: float | None = None) -> AttemptResult:
    return AttemptResult(Outcome.LEASE_LOST, started=started, ended=ended, error_type="LeaseLost",
                         message=message)


def _record_start(record: StepRecord, started: float, events: sf.EventWriter | None = None) -> None:
    storage = storage_for(record.output_path)
    if events is None:
        events = sf.EventWriter(storage, record.output_path, fresh=False)

    def provenance() -> None:
        if record.patch is not None:  # before step.json, which names it (marin/status/lock.py)
            storage.write_text(f"{sf.meta_dir(record.output_path)}/{PATCH_FILE}", record.patch)
        if record.step_json is not None:
            storage.write_text(sf.step_json_path(record.output_path), record.step_json)

    # step.json and RUNNING (status and event) at once, all under the lease and all written before fn runs
    _together(storage, provenance,
              lambda: sf.write_status(storage, record.output_path, name=record.name, hash=record.hash,
                                      status=sf.RUNNING, attempt=record.attempt, run_id=record.run_id,
                                      executor=record.executor, previous={"created": record.created},
                                      started=started),
              lambda: events.append(sf.RUNNING, attempt=record.attempt, run_id=record.run_id,
                                    executor=record.executor))


def _record_fallbacks(record: StepRecord, started: float) -> None:
    """Damaged checkpoints the attempt skipped, as a ledger entry (status/interruptions.py), under the
    executor's lease: checked first (as `_record_success` does), since the ledger is read, changed and
    rewritten whole, and a lease taken over means its new holder (a driver, the supervisor) owns the step's
    records now - a lost worker writing here could undo its entry. A ledger that cannot be written is
    reported in the log, never fails the attempt."""
    try:
        storage = storage_for(record.output_path)
        lease = storage.read_text(sf.lease_path(record.output_path))
        if not _holds(record, LeaseInfo.parse(lease) if lease else None):
            return  # the lease is lost: `_record_success` reports it; nothing is written
        interruptions.record_fallbacks(storage, record.output_path, name=record.name,
                                       attempt=record.attempt, run_id=record.run_id, started=started)
    except Exception as exc:
        print(f"marin: warning: the checkpoint fallbacks of {record.name} could not be written to its "
              f"interruption ledger ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def _record_success(record: StepRecord, started: float, ended: float, events: sf.EventWriter) -> bool | None:
    """Write SUCCESS if the executor still holds the lease, then release the lease on its behalf.

    Returns None if the executor lost the lease (nothing written); otherwise whether the lease was released
    here. It is not when it changed since it was read (the executor's heartbeat renewed it meanwhile): the
    executor then releases it itself. Releasing here saves the executor a locked read and a delete per step,
    work that would otherwise queue up in its single scheduling thread."""
    storage = storage_for(record.output_path)
    lease_file = sf.lease_path(record.output_path)
    # the lease and the outputs' listing at once (both only read; nothing is written unless the lease holds)
    current, listing = _together(storage, lambda: storage.read_versioned(lease_file),
                                 lambda: storage.list_files(record.output_path))
    holder = LeaseInfo.parse(current.text) if current is not None else None
    if current is None or not _holds(record, holder):
        return None
    # The output manifest first: a SUCCESS status always has one (marin/storage/outputs.py).
    outputs = record_listed_outputs(storage, record.output_path, listing, record.nondeterministic)
    _note_step_json(outputs, record)
    # SUCCESS, status and event at once; both are written before the lease is released
    _together(storage,
              lambda: sf.write_status(storage, record.output_path, name=record.name, hash=record.hash,
                                      status=sf.SUCCESS, attempt=record.attempt, run_id=record.run_id,
                                      executor=record.executor, previous={"created": record.created},
                                      started=started, ended=ended, outputs=outputs),
              lambda: events.append(sf.SUCCESS, attempt=record.attempt, run_id=record.run_id,
                                    executor=record.executor))
    return storage.delete_if(lease_file, current.token)  # only if it is still the lease read above


@contextlib.contextmanager
def capture_output(log_file: str) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so subprocesses too) to `log_file`."""
    logs = os.path.dirname(log_file)
    try:  # usually `.marin` exists (the executor made it) and `logs/` is new: one mkdir, no stat
        os.mkdir(logs)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(logs, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    # Python-level streams too: a test runner or a Ray worker may have replaced sys.stdout with its own
    # object.
    stream = os.fdopen(os.dup(fd), "a", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = stream
        yield
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        sys.stdout, sys.stderr = saved_streams
        stream.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def execute_step(
    fn: Callable[[Any], Any],
    config: Any,
    log_path: str,
    env: Mapping[str, str],
    record: StepRecord | None = None,
    *dependencies: AttemptResult | None,
    delivered_once: bool = False,
) -> AttemptResult:
    """Run one attempt of a step; never raises (the outcome is returned).

    `log_path` is the attempt's log file; when it is not a local path (an object store), output is captured
    into a local temporary file that is uploaded when the attempt ends. `record`, when given, is written as
    described in the module docstring. `dependencies` are the results of attempts this one was queued behind
    (Ray passes them once they finished): if one of them did not succeed, `fn` is not called and the result
    is SKIPPED - the executor decides what happens to the step. `delivered_once`: the backend never runs
    this attempt twice (the local backend; Ray may re-run a task), so no earlier run's SUCCESS is looked for.
    """
    result = _attempt(fn, config, log_path, env, record, dependencies, delivered_once)
    if result.log_path == log_path and result.host == HOST:  # the success path makes its result whole
        return result
    return dataclasses.replace(result, log_path=log_path, host=HOST)


def _attempt(fn: Callable[[Any], Any], config: Any, log_path: str, env: Mapping[str, str],
             record: StepRecord | None, dependencies: tuple[AttemptResult | None, ...],
             delivered_once: bool) -> AttemptResult:
    not_ok = [d for d in dependencies if d is None or not d.ok]
    if not_ok:
        return AttemptResult(Outcome.SKIPPED, error_type="DependencyNotSucceeded", message=(
            f"a dependency's attempt did not succeed: {not_ok[0].message if not_ok[0] else None}"))
    started = time.time()
    events = None
    if record is not None:
        try:
            # a step's first attempt has no events yet: its two appends skip the read-back (sf.EventWriter)
            events = sf.EventWriter(storage_for(record.output_path), record.output_path,
                                    fresh=record.attempt == 1)
            refusal = _refusal(record, delivered_once)
            if refusal is not None:
                return refusal
            _record_start(record, started, events)
        except Exception as exc:  # the status store is unreachable: the attempt fails before fn runs
            return AttemptResult.from_exception(exc, context="cannot write the step's RUNNING status",
                                                started=started, ended=time.time())  # it started: a failure
    progress = interruptions.progress_path(record.output_path) if record is not None else None
    if record is not None:  # the attempt's number, for steps that label what they write (docs/health.md)
        env = {ATTEMPT_ENV: str(record.attempt), **env}
    failure, ended, upload_log = _call_capturing_output(fn, config, log_path, env, progress)
    with _meanwhile(upload_log):  # the log goes up while the records are written; both before the result
        if record is not None and record.attempt > 1:  # only a step that ran before has checkpoints to skip
            _record_fallbacks(record, started)
        if failure is not None:
            return AttemptResult.from_exception(failure, started=started, ended=ended)
        released = False
        if record is not None and events is not None:
            try:
                recorded = _record_success(record, started, ended, events)
            except Exception as exc:
                return AttemptResult.from_exception(
                    exc, context="the step finished but its SUCCESS status could not be written",
                    started=started, ended=ended)
            if recorded is None:
                return _lease_lost("the executor's lease was taken over while the step ran", started, ended)
            released = recorded
    # One result, made whole here: each copy of a frozen dataclass (`dataclasses.replace`) costs ~5 us.
    return AttemptResult(Outcome.SUCCESS, started=started, ended=ended, log_path=log_path, host=HOST,
                         lease_released=released)


def _call_capturing_output(fn: Callable[[Any], Any], config: Any, log_path: str, env: Mapping[str, str],
                           progress_file: str | None = None,
                           ) -> tuple[BaseException | None, float, Callable[[], None] | None]:
    """Call `fn(config)` with the step's env and output captured into the attempt's log; returns what it
    raised (None if it returned), when it ended, and, for a log on an object store, what uploads the whole
    log (the caller runs it, alongside the step's last records; None for a local log, already complete)."""
    remote_log = "://" in log_path and not log_path.startswith("file://")
    if remote_log:
        handle, local_log = tempfile.mkstemp(prefix="marin-attempt-", suffix=".log")
        os.close(handle)
    else:
        local_log = log_path
    failure: BaseException | None = None
    # On an object store the log is shipped in chunks while the step runs (readable live; kept up to the last
    # chunk if this node vanishes): marin/status/live_log.py
    shipper = LogShipper(storage_for(log_path), local_log, log_path).start() if remote_log else None
    with _step_environment(env, progress_file), capture_output(local_log):
        try:
            fn(config)
        except BaseException as exc:  # reported to the executor, which writes FAILED and re-raises there
            traceback.print_exc()
            failure = exc
    ended = time.time()
    if shipper is None:
        return failure, ended, None

    def upload() -> None:
        shipper.finish()
        os.unlink(local_log)

    return failure, ended, upload


@contextlib.contextmanager
def _step_environment(env: Mapping[str, str], progress_file: str | None = None) -> Iterator[None]:
    """The step's own variables set and the platform's secrets hidden while it runs; restored afterwards.
    The attempt that writes the step's records also gets MARIN_PROGRESS_FILE (status/interruptions.py)."""
    if progress_file is not None:
        env = {PROGRESS_ENV: progress_file, **env}
    hidden = [k for k in PLATFORM_SECRETS if k not in env and k in os.environ]
    saved_env = {k: os.environ.get(k) for k in (*env, *hidden)}
    for k in hidden:
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
