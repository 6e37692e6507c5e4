"""Publishers: the hook through which run status flows out (issue trackers, dashboards, chat...).

The executor calls `publish(view, final=False)` after every state transition and `publish(view, final=True)`
once at the end. Publishers debounce themselves. An exception from a publisher is caught, recorded in the
experiment manifest (`runs[-1].publisher_errors`) and printed in the run summary: a publisher can never fail
a run or a step.

Publisher factories make a publisher for every run without touching the executor: each gets the run's
`RunContext` and returns a publisher or None. They come from two places, both explicit:
- installed packages declare them under the `marin.publishers` entry point group (marin's own issue
  publisher does, in pyproject.toml: `issue = "marin.tracking.factory:issue_publisher_factory"`); they are
  loaded when the first run starts, so `import marin` imports no tracker;
- code registers one with `register_publisher_factory(f)` (kept in `DEFAULT_PUBLISHER_FACTORIES`).
A factory that cannot be loaded or that raises is recorded like a failing publisher.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
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
    waiting: str | None = None  # a gang attempt waiting for hosts: what for (execution/gang_wait.py)


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


PublisherFactory = Callable[[RunContext], "Publisher | None"]
ENTRY_POINT_GROUP = "marin.publishers"
DEFAULT_PUBLISHER_FACTORIES: list[PublisherFactory] = []


def register_publisher_factory(factory: PublisherFactory) -> None:
    """Make `factory` consulted for every run started in this process from now on (once, however often)."""
    if factory not in DEFAULT_PUBLISHER_FACTORIES:
        DEFAULT_PUBLISHER_FACTORIES.append(factory)


def _error(who: str, e: BaseException) -> dict[str, object]:
    return {"publisher": who, "ts": time.time(), "final": False, "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()}


@functools.cache  # the installed distributions do not change while a process runs
def entry_point_factories() -> tuple[tuple[PublisherFactory, ...], tuple[dict[str, object], ...]]:
    """(the factories declared under the `marin.publishers` entry point group, the errors loading them)."""
    factories: list[PublisherFactory] = []
    errors: list[dict[str, object]] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            factories.append(ep.load())
        except Exception as e:  # a broken plugin must not fail the run: record it
            errors.append(_error(f"entry point {ep.name} = {ep.value}", e))
    return tuple(factories), tuple(errors)


def registered_publisher_factories() -> tuple[list[PublisherFactory], list[dict[str, object]]]:
    """Every factory a run consults (registered ones first, then entry points), and the loading errors."""
    declared, errors = entry_point_factories()
    out = list(DEFAULT_PUBLISHER_FACTORIES)
    out.extend(f for f in declared if f not in out)
    return out, list(errors)


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


def publishers_for(
    ctx: RunContext, explicit: Sequence[Publisher]
) -> tuple[list[Publisher], list[dict[str, object]]]:
    """The explicit publishers plus those the registered factories make for this run (errors recorded)."""
    out = list(explicit)
    factories, errors = registered_publisher_factories()
    for factory in factories:
        try:
            p = factory(ctx)
        except Exception as e:
            errors.append(_error(getattr(factory, "__qualname__", repr(factory)), e))
            continue
        if p is not None:
            out.append(p)
    return out, errors
