"""Issue trackers (GitHub, local SQLite) and the publisher that keeps an experiment's issue up to date.

``make_tracker`` picks the backend from the environment (see docs/tracking.md). The executor finds
:func:`marin.tracking.factory.issue_publisher_factory` through the ``marin.publishers`` entry point declared
in pyproject.toml (see marin/status/publisher.py); importing this package registers nothing.
"""

from marin.tracking.base import (
    Comment,
    Issue,
    Tracker,
    TrackerAuthError,
    TrackerError,
    TrackerNotFound,
    TrackerUnavailable,
)
from marin.tracking.factory import issue_publisher_factory, make_tracker
from marin.tracking.local import DEFAULT_LOCAL_REPO, LocalTracker
from marin.tracking.publisher import IssuePublisher, PublishError
from marin.tracking.redact import redact

__all__ = [
    "DEFAULT_LOCAL_REPO",
    "Comment",
    "Issue",
    "LocalTracker",
    "Tracker",
    "TrackerAuthError",
    "TrackerError",
    "TrackerNotFound",
    "TrackerUnavailable",
    "IssuePublisher",
    "PublishError",
    "issue_publisher_factory",
    "make_tracker",
    "redact",
]

