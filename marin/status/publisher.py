"""Publishers: the hook through which run status flows out (issue trackers, dashboards, chat...).

The executor calls `publish(view, final=False)` after every state transition and `publish(view, final=True)`
once at the end. Publishers debounce themselves. An exception from a publisher is caught, recorded in the
experiment manifest (`runs[-1].publisher_errors`) and printed in the run summary: a publisher can never fail
a run or a step.

`DEFAULT_PUBLISHER_FACTORIES` lets other packages (e.g. the issue tracker) register a publisher for every
run without touching the executor: each factory gets the run's `RunContext` and returns a publisher or None.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class StepView:
    """One step as publishers see it. `dependencies` holds the dependencies' hashes.

    `status` is WAITING (not started yet, or waiting for another executor), RUNNING, SUCCESS (ran or reused),
    FAILED, DEP_FAILED or PREEMPTED. `log_path` is the current attempt's log (None before the first attempt).
    """

    name: str
    hash: str
    output_path: str
    status: str
    attempt: int
    started: float | None
    ended: float | None
    error_summary: str | None
    log_path: str | None
    dependencies: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RunView:
    """One run of an experiment. `status` is RUNNING, then SUCCESS or FAILED."""

    experiment_id: str
    run_id: str
    script: str
    description: str
    issue: str | None
    prefix: str
    status: str
    started: float
    ended: float | None
    steps: tuple[StepView, ...]


@runtime_checkable
class Publisher(Protocol):
    name: str

    def publish(self, run: RunView, final: bool) -> None: ...


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What a publisher factory knows when a run starts."""

    prefix: str
    issue: str | None
    experiment_id: str
    script: str
    run_id: str = ""
    description: str = ""


DEFAULT_PUBLISHER_FACTORIES: list[Callable[[RunContext], Publisher | None]] = []


class PublisherSet:
    """Calls every publisher; records (never raises) their errors."""

    def __init__(self, publishers: Sequence[Publisher]) -> None:
        self.publishers = list(publishers)
        self.errors: list[dict[str, object]] = []

    def __bool__(self) -> bool:
        return bool(self.publishers)

    def publish(self, view: RunView, final: bool) -> None:
        for p in self.publishers:
            try:
                p.publish(view, final)
            except Exception as e:  # a publisher must not fail the run: record it and go on
                self.errors.append({"publisher": getattr(p, "name", type(p).__name__), "ts": time.time(),
                                    "final": final, "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()})


def publishers_for(ctx: RunContext, explicit: Sequence[Publisher]) -> tuple[list[Publisher], list[dict[str, object]]]:
    """The explicit publishers plus those the registered factories make for this run (errors recorded)."""
    out = list(explicit)
    errors: list[dict[str, object]] = []
    for factory in DEFAULT_PUBLISHER_FACTORIES:
        try:
            p = factory(ctx)
        except Exception as e:
            errors.append({"publisher": getattr(factory, "__qualname__", repr(factory)), "ts": time.time(),
                           "final": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
            continue
        if p is not None:
            out.append(p)
    return out, errors
