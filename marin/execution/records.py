"""What the executor itself writes and reads under a step's output path (the formats are in formats.md).

The worker writes an attempt's step.json, RUNNING and SUCCESS (worker.py); everything else about a step in
a run is written here, always under a lease this executor holds: the event of each failed or preempted
attempt, the final FAILED or PREEMPTED status, DEP_FAILED (with step.json, so later plans can explain what
changed), PREEMPTED for attempts cut short by an interrupted executor, and the takeover of a stale lease.
It also resolves a step's config for this run (placeholders to output paths) and builds the `StepRecord`
an attempt's worker writes from.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from marin import jsonio
from marin.definition.identity import resolve
from marin.definition.step import Step
from marin.errors import CorruptFileError
from marin.execution import lost_attempts
from marin.execution.attempt import StepRecord
from marin.execution.state import StepState
from marin.graph.dag import Graph, Node
from marin.graph.plan import damaged_status
from marin.status import damaged, interruptions, manifest
from marin.status import files as sf
from marin.status.stepinfo import step_info
from marin.storage.fs import Storage
from marin.storage.lease import Acquired


@dataclasses.dataclass
class RunContextInfo:
    run_id: str
    executor_id: str
    experiment_id: str
    issue: str | None
    prefix: str
    provenance: dict[str, Any]
    patch: str | None = None  # a dirty checkout's diff, written as .marin/source.patch (status/lock.py)


class StepRecords:
    def __init__(self, storage: Storage, ctx: RunContextInfo, graph: Graph,
                 state_of: Callable[[str], StepState | None]) -> None:
        self.storage = storage
        self.ctx = ctx
        self.graph = graph
        self._state_of = state_of

    # ----- reading --------------------------------------------------------------------------------------
    def current(self, st: StepState) -> dict[str, Any] | None:
        """The step's status.json now; one that cannot be read is `damaged_status` (its message)."""
        try:
            return sf.read_status_checked(self.storage, st.path)
        except CorruptFileError as e:
            return damaged_status(str(e))

    def keep_damaged(self, st: StepState, current: dict[str, Any]) -> dict[str, Any]:
        """Under the step's lease, before an attempt after an unreadable status.json: move the status aside,
        keep the earlier outputs under `.marin/earlier-{N}/`, and return the status the next attempt
        continues from (attempt N from the events and logs present, `created` from the first event)."""
        events, _ = sf.read_events_counted(self.storage, st.path)
        last = sf.attempts_on_record(self.storage, st.path)
        aside = damaged.move_aside(self.storage, sf.status_path(st.path))
        self.keep_damaged_step_json(st)  # step.json too, if damaged (named): the new attempt rewrites it
        kept = damaged.keep_outputs(self.storage, st.path, last)
        message = (f"status.json could not be read; moved to {aside}; attempt {last + 1} follows the "
                   f"{last} on record" + (f"; the earlier outputs are kept in {kept}" if kept else ""))
        print(f"marin: step {st.node.name}: {message}", file=sys.stderr, flush=True)
        self._event(st, sf.DAMAGED_RECORD, last, message=message, path=sf.status_path(st.path),
                    moved_to=aside, outputs_kept=kept, damage=current.get("_damaged"))
        created = next((e["ts"] for e in events if isinstance(e.get("ts"), int | float)), None)
        return {"attempt": last, "created": created}

    def keep_finished(self, st: StepState, current: dict[str, Any]) -> str | None:
        """Under the step's lease, before a new attempt of a step that succeeded (`--force-run`, outputs
        changed since): copy its outputs' files to `.marin/earlier-{N}/` (N: the attempt that wrote them),
        so the new attempt cannot overwrite them (a train step resumed at its end rewrites
        train_result.json). Returns that directory, or None when there was no file to keep."""
        attempt = current.get("attempt")
        last = attempt if isinstance(attempt, int) else sf.attempts_on_record(self.storage, st.path)
        kept = damaged.keep_outputs(self.storage, st.path, last)
        if kept:
            print(f"marin: step {st.node.name}: runs again after attempt {last} succeeded; that attempt's "
                  f"output files are kept in {kept}", file=sys.stderr, flush=True)
        return kept

    def keep_damaged_step_json(self, st: StepState) -> str | None:
        """Under the step's lease, before this run writes the step's step.json (its first attempt, or
        DEP_FAILED) over one recorded earlier: a step.json that cannot be read is named (stderr, and a
        `DAMAGED_RECORD` event) and moved aside, never silently rewritten. Returns where it went, or None
        when it was readable (or absent)."""
        path = sf.step_json_path(st.path)
        try:
            damaged.read_checked(self.storage, path)
            return None
        except CorruptFileError as e:
            why = str(e)
        aside = damaged.move_aside(self.storage, path)
        message = (f"step.json could not be read; moved to {aside}; this run writes a new one from the "
                   "step's definition")
        print(f"marin: warning: {why}\nmarin: step {st.node.name}: {message}", file=sys.stderr, flush=True)
        self._event(st, sf.DAMAGED_RECORD, st.attempt, message=message, path=path, moved_to=aside, damage=why)
        return aside

    def attempt_started(self, st: StepState) -> bool:
        """True if the worker of `st`'s current attempt wrote RUNNING, i.e. the attempt really started."""
        current = self.current(st) or {}
        return (current.get("status") == sf.RUNNING and current.get("attempt") == st.attempt
                and current.get("run_id") == self.ctx.run_id)

    def failed_elsewhere(self, st: StepState, current: dict[str, Any] | None, statuses: tuple[str, ...],
                         others_only: bool) -> dict[str, Any] | None:
        """The error to report if `current` is a failure (one of `statuses`) written since this run planned
        (not an old one that was already there) - by another executor only, if `others_only` - else None."""
        if not current or current.get("status") not in statuses:
            return None
        if others_only and current.get("executor") == self.ctx.executor_id:
            return None
        if current.get("updated") == (st.entry.previous or {}).get("updated"):
            return None
        err = current.get("error") or {}
        return {"type": err.get("type", current["status"]),
                "message": f"failed in executor {current.get('executor')}: {err.get('message')}",
                "traceback": ""}

    # ----- an attempt -----------------------------------------------------------------------------------
    def resolve_config(self, st: StepState) -> Any:
        return resolve(st.node.step.config, own_path=st.path, prefix=self.ctx.prefix,
                       dep_path=self._step_path)

    def attempt_record(self, key: str, st: StepState, lease_acquired: float | None,
                       first: bool) -> StepRecord:
        """What the worker of `st`'s current attempt writes; step.json too on the run's first attempt."""
        return StepRecord(output_path=st.path, name=st.node.name, hash=key, attempt=st.attempt,
                          run_id=self.ctx.run_id, executor=self.ctx.executor_id,
                          created=(st.previous or {}).get("created"), lease_acquired=lease_acquired,
                          nondeterministic=st.node.step.nondeterministic,
                          patch=self.ctx.patch if first else None,
                          step_json=jsonio.json_text(self._step_info(st, st.config)) if first else None)

    def takeover(self, st: StepState, acquired: Acquired) -> None:
        lost_attempts.record_takeover(self.storage, st.path, attempt=st.attempt + 1, run_id=self.ctx.run_id,
                                      executor=self.ctx.executor_id, previous_owner=acquired.previous_owner,
                                      why=acquired.why)

    def close_lost_attempt(self, st: StepState, current: dict[str, Any] | None, acquired: Acquired) -> bool:
        """The lease just taken over was of an executor that is lost (its process gone, or no heartbeat):
        if its attempt is still in flight in the records, close it as interrupted (`driver_lost`,
        lost_attempts.py): a ledger entry (completed when the next attempt ends), the PREEMPTED status and
        event, and its run closed as DRIVER_LOST in its experiment's manifest. True if there was such an
        attempt."""
        closed = lost_attempts.close_attempt(
            self.storage, st.path, name=st.node.name, hash=st.entry.hash, current=current,
            previous=acquired.previous, lost_owner=str(acquired.previous_owner), why=acquired.why,
            detected_by=self.ctx.executor_id)
        if closed is None:
            return False
        assert current is not None
        self._close_lost_run(st, str(current.get("run_id")), closed[1], closed[0])
        return True

    def _close_lost_run(self, st: StepState, run_id: str, when: float, message: str) -> None:
        """Close the lost attempt's run in its experiment's manifest (the one step.json names, else this
        run's experiment)."""
        info = sf.read_record(self.storage, sf.step_json_path(st.path)) or {}
        experiments = dict.fromkeys(e for e in (info.get("experiment"), self.ctx.experiment_id)
                                    if isinstance(e, str))
        for experiment in experiments:
            if manifest.close_lost_run(self.storage, self.ctx.prefix, experiment, run_id, ended=when,
                                       by=self.ctx.executor_id, message=message):
                return

    def attempt_ended(self, st: StepState, status: str, error: dict[str, Any], **fields: Any) -> None:
        """The attempt's FAILED or PREEMPTED event; `fields`: its cause (and for an interruption, the ledger
        entry's hosts and progress)."""
        self._event(st, status, st.attempt, message=f"{error['type']}: {error['message']}", **fields)

    def interruption(self, st: StepState, cause: str, hosts: tuple[str, ...], message: str) -> dict[str, Any]:
        """An interrupted attempt's ledger entry (status/interruptions.py); returns the fields its PREEMPTED
        event carries."""
        entry = interruptions.record_interruption(
            self.storage, st.path, name=st.node.name, attempt=st.attempt, run_id=self.ctx.run_id, cause=cause,
            hosts=list(hosts), started=st.started, ended=time.time(), message=message)
        return interruptions.event_fields(entry)

    def resumed(self, st: StepState, started: float | None) -> None:
        """The attempt after an interruption ended: complete the ledger's open entry from it."""
        interruptions.record_resume(self.storage, st.path, attempt=st.attempt, started=started)

    def final(self, st: StepState, status: str, error: dict[str, Any]) -> None:
        """The final FAILED or PREEMPTED status of the step in this run."""
        self._status(st, status, st.attempt, started=st.started, ended=st.ended, error=error)

    def interrupted(self, st: StepState, **fields: Any) -> None:
        """The executor was interrupted while `st`'s attempt ran: PREEMPTED, status and event (`fields`: the
        ledger entry's, see `interruption`)."""
        self._status(st, sf.PREEMPTED, st.attempt, started=st.started, ended=time.time(),
                     error={"type": "Interrupted", "message": "the executor was interrupted",
                            "traceback": ""})
        self._event(st, sf.PREEMPTED, st.attempt, message="executor interrupted", **fields)

    def dep_failed(self, st: StepState, attempt: int) -> None:
        """DEP_FAILED, with step.json: it records the identity, which later plans use to explain what
        changed."""
        info = self._step_info(st, self.resolve_config(st))
        if st.entry.previous is not None:  # recorded before: never rewrite a damaged one unseen
            self.keep_damaged_step_json(st)
        jsonio.write_json(self.storage, sf.step_json_path(st.path), info)
        self._status(st, sf.DEP_FAILED, attempt, ended=time.time(), error=st.error)
        self._event(st, sf.DEP_FAILED, attempt, message=st.error["message"] if st.error else "")

    # ----- helpers --------------------------------------------------------------------------------------
    def node_path(self, node: Node) -> str:
        st = self._state_of(node.hash)
        return st.path if st is not None else node.output_path(self.ctx.prefix)

    def _step_path(self, step: Step) -> str:
        return self.node_path(self.graph.node_of(step))

    def _step_info(self, st: StepState, config: Any) -> dict[str, Any]:
        return step_info(st.node, st.path, config, self.node_path, self.ctx)

    def _status(self, st: StepState, status: str, attempt: int, **fields: Any) -> None:
        sf.write_status(self.storage, st.path, name=st.node.name, hash=st.entry.hash, status=status,
                        attempt=attempt, run_id=self.ctx.run_id, executor=self.ctx.executor_id,
                        previous=st.previous, **fields)

    def _event(self, st: StepState, event: str, attempt: int, **fields: Any) -> None:
        sf.append_event(self.storage, st.path, event, attempt=attempt, run_id=self.ctx.run_id,
                        executor=self.ctx.executor_id, **fields)
