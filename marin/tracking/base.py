"""The issue-tracker interface every backend implements, and the values it returns.

A tracker is one repository of issues (``owner/repo`` on GitHub, ``local/experiments`` in the local tracker).
The executor's status publisher needs only a handful of operations (read an issue, find/create/edit one
comment, add/remove labels), so the interface is exactly that plus issue creation and listing for
``marin issue``. Backends raise the :class:`TrackerError` family, with messages that never contain the token
(see :mod:`marin.tracking.redact`).
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Issue:
    """One issue as the tracker holds it (labels sorted, timestamps in Unix seconds)."""

    repo: str
    number: int
    title: str
    body: str
    state: str
    labels: tuple[str, ...]
    url: str
    author: str
    created: float
    updated: float

    @property
    def ref(self) -> str:
        """The ``owner/repo#N`` reference experiments use to name this issue."""
        return f"{self.repo}#{self.number}"


@dataclass(frozen=True)
class Comment:
    """One comment on an issue."""

    id: int
    issue_number: int
    body: str
    author: str
    created: float
    updated: float
    url: str = field(default="")


class TrackerError(RuntimeError):
    """A tracker operation failed; the message names the repository/issue and never contains the token."""


class TrackerNotFound(TrackerError):
    """The repository, issue or comment does not exist (or the token may not see it)."""


class TrackerAuthError(TrackerError):
    """The tracker refused the credentials (401/403 that is not a rate limit)."""


class TrackerUnavailable(TrackerError):
    """A transient failure (network error, 5xx, rate limit) that outlived the retry policy."""


class Tracker(abc.ABC):
    """One repository of issues. Implementations: GitHubTracker, LocalTracker."""

    kind: str
    repo: str
    _abort_local = threading.local()

    @contextlib.contextmanager
    def abort_on(self, event: threading.Event) -> Iterator[None]:
        """Within this block, in this thread, retry waits end early (RetryAborted) once ``event`` is set."""
        previous = getattr(self._abort_local, "event", None)
        self._abort_local.event = event
        try:
            yield
        finally:
            self._abort_local.event = previous

    @property
    def abort_event(self) -> threading.Event | None:
        """The abort event installed by :meth:`abort_on` for the calling thread, if any."""
        return getattr(self._abort_local, "event", None)

    @abc.abstractmethod
    def get_issue(self, number: int) -> Issue:
        """Return issue ``number``; raise TrackerNotFound when it does not exist."""

    @abc.abstractmethod
    def create_issue(self, title: str, body: str, labels: Sequence[str] = ()) -> Issue:
        """Open a new issue and return it (its number is chosen by the tracker)."""

    @abc.abstractmethod
    def list_issues(self, state: str = "open") -> list[Issue]:
        """Issues in ``state`` (``open``, ``closed`` or ``all``), newest first."""

    @abc.abstractmethod
    def list_comments(self, number: int) -> list[Comment]:
        """Every comment on issue ``number``, oldest first."""

    @abc.abstractmethod
    def create_comment(self, number: int, body: str) -> Comment:
        """Add a comment to issue ``number``."""

    @abc.abstractmethod
    def edit_comment(self, number: int, comment_id: int, body: str) -> Comment:
        """Replace the body of comment ``comment_id`` on issue ``number``."""

    @abc.abstractmethod
    def delete_comment(self, number: int, comment_id: int) -> None:
        """Delete comment ``comment_id`` of issue ``number`` (an already deleted one is fine)."""

    @abc.abstractmethod
    def add_labels(self, number: int, labels: Sequence[str]) -> tuple[str, ...]:
        """Add labels to issue ``number``; return its labels afterwards."""

    @abc.abstractmethod
    def remove_label(self, number: int, label: str) -> tuple[str, ...]:
        """Remove one label (absent labels are fine); return the labels afterwards."""

    @abc.abstractmethod
    def issue_url(self, number: int) -> str:
        """Where a person can read issue ``number``."""
