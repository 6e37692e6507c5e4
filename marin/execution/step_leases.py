"""The executor's leases, by step: acquire before an attempt, release after the step's final status.

A thin layer over `LeaseManager` (storage/lease.py has the protocol) that speaks in `StepState`s: it maps a
lease file back to its step (the heartbeat reports a lost lease by path, as a `LeaseLost` message on the
executor's queue) and tells a lease lost to another executor from one the worker released after writing
SUCCESS (worker.py), which is no loss: the attempt's result is on its way.
"""

from __future__ import annotations

from marin.execution.backend import Completions, LeaseLost
from marin.execution.records import RunContextInfo
from marin.execution.state import StepState
from marin.status import files as sf
from marin.storage.fs import Storage
from marin.storage.lease import Acquired, LeaseManager


class StepLeases:
    def __init__(self, storage: Storage, ctx: RunContextInfo, timeout_s: float,
                 completions: Completions, outlive_s: float = 0.0) -> None:
        self.storage = storage
        self.ctx = ctx
        self.manager = LeaseManager(storage, ctx.executor_id, timeout_s,
                                    on_lost=lambda path: completions.put(LeaseLost(path)),
                                    outlive_s=outlive_s)
        # lease path -> step key, of every lease this executor tried to take: the heartbeat can only report
        # the loss of one of those (a re-run of a settled plan takes none and maps none)
        self._step_of: dict[str, str] = {}

    def step_of(self, lease_path: str) -> str | None:
        return self._step_of.get(lease_path)

    def acquire(self, st: StepState, attempt: int) -> Acquired:
        """Try to take the step's lease for `attempt` (taking over a stale one)."""
        self._step_of[st.lease] = st.entry.hash
        return self.manager.try_acquire(st.lease, attempt=attempt)

    def holds(self, st: StepState) -> bool:
        return self.manager.holds(st.lease)

    def acquired_at(self, st: StepState) -> float | None:
        return self.manager.acquired_at(st.lease)

    def release(self, st: StepState) -> None:
        self.manager.release(st.lease)

    def released_by_worker(self, st: StepState) -> None:
        """The worker deleted the lease after writing SUCCESS: stop renewing it, delete nothing."""
        self.manager.forget(st.lease)

    def gone_after_success(self, st: StepState) -> bool:
        """True if the lease the heartbeat found gone was released by the worker of `st`'s current attempt
        after it wrote SUCCESS: not a lost lease."""
        current = sf.read_status(self.storage, st.path) or {}
        return (current.get("status") == sf.SUCCESS and current.get("attempt") == st.attempt
                and current.get("run_id") == self.ctx.run_id
                and current.get("executor") == self.ctx.executor_id)

    def stop(self) -> None:
        self.manager.stop()
