"""Whether a step whose attempt ended badly gets another attempt in this run, and after how long.

The executor counts each step's ended attempts by `Outcome` (`StepState.ended_attempts`, counted from when
this executor took the step's lease) and asks `RetryPolicy.retry` after every FAILED or PREEMPTED attempt.
Two budgets, as Levanter keeps them (10,000 preemptions, 10 failures):

- `Step.retries` (default 0): further attempts after FAILED ones - the function raised, or was killed for
  running out of memory (`oom` is a failure: re-running the same thing on the same hardware rarely helps);
- `Step.max_preemptions` (default 100): further attempts after PREEMPTED ones - the attempt was interrupted
  (its node was preempted or died, its worker was killed by the system; see causes.py).

A preempted attempt is re-submitted after `backoff_s`: 1 s, doubling with each preemption up to 30 s, so a
cluster that is losing nodes is not hammered while it replaces them. Failures are retried at once. SKIPPED
and LEASE_LOST attempts never reach the policy (the step function did not run for this executor), and a
SUCCESS ends the step.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from marin.definition.step import Step
from marin.execution.attempt import Outcome

BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 30.0


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    failures: int  # further attempts allowed after FAILED ones
    preemptions: int  # further attempts allowed after PREEMPTED ones

    @classmethod
    def for_step(cls, step: Step) -> RetryPolicy:
        return cls(failures=step.retries, preemptions=step.max_preemptions)

    def retry(self, ended: Counter[Outcome]) -> bool:
        """True if the step gets another attempt, given its ended attempts (the last one included)."""
        return ended[Outcome.FAILED] <= self.failures and ended[Outcome.PREEMPTED] <= self.preemptions

    def exhausted(self, ended: Counter[Outcome]) -> str:
        """What the step's final error adds once `retry` said no: the preemption budget, when that is the one
        that ran out ("" for failures: the step's own error says it all)."""
        if ended[Outcome.PREEMPTED] > self.preemptions:
            return (f"preemption budget exhausted (max_preemptions={self.preemptions}): interrupted "
                    f"{ended[Outcome.PREEMPTED]} times; raise Step(max_preemptions=...) or fix the cluster")
        return ""

    @staticmethod
    def backoff_s(ended: Counter[Outcome], outcome: Outcome) -> float:
        """How long to wait before the next attempt: 0 after a failure, growing with the preemptions."""
        if outcome is not Outcome.PREEMPTED:
            return 0.0
        return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** max(0, ended[Outcome.PREEMPTED] - 1)))
