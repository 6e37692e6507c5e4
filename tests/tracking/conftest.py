"""Fixtures for the tracker tests: a fake GitHub API server on loopback and trackers bound to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marin.tracking.github import GitHubTracker
from marin.tracking.retry import BackoffPolicy
from tests.fakes.github_api import FakeGitHub

TOKEN = "ghp_SeCrEt0123456789abcdefTOKEN"
REPO = "lab/experiments"


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        server.add_issue(REPO, "Wider router", "Hypothesis: a wider router balances load.")
        yield server


class SleepRecorder:
    """Stands in for the retry wait: records the requested seconds instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def gh_tracker(fake_github: FakeGitHub, sleeps: SleepRecorder) -> GitHubTracker:
    policy = BackoffPolicy(max_attempts=4, base_delay_s=0.5, max_rate_limit_wait_s=120, sleep=sleeps)
    return GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, policy=policy, throttle=False,
                         timeout_s=5)
