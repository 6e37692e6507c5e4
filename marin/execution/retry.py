"""Whether a step whose attempt ended badly gets another attempt in this run.

The executor counts each step's ended attempts by `Outcome` (`StepState.ended_attempts`, counted from when
this executor took the step's lease) and asks `RetryPolicy.retry` after every FAILED or PREEMPTED attempt.
Today one budget covers both: `Step.retries` further attempts after a failed or preempted one (default 0).
The outcomes an attempt can end with are listed in attempt.py; SKIPPED and LEASE_LOST attempts never reach the
policy (the step function did not run for this executor), and a SUCCESS ends the step.

A separate budget per cause (preemptions apart from failures, out-of-memory kills counted as failures)
is a new field here and a new rule in `retry`; the executor does not change.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from marin.definition.step import Step
from marin.execution.attempt import Outcome

BUDGETED = frozenset({Outcome.FAILED, Outcome.PREEMPTED})  # the outcomes that draw on `failures`


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    failures: int  # further attempts allowed after FAILED or PREEMPTED ones, together

    @classmethod
    def for_step(cls, step: Step) -> RetryPolicy:
        return cls(failures=step.retries)

    def retry(self, ended: Counter[Outcome]) -> bool:
        """True if the step gets another attempt, given its ended attempts (the last one included)."""
        return sum(ended[o] for o in BUDGETED) <= self.failures
