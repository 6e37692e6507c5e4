"""The contract between the executor and a backend: the `Backend` protocol and the messages on the queue.

A backend runs `Task`s somewhere (forked local workers, Ray tasks) and never touches the executor's state:
everything it has to say goes into the executor's `Completions` queue as one of three messages, which the
scheduling loop handles on its own thread, one at a time:

- `AttemptDone`: an attempt ended (its `AttemptResult`); a late result of a cancelled attempt is ignored.
- `RunOnLoop`: work that must run on the executor's thread (the local backend forks workers only there).
- `LeaseLost`: the lease heartbeat found a step's lease taken over (sent by the lease manager).

(`Waiting`, `Interrupted` and `LeaseTaken` are posted by the gang waiter, the driver's signal handler and the
executor's own lease-taking threads.)

A backend that `queues_behind_dependencies` accepts a task whose `after` names attempts still in flight and
starts it once they returned, handing it their results (Ray passes result references as task arguments); the
executor keeps `after` empty for the others.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

from marin.definition.step import Resources
from marin.execution.attempt import AttemptResult, Task


@dataclasses.dataclass(frozen=True)
class AttemptDone:
    key: str
    attempt: int
    result: AttemptResult


@dataclasses.dataclass(frozen=True)
class RunOnLoop:
    call: Callable[[], None]


@dataclasses.dataclass(frozen=True)
class LeaseLost:
    lease_path: str


@dataclasses.dataclass(frozen=True)
class LeaseTaken:
    """The executor's own: a ready step's lease, taken (or not) off its thread (executor.py `_start_ready`);
    `taken` is what `Executor._lease_io` returned, or what it raised."""

    key: str
    taken: object


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A gang attempt started waiting for hosts (`text` says for what), or stopped waiting (None)."""

    key: str
    attempt: int
    text: str | None


@dataclasses.dataclass(frozen=True)
class Interrupted:
    """Ctrl-C, posted by the driver's SIGINT handler (main.py) so that the executor raises KeyboardInterrupt
    at a known point of its loop, never inside a publisher or a storage call holding a lock that the
    interrupt's own clean-up (PREEMPTED records, the final status) takes again."""


Message: TypeAlias = AttemptDone | RunOnLoop | LeaseLost | Waiting | Interrupted | LeaseTaken
Completions: TypeAlias = queue.SimpleQueue[Message]


class Backend(Protocol):
    """Where attempts run. `submit` returns at once; the outcome arrives later as an `AttemptDone`."""

    name: str
    queues_behind_dependencies: bool

    def check_resources(self, tasks: Sequence[tuple[str, Resources]]) -> None:
        """Raise InfeasibleResourcesError naming every (step name, resources) request no node can satisfy."""

    def submit(self, task: Task) -> None:
        """Start `task` (or queue it until its resources, and the attempts it is queued behind, are there)."""

    def cancel(self, key: str) -> None:
        """Stop the attempt of step `key` if it is pending or running; a result it still sends is ignored."""

    def forget(self, key: str) -> None:
        """The executor handled `key`'s result: nothing will be queued behind that attempt any more."""

    def shutdown(self) -> None:
        """Stop every attempt and release what the backend holds (processes, threads, an embedded Ray)."""
