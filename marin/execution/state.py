"""A step's state in one run, and the one place it changes.

Each step is in one `Phase`. The phases a step may move to from each phase are written down once, in
`TRANSITIONS`; `Board.move` is the only way a phase changes, and it refuses any other move with an
`InternalError` (a bug in the executor, never a user error). The board also keeps the two sets the
scheduling loop reads, `running` (attempts in flight, QUEUED or RUNNING) and `waiting` (steps held by another
executor's lease), in step with the phases, so "what is running" cannot disagree with the states.

    PENDING   not started by this run (its dependencies may be unfinished)
    QUEUED    an attempt is submitted behind dependencies still running (shown as WAITING)
    RUNNING   an attempt is submitted and its dependencies succeeded
    WAITING   another executor holds the step's lease; polled until it finishes or its lease goes stale
    SUCCESS, FAILED, PREEMPTED, DEP_FAILED   final for this run (also what the plan says of settled steps)

`StepState.status` is the status name the publishers, the summary and the status files use (formats.md):
None for PENDING, RUNNING for QUEUED and RUNNING, otherwise the phase's own name.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections import Counter
from typing import Any

from marin.errors import InternalError, StepFailedError
from marin.execution.attempt import AttemptResult, Outcome
from marin.graph.dag import Node
from marin.graph.plan import PlanEntry
from marin.status import files as sf

POLL_MIN_S, POLL_MAX_S = 0.05, 2.0


class Phase(enum.Enum):
    # Members are singletons compared by identity, so they hash by identity too (in C): Enum's own __hash__
    # hashes the name in Python, a dozen calls a step in the scheduling loop's set and table lookups.
    __hash__ = object.__hash__

    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    DEP_FAILED = "DEP_FAILED"


P = Phase
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # started (queued or not), found held by another executor, found finished or failed by another one since
    # the plan, or a dependency failed
    P.PENDING: frozenset({P.QUEUED, P.RUNNING, P.WAITING, P.SUCCESS, P.FAILED, P.DEP_FAILED}),
    # its dependencies succeeded, its lease was lost, a dependency failed, or the run was interrupted
    # (PENDING: it never started; PREEMPTED: its lease was already gone)
    P.QUEUED: frozenset({P.RUNNING, P.WAITING, P.DEP_FAILED, P.PENDING, P.PREEMPTED}),
    # finished, retried or re-submitted (RUNNING, or QUEUED behind a dependency's retry), lease lost,
    # interrupted
    P.RUNNING: frozenset({P.RUNNING, P.QUEUED, P.WAITING, P.SUCCESS, P.FAILED, P.PREEMPTED}),
    # polled again, the holder finished or failed, or the lease came free and this executor started it
    P.WAITING: frozenset({P.WAITING, P.QUEUED, P.RUNNING, P.SUCCESS, P.FAILED}),
    P.SUCCESS: frozenset(),
    P.FAILED: frozenset(),
    P.PREEMPTED: frozenset(),
    P.DEP_FAILED: frozenset(),
}
IN_FLIGHT = frozenset({P.QUEUED, P.RUNNING})
_STATUS = {P.PENDING: None, P.QUEUED: sf.RUNNING, P.RUNNING: sf.RUNNING, P.WAITING: sf.WAITING,
           P.SUCCESS: sf.SUCCESS, P.FAILED: sf.FAILED, P.PREEMPTED: sf.PREEMPTED, P.DEP_FAILED: sf.DEP_FAILED}
PHASE_OF_STATUS = {sf.SUCCESS: P.SUCCESS, sf.FAILED: P.FAILED, sf.PREEMPTED: P.PREEMPTED,
                   sf.DEP_FAILED: P.DEP_FAILED}


@dataclasses.dataclass
class StepState:
    """What this run knows about one step; the source of the publishers' StepView. Change `phase` only
    through `Board.move`."""

    entry: PlanEntry
    node: Node
    phase: Phase = Phase.PENDING
    attempt: int = 0
    started: float | None = None
    ended: float | None = None
    error: dict[str, Any] | None = None
    note: str = ""
    unmet: int = 0  # dependencies not yet succeeded
    poll_s: float = POLL_MIN_S  # WAITING: the current polling interval, backing off
    next_poll: float = 0.0
    previous: dict[str, Any] | None = None  # the status this run's attempts replace
    failure: StepFailedError | None = None
    config: Any = None  # the resolved config of the current attempt
    # QUEUED: its result, held until its dependencies are handled
    deferred: tuple[int, AttemptResult] | None = None
    # since the lease was taken; None until an attempt ends badly (most steps never need one)
    ended_attempts: Counter[Outcome] | None = None
    waiting: str | None = None  # a gang attempt waiting for hosts: what for (gang_wait.py)
    waiting_since: float | None = None

    @property
    def path(self) -> str:
        return self.entry.output_path

    @functools.cached_property
    def lease(self) -> str:  # read four times a step: made once
        return sf.lease_path(self.entry.output_path)

    @property
    def status(self) -> str | None:
        return _STATUS[self.phase]

    @property
    def queued(self) -> bool:
        return self.phase is Phase.QUEUED

    def back_off(self) -> None:
        """WAITING: poll the holder's status less often (up to every POLL_MAX_S)."""
        self.poll_s = min(self.poll_s * 1.5, POLL_MAX_S)

    @property
    def base_attempt(self) -> int:
        """The attempt number recorded before this run's attempts (0 for a step never run)."""
        return recorded_attempt(self.previous)


def recorded_attempt(status: dict[str, Any] | None) -> int:
    """The attempt number in a status.json record (0 if there is none)."""
    return int((status or {}).get("attempt") or 0)


class Board(dict[str, StepState]):
    """Every step's state in this run by key, with the `running` and `waiting` sets kept in step with the
    phases. A dict itself, so the loop's many lookups (`board[key]`, `board.get`) cost no Python call."""

    def __init__(self) -> None:
        super().__init__()
        self.running: set[str] = set()  # QUEUED or RUNNING
        self.waiting: set[str] = set()  # WAITING

    @property
    def states(self) -> dict[str, StepState]:
        return self

    def add(self, key: str, st: StepState) -> None:
        self[key] = st

    def move(self, key: str, to: Phase) -> StepState:
        """Move step `key` to phase `to`; an illegal move (see TRANSITIONS) is an InternalError."""
        st = self[key]
        if to not in TRANSITIONS[st.phase]:
            raise InternalError(f"step {st.node.name} ({key[:8]}): illegal state change {st.phase.name} -> "
                                f"{to.name}; allowed from {st.phase.name}: "
                                f"{sorted(p.name for p in TRANSITIONS[st.phase]) or 'none (final)'}")
        st.phase = to
        if to in IN_FLIGHT:
            self.running.add(key)
        else:
            self.running.discard(key)
        if to is Phase.WAITING:
            self.waiting.add(key)
        else:
            self.waiting.discard(key)
        return st
