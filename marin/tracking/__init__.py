"""Issue trackers (GitHub, local SQLite) and the publisher that keeps an experiment's issue up to date.

``make_tracker`` picks the backend from the environment (see docs/tracking.md); the executor's publisher
registry gets :func:`marin.tracking.factory.issue_publisher_factory` when this package is imported.
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
from marin.tracking.local import DEFAULT_LOCAL_REPO, LocalTracker
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
    "redact",
]
