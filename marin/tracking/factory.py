"""Choosing the tracker backend, and the publisher factories the executor consults for every run.

Backend choice for a repository (``MARIN_TRACKER`` overrides it: ``github``, ``local`` or ``off``):
a repository whose owner is ``local`` always uses the local tracker; otherwise GitHub when ``GITHUB_TOKEN`` is
set, else the local tracker under the prefix. ``GITHUB_API_URL`` points the GitHub backend at GitHub
Enterprise or a test server; ``MARIN_DASHBOARD_URL`` adds dashboard links; ``MARIN_TRACKER_MIN_INTERVAL``
(seconds) sets the publisher's debounce interval (default 10 s for GitHub, 1 s for the local tracker);
``MARIN_TRACKER_MAX_ATTEMPTS`` the attempts per GitHub call (default 5; 1 disables retries).
"""

from __future__ import annotations

import os

from marin.issue_ref import IssueRef
from marin.status.publisher import RunContext
from marin.tracking.base import Tracker, TrackerAuthError
from marin.tracking.local import DEFAULT_LOCAL_REPO, LocalTracker
from marin.tracking.predictions import PredictionPublisher
from marin.tracking.publisher import IssuePublisher
from marin.tracking.retry import BackoffPolicy

BACKENDS = ("github", "local", "off")
DEFAULT_INTERVALS = {"github": 10.0, "local": 1.0}


def choose_backend(repo: str, backend: str | None = None) -> str:
    """``github``, ``local`` or ``off`` for ``repo`` (see the module docstring)."""
    choice = (backend or os.environ.get("MARIN_TRACKER") or "").strip().lower()
    if choice and choice not in BACKENDS:
        raise ValueError(f"MARIN_TRACKER/--backend must be one of {', '.join(BACKENDS)}; got {choice!r}")
    if choice:
        return choice
    if repo.split("/", 1)[0] == "local":
        return "local"
    return "github" if os.environ.get("GITHUB_TOKEN") else "local"


def make_tracker(repo: str | None, prefix: str, backend: str | None = None) -> Tracker:
    """The tracker holding ``repo``'s issues (``prefix`` locates the local tracker)."""
    repo = repo or os.environ.get("MARIN_ISSUE_REPO") or DEFAULT_LOCAL_REPO
    choice = choose_backend(repo, backend)
    if choice == "off":
        raise ValueError("the issue tracker is switched off (MARIN_TRACKER=off)")
    if choice == "local":
        return LocalTracker(prefix, repo)
    from marin.tracking.github import GitHubTracker

    token = os.environ.get("GITHUB_TOKEN", "")
    if not token:
        raise TrackerAuthError(f"the GitHub tracker for {repo} needs GITHUB_TOKEN; unset "
                               "MARIN_TRACKER=github "
                               f"(or pass --backend local) to use the local tracker instead")
    attempts = os.environ.get("MARIN_TRACKER_MAX_ATTEMPTS")
    policy = BackoffPolicy(max_attempts=max(1, int(attempts))) if attempts else BackoffPolicy()
    return GitHubTracker(repo, token, api_url=os.environ.get("GITHUB_API_URL") or None, policy=policy)


def linked_issue(ctx: RunContext) -> IssueRef | None:
    """The run's issue (``ctx.issue``: an IssueRef, its string form or None), or None when the run is unlinked
    or its tracker is switched off."""
    issue = getattr(ctx, "issue", None)
    if issue is None:
        return None
    ref = issue if isinstance(issue, IssueRef) else IssueRef.parse(str(issue))
    return None if choose_backend(ref.repo) == "off" else ref


def issue_publisher_factory(ctx: RunContext) -> IssuePublisher | None:
    """The executor's hook: a publisher for runs linked to an issue, None when unlinked or switched off.

    ``ctx`` is the executor's RunContext (``prefix``, ``issue``: an IssueRef, its string form or None).
    Creating the publisher touches no network; problems surface on its first publish.
    """
    ref = linked_issue(ctx)
    if ref is None:
        return None
    tracker = make_tracker(ref.repo, ctx.prefix)
    interval = os.environ.get("MARIN_TRACKER_MIN_INTERVAL")
    return IssuePublisher(tracker, ref.number, dashboard_url=os.environ.get("MARIN_DASHBOARD_URL") or None,
                          min_interval_s=float(interval) if interval else DEFAULT_INTERVALS[tracker.kind])


def prediction_publisher_factory(ctx: RunContext) -> PredictionPublisher | None:
    """The executor's hook: a publisher of the run's predictions, verdicts and notes to its issue (None when
    the run is unlinked or its tracker switched off)."""
    ref = linked_issue(ctx)
    return None if ref is None else PredictionPublisher(make_tracker(ref.repo, ctx.prefix), ref.number)
