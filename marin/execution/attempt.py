"""What travels between the executor, a backend and a worker for one attempt of one step.

- `Task`: one attempt as the executor hands it to a backend (the function, its resolved config, the log file,
  the step's env and resources, and the `StepRecord` the worker writes under the executor's lease).
- `AttemptResult`: how an attempt ended, made by the worker (`execute_step`) or, when the worker could not
  report (its process died, Ray lost the task, the attempt could not be shipped), by the backend. It is
  frozen and picklable: Ray passes the results of the attempts a queued attempt waits for as its arguments.

`Outcome` names every way an attempt can end; the executor branches on it and nothing else. Outcomes that
count against a step's budgets are `FAILED` and `PREEMPTED` (see retry.py); `SKIPPED` and `LEASE_LOST` are
attempts that never called the step function on this executor's behalf. New causes (out-of-memory kills, a
dead node of a gang) are added here as members, and retry.py decides which budget each one draws on.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any

from marin.definition.step import Resources
from marin.execution import causes

Wire = tuple[Any, ...]  # an AttemptResult as plain values (`AttemptResult.to_wire`)
HOST = socket.gethostname()  # the machine an attempt ran on (a forked worker shares its executor's)


class Outcome(enum.Enum):
    """How an attempt ended."""

    SUCCESS = "success"  # fn returned and SUCCESS is recorded (or was: a re-run of a finished attempt)
    FAILED = "failed"  # fn raised, or the attempt failed around it (records, pickling, imports)
    PREEMPTED = "preempted"  # the worker or its node went away under it (signal, Ray-level failure)
    SKIPPED = "skipped"  # queued behind an attempt that did not succeed: fn was not called
    LEASE_LOST = "lease_lost"  # the executor's lease was gone before it started or when it finished


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """The outcome of one attempt, with what the executor records about it."""

    outcome: Outcome
    started: float | None = None  # when fn was about to be called; None: not known to have started
    ended: float | None = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    exception: bytes | None = None  # the pickled exception, when it pickles (the executor chains to it)
    log_path: str | None = None
    host: str | None = None  # None when the backend reports for a worker it lost
    lease_released: bool = False  # SUCCESS only: the worker released the lease after writing SUCCESS
    cause: str = ""  # FAILED or PREEMPTED: why, one of marin.execution.causes.CAUSES ("" for the others)
    hosts: tuple[str, ...] = ()  # the hosts the cause concerns (a gang's dead nodes, its failing member)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.SUCCESS

    @property
    def error(self) -> dict[str, str]:
        """The `error` object of status.json (formats.md)."""
        return {"type": self.error_type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_exception(cls, exc: BaseException, *, outcome: Outcome = Outcome.FAILED, context: str = "",
                       **fields: Any) -> AttemptResult:
        """A failed attempt described by `exc` (type, message, traceback, and the exception pickled when it
        can be); `context` is put before the message ("cannot ...: <message>")."""
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:  # unpicklable exception types still report type, message and traceback
            pickled = None
        message = f"{context}: {exc}" if context else str(exc)
        if "cause" not in fields and outcome is Outcome.FAILED:
            fields["cause"] = causes.OOM if isinstance(exc, MemoryError) else causes.FAILED
        return cls(outcome, error_type=type(exc).__name__, message=message,
                   traceback="".join(traceback.format_exception(exc)), exception=pickled, **fields)

    def to_wire(self) -> Wire:
        """The fields as a tuple of plain values (the outcome by its value), for a pipe to another process
        or a Ray task's result.
        Pickling the dataclass itself looks up its class and the enum's by import on every `dumps` and calls
        the enum on every `loads` (~15 us a result, on every step of the local backend); this tuple pickles
        in ~1 us. `from_wire` makes the equal result back."""
        return self.outcome.value, *_OTHER_FIELDS(self)

    @classmethod
    def from_wire(cls, wire: Wire) -> AttemptResult:
        """The result `to_wire` described. Filled in the way unpickling fills a dataclass (its fields set on
        a new instance, no `__init__`: a frozen one's sets each field through `object.__setattr__`)."""
        result = cls.__new__(cls)
        result.__dict__.update(zip(_FIELD_NAMES, (_OUTCOME_OF_VALUE[wire[0]], *wire[1:]), strict=True))
        return result


def results_from_wire(wires: tuple[Wire | None, ...]) -> tuple[AttemptResult | None, ...]:
    """The results of the attempts a Ray task was queued behind, passed to it as wire tuples."""
    return tuple(None if w is None else AttemptResult.from_wire(w) for w in wires)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(AttemptResult))
_OTHER_FIELDS = operator.attrgetter(*_FIELD_NAMES[1:])
_OUTCOME_OF_VALUE = {o.value: o for o in Outcome}


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What a worker needs to write one attempt's status files on behalf of the executor holding the lease."""

    output_path: str
    name: str
    hash: str
    attempt: int
    run_id: str
    executor: str
    created: float | None  # `created` of the status this attempt replaces (it carries over)
    step_json: str | None = None  # step.json's text, written when the attempt starts (a run's first attempt)
    lease_acquired: float | None = None  # `acquired` of the executor's lease: the holding this attempt is for
    nondeterministic: tuple[str, ...] = ()  # the step's output globs left out of reproduction comparisons
    patch: str | None = None  # the dirty checkout's diff, written as .marin/source.patch with step.json


@dataclasses.dataclass(frozen=True)
class Task:
    """One attempt of one step, as the executor hands it to a backend."""

    key: str  # the step's hash
    name: str
    fn: Callable[[Any], Any]
    config: Any  # the step's config with every placeholder resolved
    log_path: str
    env: dict[str, str]
    resources: Resources
    attempt: int
    record: StepRecord | None = None  # the status files the worker writes for the executor (None: none)
    after: tuple[str, ...] = ()  # keys of in-flight attempts to queue behind (backends that queue)

    def payload(self) -> tuple[Callable[[Any], Any], Any, str, dict[str, str], StepRecord | None]:
        """What a worker process needs to run the attempt: `execute_step`'s first five arguments."""
        return self.fn, self.config, self.log_path, self.env, self.record
