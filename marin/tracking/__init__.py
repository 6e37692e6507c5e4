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


def _register_publisher() -> None:
    from marin.status.publisher import DEFAULT_PUBLISHER_FACTORIES

    if issue_publisher_factory not in DEFAULT_PUBLISHER_FACTORIES:
        DEFAULT_PUBLISHER_FACTORIES.append(issue_publisher_factory)
    from marin.tracking.predictions import prediction_publisher_factory

    if prediction_publisher_factory not in DEFAULT_PUBLISHER_FACTORIES:
        DEFAULT_PUBLISHER_FACTORIES.append(prediction_publisher_factory)


_register_publisher()
