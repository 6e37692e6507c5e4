"""Closing a lost executor's attempts in the steps' records, by whoever detects the loss first.

An attempt whose executor (the driver) died stays RUNNING (or WAITING, a gang waiting for hosts) in its
step's `status.json` until someone closes it. Two detectors write the same records through `close_attempt`:
- the next executor that takes the step's lease over (records.py, `StepRecords.close_lost_attempt`);
- the supervisor of `marin submit --resubmit-on-driver-loss`, as soon as Ray reports the driver lost and
  before it resubmits (`close_driver_attempts`, called from marin/cluster/supervisor.py).

The records: a ledger entry (cause `driver_lost`, completed when the step's next attempt ends), the PREEMPTED
status and event (`lost_executor`, the entry's cause and progress), after a LEASE_TAKEOVER event naming the
lost owner and why it was judged lost. A lost attempt that was itself the next attempt after an earlier
interruption completes that earlier entry first (it ended, as any attempt's end does).

When the supervisor gives up (its resubmits are spent), no next attempt will complete the entries still
open: `close_given_up` closes them with their work lost (interruptions.close_unresumed), under each step's
lease, so goodput counts them.

Exactly once: the supervisor closes only the attempts of the runs its lost job started (the manifest's runs
whose `job` is that submission), only while `status.json` still names that run and its executor, and only
under the step's lease, taken over from that executor by the lease protocol's own rule (its process provably
gone on this machine, for as long as its attempts may outlive it, or its heartbeat older than its timeout:
`LeaseManager.try_acquire`). A lease held by anyone else is left alone (that step is theirs now). Holding the
lease, it re-reads the status, writes the records and releases the lease: a late worker of the lost attempt
then no longer holds the lease and cannot write SUCCESS over them (worker.py checks before it writes), and the
replacement driver finds the step PREEMPTED and free, with no lease timeout to wait.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from marin.execution import causes
from marin.status import files as sf
from marin.status import interruptions, manifest
from marin.storage.fs import Storage
from marin.storage.lease import LeaseInfo, LeaseManager

OPEN = (sf.RUNNING, sf.WAITING)  # an attempt in flight: started, or a gang waiting for its hosts
POLL_MIN_S, POLL_MAX_S = 0.5, 30.0  # the supervisor polls a lost lease every timeout/4, within these bounds
MARGIN_S = 10.0  # past the latest a lost lease goes stale: the supervisor stops waiting for it


def close_attempt(storage: Storage, output_path: str, *, name: str, hash: str, current: dict[str, Any] | None,
                  previous: LeaseInfo | None, lost_owner: str, why: str,
                  detected_by: str) -> tuple[str, float] | None:
    """If `current` (the step's status.json, read under the lease just taken over from `lost_owner`) is an
    attempt in flight, close it as interrupted (`driver_lost`): ledger entry, PREEMPTED status and event.
    Returns (the message, when it was cut short) for the run's manifest entry, or None when there was no
    such attempt."""
    if (current or {}).get("status") not in OPEN:
        return None
    assert current is not None
    attempt, run_id = int(current.get("attempt") or 0), str(current.get("run_id"))
    # when it was cut short, as far as anyone can tell: its last sign of life (the lost lease's last
    # heartbeat, or the attempt's own records when they are later: a heartbeat is every timeout/4)
    signs = [previous.heartbeat if previous is not None else None, current.get("started"),
             current.get("updated")]
    when = max((s for s in signs if isinstance(s, int | float)), default=time.time())
    message = f"executor {lost_owner} was lost ({why}); detected by {detected_by}"
    # the lost attempt was itself the next attempt after an earlier interruption: that entry ends with it
    interruptions.record_resume(storage, output_path, attempt=attempt, started=current.get("started"))
    entry = interruptions.record_interruption(
        storage, output_path, name=name, attempt=attempt, run_id=run_id, cause=causes.DRIVER_LOST, hosts=[],
        started=current.get("started"), ended=when, message=message)
    error = {"type": "DriverLost", "message": message, "traceback": ""}
    sf.write_status(storage, output_path, name=name, hash=hash, status=sf.PREEMPTED, attempt=attempt,
                    run_id=run_id, executor=detected_by, previous=current, started=current.get("started"),
                    ended=when, error=error)
    sf.append_event(storage, output_path, sf.PREEMPTED, attempt=attempt, run_id=run_id, executor=detected_by,
                    message=message, lost_executor=lost_owner, **interruptions.event_fields(entry))
    return message, when


def record_takeover(storage: Storage, output_path: str, *, attempt: int, run_id: str, executor: str,
                    previous_owner: str | None, why: str) -> None:
    """The LEASE_TAKEOVER event of `executor` taking the step's lease over from `previous_owner` (`why`: why
    it was judged lost, LeaseInfo.lost); written by either detector (this module, records.py)."""
    because = f" ({why})" if why else ""
    sf.append_event(storage, output_path, sf.LEASE_TAKEOVER, attempt=attempt, run_id=run_id,
                    executor=executor, previous_owner=previous_owner,
                    message=f"took over the stale lease of {previous_owner}{because}")


def _in_flight(current: dict[str, Any], lost: dict[str, str]) -> bool:
    """`current` (a status.json) is an attempt in flight of a lost run (`lost`: executor -> run id)."""
    return current.get("status") in OPEN and lost.get(str(current.get("executor"))) == current.get("run_id")


def _open_attempts(storage: Storage, steps: list[dict[str, Any]],
                   lost: dict[str, str]) -> list[dict[str, Any]]:
    """The steps whose status.json names an attempt in flight of a lost run (`lost`: executor -> run id).
    An unreadable status is left to the next executor (the damaged-file policy, status/damaged.py)."""
    found = []
    for step in steps:
        path = step.get("output_path")
        if not isinstance(path, str):
            continue
        current = sf.read_status(storage, path) or {}
        if _in_flight(current, lost):
            found.append(step)
    return found


def close_driver_attempts(storage: Storage, prefix: str, experiment_id: str, job: str, *, by: str,
                          max_wait_s: float | None = None) -> list[str]:
    """The supervisor's side: close the attempts in flight of the runs that the lost driver job `job`
    started (see the module docstring). Waits for each lost lease to be one the lease protocol lets `by`
    take over: at the latest until it must be stale (its heartbeat when first seen + its timeout +
    MARGIN_S; `max_wait_s`, when given, caps the wait), polling every timeout/4 (POLL_MIN_S..POLL_MAX_S).
    Returns the names of the steps closed."""
    data = sf.read_record(storage, manifest.manifest_path(prefix, experiment_id)) or {}
    lost = {str(r["executor"]): str(r.get("run_id")) for r in data.get("runs") or []
            if isinstance(r, dict) and r.get("job") == job and r.get("executor")}
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    pending = _open_attempts(storage, steps, lost) if lost else []
    if not pending:
        return []
    leases = LeaseManager(storage, owner=by, timeout_s=60.0)
    closed: list[str] = []
    cap = time.time() + max_wait_s if max_wait_s is not None else float("inf")
    deadlines: dict[str, float] = {}  # step output path -> when its lost lease must be stale
    try:
        while pending:
            waits: list[float] = []
            for step in list(pending):
                done = _try_close(storage, leases, step, lost, by)
                if isinstance(done, LeaseInfo):  # not yet: its lost lease is live
                    path = str(step["output_path"])
                    if done.owner != by:  # (our own stand-in: the lease vanished under our try)
                        deadlines.setdefault(path, done.heartbeat + done.timeout_s + MARGIN_S)
                    if time.time() < min(deadlines.get(path, cap), cap):
                        # (a lease whose process is gone here goes after `outlive_s`: its quarter, if shorter)
                        waits.append(min(done.timeout_s, done.outlive_s or done.timeout_s))
                        continue
                    _not_closed(step, "its lease did not go stale")
                elif done:
                    closed.append(str(step.get("name")))
                pending.remove(step)
                deadlines.pop(str(step["output_path"]), None)
            if pending:
                time.sleep(_poll_s(waits, min([cap, *deadlines.values()])))
    finally:
        leases.stop()
    return closed


def _poll_s(timeouts: list[float], until: float) -> float:
    """How long to wait before the next try: a quarter of the shortest lost lease's timeout (a live lease
    renews about that often), within POLL_MIN_S..POLL_MAX_S, and never past `until`."""
    poll = min(POLL_MAX_S, max(POLL_MIN_S, min(timeouts) / 4))
    return max(0.0, min(poll, until - time.time()))


def _not_closed(step: dict[str, Any], why: str) -> None:
    print(f"marin supervisor: the attempt of step {step.get('name')} was not closed in time ({why}); the "
          "next executor closes it when it takes the lease over", file=sys.stderr, flush=True)


def _try_close(storage: Storage, leases: LeaseManager, step: dict[str, Any], lost: dict[str, str],
               by: str) -> bool | LeaseInfo:
    """One try on one step: True closed, False nothing to close (now), or not yet: the lost driver's live
    lease, returned (its heartbeat and timeout say how long to wait)."""
    path, name = str(step["output_path"]), str(step.get("name"))
    lease_file = sf.lease_path(path)
    text = storage.read_text(lease_file)
    holder = LeaseInfo.parse(text) if text else None
    if holder is not None and holder.owner not in lost:
        return False  # someone else holds it: the step is theirs now
    current = sf.read_status(storage, path) or {}
    acquired = leases.try_acquire(lease_file, attempt=int(current.get("attempt") or 0) + 1)
    if not acquired.ok:
        if acquired.holder is None:  # vanished between our create and our read: try again at the next poll
            return LeaseInfo(by, time.time(), time.time(), 0.0, 0)
        return acquired.holder if acquired.holder.owner in lost else False
    try:
        if acquired.previous_owner is not None and acquired.previous_owner not in lost:
            return False  # taken over between our read and our swap: not the lost driver's lease
        current = sf.read_status(storage, path) or {}  # under the lease: what it says now
        if not _in_flight(current, lost):
            return False
        owner = acquired.previous_owner or str(current.get("executor"))
        why = acquired.why or "its lease was gone"
        record_takeover(storage, path, attempt=int(current.get("attempt") or 0) + 1,
                        run_id=str(current.get("run_id")), executor=by, previous_owner=owner, why=why)
        closed = close_attempt(storage, path, name=name, hash=str(step.get("hash")), current=current,
                               previous=acquired.previous, lost_owner=owner, why=why, detected_by=by)
        return closed is not None
    finally:
        leases.release(lease_file)


def close_given_up(storage: Storage, prefix: str, experiment_id: str, *, by: str, why: str) -> list[str]:
    """The supervisor gave up: close every ledger entry of the experiment's steps that no next attempt
    completed (interruptions.close_unresumed), each under the step's lease (free, or one the lease protocol
    lets `by` take over now; a step another executor holds is left to it). Returns the names of the steps
    whose entries were closed."""
    data = sf.read_record(storage, manifest.manifest_path(prefix, experiment_id)) or {}
    leases = LeaseManager(storage, owner=by, timeout_s=60.0)
    closed: list[str] = []
    try:
        for step in data.get("steps") or []:
            path = step.get("output_path") if isinstance(step, dict) else None
            if not isinstance(path, str) or not interruptions.was_interrupted(sf.read_status(storage, path)):
                continue
            if not any(e.get("resumed_attempt") is None and e.get("not_resumed") is None
                       for e in interruptions.read_ledger(storage, path)["interruptions"]):
                continue
            lease_file = sf.lease_path(path)
            status = sf.read_status(storage, path) or {}
            if not leases.try_acquire(lease_file, attempt=int(status.get("attempt") or 0) + 1).ok:
                continue
            try:
                if interruptions.close_unresumed(storage, path, at=time.time(), by=by, why=why):
                    closed.append(str(step.get("name")))
            finally:
                leases.release(lease_file)
    finally:
        leases.stop()
    return closed
