"""GitHubTracker through PyGithub against the fake GitHub API: CRUD, labels, retries, rate limits, errors."""

from __future__ import annotations

import time

import pytest

from marin.tracking.base import TrackerAuthError, TrackerError, TrackerNotFound, TrackerUnavailable
from marin.tracking.github import GitHubTracker
from tests.fakes.github_api import FakeGitHub, Fault
from tests.tracking.conftest import REPO, TOKEN, SleepRecorder


def test_issue_comment_and_label_round_trip(gh_tracker: GitHubTracker, fake_github: FakeGitHub) -> None:
    issue = gh_tracker.get_issue(1)
    assert (issue.title, issue.state, issue.ref) == ("Wider router", "open", f"{REPO}#1")
    assert issue.url == f"{fake_github.base_url}/{REPO}/issues/1"
    comment = gh_tracker.create_comment(1, "first")
    edited = gh_tracker.edit_comment(1, comment.id, "second")
    assert edited.id == comment.id
    assert [c.body for c in gh_tracker.list_comments(1)] == ["second"]
    doomed = gh_tracker.create_comment(1, "doomed")
    gh_tracker.delete_comment(1, doomed.id)
    assert [c.body for c in gh_tracker.list_comments(1)] == ["second"]
    assert gh_tracker.add_labels(1, ["marin:running", "experiment"]) == ("experiment", "marin:running")
    assert gh_tracker.remove_label(1, "marin:running") == ("experiment",)
    assert gh_tracker.remove_label(1, "never-added") == ("experiment",)  # GitHub's 404 means "already absent"
    assert fake_github.labels(REPO, 1) == ["experiment"]
    label_posts = [r for r in fake_github.requests if r.method == "POST" and r.path.endswith("/labels")]
    assert label_posts[0].body == ["marin:running", "experiment"]  # PyGithub posts a bare JSON list
    assert all(r.authorization == f"token {TOKEN}" for r in fake_github.requests)


def test_create_and_list_issues_and_paginated_comments(gh_tracker: GitHubTracker) -> None:
    created = gh_tracker.create_issue("Second idea", "why", labels=["experiment"])
    assert (created.number, created.labels) == (2, ("experiment",))
    assert [i.number for i in gh_tracker.list_issues()] == [2, 1]
    for i in range(35):  # more than one page of 30
        gh_tracker.create_comment(2, f"c{i}")
    assert [c.body for c in gh_tracker.list_comments(2)] == [f"c{i}" for i in range(35)]


def test_edit_of_a_comment_not_seen_before_fetches_it(gh_tracker: GitHubTracker,
                                                      fake_github: FakeGitHub) -> None:
    comment_id = GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, throttle=False).create_comment(1,
                                                                                                         "a").id
    assert gh_tracker.edit_comment(1, comment_id, "b").body == "b"
    assert fake_github.issue_comments(REPO, 1)[0]["body"] == "b"


@pytest.mark.parametrize("fault", [Fault("status", 502), Fault("status", 503), Fault("drop")],
                         ids=["502", "503", "drop"])
def test_transient_failures_are_retried_with_backoff(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                     sleeps: SleepRecorder, fault: Fault) -> None:
    comment = gh_tracker.create_comment(1, "x")
    fake_github.inject(fault, times=2)
    gh_tracker.edit_comment(1, comment.id, "y")
    assert fake_github.issue_comments(REPO, 1)[0]["body"] == "y"
    assert len(sleeps.waits) == 2 and 0.5 <= sleeps.waits[0] <= 0.625 and 1.0 <= sleeps.waits[1] <= 1.25


def test_rate_limit_waits_for_the_reset_header(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                               sleeps: SleepRecorder) -> None:
    gh_tracker.get_issue(1)
    reset = int(time.time()) + 7
    fake_github.inject(Fault("status", 403,
                             headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)},
                             message="API rate limit exceeded for user ID 1."))
    fake_github.inject(Fault("status", 429, headers={"Retry-After": "3"}, message="Too Many Requests"))
    fake_github.inject(Fault("status", 403, message="You have exceeded a secondary rate limit."))
    gh_tracker.create_comment(1, "after the limit")
    assert len(sleeps.waits) == 3
    assert 6.0 <= sleeps.waits[0] <= 9.0  # until X-RateLimit-Reset (+1 s margin)
    assert sleeps.waits[1] == 3.0  # Retry-After
    assert sleeps.waits[2] == 60.0  # a secondary limit without headers: GitHub asks for at least a minute
    assert [c["body"] for c in fake_github.issue_comments(REPO, 1)] == ["after the limit"]


def test_rate_limit_longer_than_the_cap_fails_at_once(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                      sleeps: SleepRecorder) -> None:
    gh_tracker.get_issue(1)
    fake_github.inject(Fault("status", 403, headers={"Retry-After": "3600"}, message="secondary rate limit"))
    with pytest.raises(TrackerUnavailable, match="wait 3600s"):
        gh_tracker.create_comment(1, "x")
    assert sleeps.waits == []


def test_persistent_5xx_gives_up_with_a_clear_error(gh_tracker: GitHubTracker,
                                                    fake_github: FakeGitHub) -> None:
    gh_tracker.get_issue(1)
    fake_github.inject(Fault("status", 500, message="boom"), times=10)
    with pytest.raises(TrackerUnavailable, match=r"list comments of #1 .*HTTP 500.*gave up after 4 attempts"):
        gh_tracker.list_comments(1)


def test_non_retryable_errors(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                              sleeps: SleepRecorder) -> None:
    with pytest.raises(TrackerNotFound, match="#99"):
        gh_tracker.get_issue(99)
    bad = GitHubTracker(REPO, "ghp_wrongwrongwrong0123456789", api_url=fake_github.base_url, throttle=False)
    with pytest.raises(TrackerAuthError, match="Bad credentials.*GITHUB_TOKEN") as info:
        bad.get_issue(1)
    assert "ghp_wrongwrongwrong0123456789" not in str(info.value)
    fake_github.inject(Fault("status", 403, message="Resource not accessible by integration"))
    with pytest.raises(TrackerAuthError):
        gh_tracker.create_comment(1, "x")
    assert sleeps.waits == []


def test_create_is_not_blindly_retried_after_a_dropped_answer(gh_tracker: GitHubTracker,
                                                              fake_github: FakeGitHub) -> None:
    gh_tracker.get_issue(1)
    fake_github.inject(Fault("drop_after", method="POST"))
    with pytest.raises(TrackerUnavailable, match="may have been applied"):
        gh_tracker.create_comment(1, "once")
    assert len(fake_github.issue_comments(REPO, 1)) == 1  # applied once, never duplicated by a retry


def test_missing_token_is_refused() -> None:
    with pytest.raises(TrackerError, match="GITHUB_TOKEN"):
        GitHubTracker(REPO, "")
