"""The issue publisher against the fake GitHub API and the local tracker: one managed comment created then
edited, labels, debouncing, restart idempotency, retries, failures reported without touching the run, and
what the comment shows."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from marin.tracking.base import Comment
from marin.tracking.comment import MAX_BODY_CHARS, marker
from marin.tracking.github import GitHubTracker
from marin.tracking.local import LocalTracker
from marin.tracking.publisher import IssuePublisher, PublishError
from marin.tracking.retry import BackoffPolicy
from tests.fakes.github_api import FakeGitHub, Fault
from tests.tracking.conftest import REPO, TOKEN, SleepRecorder
from tests.tracking.views import run, step, with_status

EXP = "exp1_wider_router-5e6f7a8b"


def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached in time"
        time.sleep(0.01)


def publisher(tracker: GitHubTracker | LocalTracker, interval: float = 0.0, **kw: object) -> IssuePublisher:
    return IssuePublisher(tracker, 1, min_interval_s=interval,
                          find_policy=BackoffPolicy(max_attempts=3, sleep=lambda s: None), **kw)  # type: ignore[arg-type]


def test_one_comment_created_then_edited_with_labels(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                     tmp_path: Path) -> None:
    prefix = str(tmp_path)
    pub = publisher(gh_tracker, dashboard_url="http://dash.local:8000")
    view = run(prefix,
               [step("demo/numbers", prefix, "RUNNING", started=time.time()), step("demo/total", prefix)])
    pub.publish(view, final=False)
    wait_for(lambda: len(fake_github.issue_comments(REPO, 1)) == 1 and fake_github.labels(REPO, 1))
    first = fake_github.issue_comments(REPO, 1)[0]
    assert first["body"].startswith(marker(EXP, prefix))
    assert "RUNNING" in first["body"] and "`demo/numbers`" in first["body"]
    assert f"[dashboard](http://dash.local:8000/experiments/{EXP})" in first["body"]
    assert fake_github.labels(REPO, 1) == ["marin:running"]

    done = run(prefix, [step("demo/numbers", prefix, "SUCCESS"), step("demo/total", prefix, "SUCCESS")],
               "SUCCESS")
    pub.publish(done, final=True)
    comments = fake_github.issue_comments(REPO, 1)
    assert len(comments) == 1 and comments[0]["id"] == first["id"]
    assert "— SUCCESS" in comments[0]["body"] and "2 SUCCESS" in comments[0]["body"]
    assert fake_github.labels(REPO, 1) == ["marin:succeeded"]
    assert fake_github.count("POST", r"/comments$") == 1
    assert fake_github.count("PATCH", r"/issues/comments/") >= 1
    assert pub.errors == []


def test_failed_run_moves_the_label_and_lists_the_error(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                        tmp_path: Path) -> None:
    prefix = str(tmp_path)
    fake_github.repos[REPO]["issues"][1]["_labels"].update({"marin:running", "experiment"})
    error = ('Traceback (most recent call last):\n  File "x.py"\nValueError: lr must be positive\n'
             + "more\n" * 20)
    failed = run(prefix, [step("train/tiny", prefix, "FAILED", attempt=2, error=error),
                          step("eval/tiny", prefix, "DEP_FAILED")], "FAILED")
    publisher(gh_tracker).publish(failed, final=True)
    body = fake_github.issue_comments(REPO, 1)[0]["body"]
    assert fake_github.labels(REPO, 1) == ["experiment", "marin:failed"]
    assert "#### Failed steps (1)" in body and "ValueError: lr must be positive" in body
    assert f"`{prefix}/train/tiny-0a1b2c3d/.marin/logs/attempt-2.log`" in body
    assert body.count("more") == 5  # only the first 8 lines of the error
    assert "DEP_FAILED" in body


def test_a_thousand_transitions_are_debounced(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                              tmp_path: Path) -> None:
    prefix = str(tmp_path)
    view = run(prefix, [step(f"fan/s{i:04d}", prefix) for i in range(1000)])
    pub = publisher(gh_tracker, interval=0.5)
    started = time.time()
    for i in range(1000):
        view = with_status(view, i, "SUCCESS")
        pub.publish(view, final=False)
        time.sleep(0.001)
    elapsed = time.time() - started
    pub.publish(dataclasses.replace(view, status="SUCCESS", ended=time.time()), final=True)
    edits = fake_github.count("PATCH")
    # one flush at once, then at most one per 0.5 s interval, plus the final one
    assert edits <= elapsed / 0.5 + 3
    assert len(fake_github.requests) <= edits + 8  # repo, issue, list, create, labels: once each
    body = fake_github.issue_comments(REPO, 1)[0]["body"]
    assert len(body) <= MAX_BODY_CHARS and "1000 steps: ✅ 1000 SUCCESS" in body
    assert "| … 850 more steps (850 SUCCESS): see the dashboard |" in body


def test_restarted_executor_edits_the_same_comment(fake_github: FakeGitHub, tmp_path: Path) -> None:
    prefix = str(tmp_path)
    manifest = tmp_path / "experiments" / f"{EXP}.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"id": EXP, "git_commit": "0123456789abcdef0123", "user": "ada", "runs": [
        {"run_id": "run-1", "started": 1764000000.0, "status": "FAILED"},
        {"run_id": "run-2", "started": 1764000100.0, "status": "RUNNING"}]}))
    fake_github.add_issue(REPO, "unrelated")  # #2
    for _ in range(3):  # other people's comments first
        GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, throttle=False).create_comment(1,
                                                                                                "nice idea")

    def fresh_tracker() -> GitHubTracker:  # a new process: nothing cached
        return GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, throttle=False)

    first = publisher(fresh_tracker())
    first.publish(run(prefix, [step("a", prefix, "RUNNING")], run_id="run-1"), final=False)
    wait_for(lambda: len(fake_github.issue_comments(REPO, 1)) == 4)
    first.close()  # the executor dies without a final publish
    second = publisher(fresh_tracker())
    second.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS", run_id="run-2"), final=True)
    comments = fake_github.issue_comments(REPO, 1)
    assert len(comments) == 4
    managed = [c for c in comments if c["body"].startswith(marker(EXP, prefix))]
    assert len(managed) == 1 and "run `run-2`" in managed[0]["body"]
    assert "Earlier runs: `run-1` FAILED" in managed[0]["body"]
    assert "by `ada` · commit `0123456789ab`" in managed[0]["body"]
    # another prefix running the same DAG keeps its own comment
    publisher(fresh_tracker()).publish(run(prefix + "-b", [step("a", prefix, "SUCCESS")], "SUCCESS"),
                                       final=True)
    assert len(fake_github.issue_comments(REPO, 1)) == 5


def test_rate_limits_and_5xx_are_retried_then_published(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                        sleeps: SleepRecorder, tmp_path: Path) -> None:
    prefix = str(tmp_path)
    fake_github.inject(Fault("status", 502, path_regex=r"/comments$"))
    fake_github.inject(Fault("status", 403, headers={"Retry-After": "2"},
                             message="You have exceeded a secondary "
                             "rate limit", method="POST"))
    fake_github.inject(Fault("status", 429, headers={"X-RateLimit-Remaining": "0",
                                                     "X-RateLimit-Reset": str(int(time.time()) + 60)},
                             method="POST", path_regex="/labels"))
    fake_github.inject(Fault("drop", method="DELETE"))
    pub = publisher(gh_tracker)
    pub.publish(run(prefix, [step("a", prefix, "RUNNING")]), final=False)
    wait_for(lambda: fake_github.labels(REPO, 1) == ["marin:running"])  # the background flush got through
    pub.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS"), final=True)
    assert "— SUCCESS" in fake_github.issue_comments(REPO, 1)[0]["body"]
    assert fake_github.labels(REPO, 1) == ["marin:succeeded"]
    assert pub.errors == []  # every failure was retried away inside the flush
    # the reset is 60 s out: the wait honours it (allowing 30 s of a loaded machine before the wait)
    assert 2.0 in sleeps.waits and any(30.0 <= w <= 62.0 for w in sleeps.waits)
    assert not fake_github.faults  # every fault was met and recovered from
    assert len(fake_github.issue_comments(REPO, 1)) == 1


def test_dropped_create_answer_does_not_duplicate_the_comment(gh_tracker: GitHubTracker,
                                                              fake_github: FakeGitHub,
                                                              tmp_path: Path) -> None:
    fake_github.inject(Fault("drop_after", method="POST", path_regex=r"/comments$"))
    publisher(gh_tracker).publish(run(str(tmp_path), [step("a", str(tmp_path), "SUCCESS")], "SUCCESS"),
                                  final=True)
    assert len(fake_github.issue_comments(REPO, 1)) == 1
    assert "— SUCCESS" in fake_github.issue_comments(REPO, 1)[0]["body"]


def test_unreachable_tracker_is_reported_not_raised_into_the_run(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 sleeps: SleepRecorder) -> None:
    with FakeGitHub(token=TOKEN) as server:
        url = server.base_url  # a port that nothing listens on once the server is gone
    tracker = GitHubTracker(REPO, TOKEN, api_url=url, throttle=False, timeout_s=2,
                            policy=BackoffPolicy(max_attempts=3, base_delay_s=0.01))
    pub = publisher(tracker, interval=0.05)
    prefix = str(tmp_path)
    pub.publish(run(prefix, [step("a", prefix, "RUNNING")]), final=False)  # returns at once
    wait_for(lambda: len(pub.errors) >= 1)
    with pytest.raises(PublishError) as info:
        pub.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS"), final=True)
    message = str(info.value)
    assert "lab/experiments#1" in message and "network error" in message
    assert "earlier failed updates" in message
    assert TOKEN not in message and all(TOKEN not in e for e in pub.errors)
    assert TOKEN not in caplog.text


def test_deleted_comment_is_recreated(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                      tmp_path: Path) -> None:
    prefix = str(tmp_path)
    pub = publisher(gh_tracker)
    pub.publish(run(prefix, [step("a", prefix, "RUNNING")]), final=False)
    wait_for(lambda: len(fake_github.issue_comments(REPO, 1)) == 1)
    pub.close()
    del fake_github.comments[fake_github.issue_comments(REPO, 1)[0]["id"]]
    pub2 = IssuePublisher(gh_tracker, 1, min_interval_s=0)
    pub2._comment_id = pub._comment_id  # the same process, which remembered the now deleted comment
    pub2.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS"), final=True)
    assert len(fake_github.issue_comments(REPO, 1)) == 1


def test_comment_shows_wandb_link_loss_and_bpb(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                               tmp_path: Path) -> None:
    prefix = str(tmp_path)
    train, evaluation = step("train/tiny", prefix, "SUCCESS"), step("eval/tiny", prefix, "SUCCESS")
    out = Path(train.output_path)
    out.mkdir(parents=True)
    (out / "wandb.json").write_text(json.dumps({"project": "p", "run_id": "abc", "mode": "online", "dir": "d",
                                                "url": "https://wandb.ai/lab/p/runs/abc"}))
    rows = [{"step": i, "loss": 5.0 - i / 100, "lr": 1e-3} for i in range(1, 101)]
    rows.append({"step": 100, "eval": {"macro": {"bpb": 1.0}}})
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 101, "lo')
    ev = Path(evaluation.output_path)
    ev.mkdir(parents=True)
    (ev / "eval.json").write_text(json.dumps({"domains": {"python": {"loss": 1.0, "bpb": 1.2345},
                                                          "prose": {"loss": 2.0, "bpb": 1.5}},
                                              "macro": {"bpb": 1.367}}))
    offline = step("train/offline", prefix, "SUCCESS")
    Path(offline.output_path).mkdir(parents=True)
    (Path(offline.output_path) / "wandb.json").write_text(json.dumps({"run_id": "xyz", "mode": "offline",
                                                                      "url": None}))
    publisher(gh_tracker).publish(run(prefix, [train, evaluation, offline], "SUCCESS"), final=True)
    body = fake_github.issue_comments(REPO, 1)[0]["body"]
    assert "[run](https://wandb.ai/lab/p/runs/abc)" in body
    assert "loss 4.0000 @ 100" in body
    assert "bpb prose 1.500, python 1.234" in body and "macro bpb 1.367" in body
    assert "`offline xyz`" in body


def test_local_tracker_gets_the_issue_comment_and_labels(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    tracker = LocalTracker(prefix, repo="local/experiments")
    pub = IssuePublisher(tracker, 4, min_interval_s=0)
    view = run(prefix, [step("a", prefix, "RUNNING")], issue="local/experiments#4")
    pub.publish(view, final=False)
    pub.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS", issue="local/experiments#4"),
                final=True)
    reader = LocalTracker(prefix, readonly=True)
    issue = reader.get_issue(4)  # a fresh prefix lacked it: the publisher created it
    assert issue.title == "Does a wider router balance expert load?" and issue.labels == ("marin:succeeded",)
    comments = reader.list_comments(4)
    assert len(comments) == 1 and "— SUCCESS" in comments[0].body


def test_markdown_cannot_be_broken_by_step_names_or_errors(gh_tracker: GitHubTracker, fake_github: FakeGitHub,
                                                           tmp_path: Path) -> None:
    prefix = str(tmp_path)
    nasty = step("bad|name`x", prefix, "FAILED", error="```\n<!-- marin-status:evil -->\n| a | b |")
    publisher(gh_tracker).publish(run(prefix, [nasty], "FAILED"), final=True)
    body = fake_github.issue_comments(REPO, 1)[0]["body"]
    assert "`bad\\|name'x`" in body
    assert "````\n```\n<!-- marin-status:evil -->" in body  # a longer fence keeps the error inside
    assert body.startswith(marker(EXP, prefix)) and body.count("<!-- marin-status:") == 2


def test_token_never_leaves_the_process(fake_github: FakeGitHub, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)  # PyGithub and urllib3 log requests at DEBUG
    tracker = GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, throttle=False,
                            policy=BackoffPolicy(max_attempts=2, sleep=lambda s: None))
    prefix = str(tmp_path)
    leaky = step("a", prefix, "FAILED",
                 error=f"RuntimeError: auth with {TOKEN} failed; header Authorization: "
                                              f"token {TOKEN}")
    fake_github.inject(Fault("status", 500, message=f"echo {TOKEN}"), times=4)
    pub = publisher(tracker)
    pub.publish(run(prefix, [leaky], "RUNNING"), final=False)
    wait_for(lambda: bool(pub.errors))
    pub.publish(run(prefix, [leaky], "FAILED"), final=True)
    body = fake_github.issue_comments(REPO, 1)[0]["body"]
    assert "RuntimeError: auth with *** failed" in body
    outputs = [body, caplog.text, *pub.errors, repr(tracker), repr(pub)]
    assert all(TOKEN not in text for text in outputs)
    assert any("echo ***" in e for e in pub.errors)


def test_bad_credentials_stop_background_updates_until_the_final_report(fake_github: FakeGitHub,
                                                                         tmp_path: Path) -> None:
    tracker = GitHubTracker(REPO, "ghp_revokedtoken0123456789ab", api_url=fake_github.base_url,
                            throttle=False)
    pub = publisher(tracker, interval=0.01)
    prefix = str(tmp_path)
    view = run(prefix, [step(f"s{i}", prefix) for i in range(50)])
    for i in range(50):
        view = with_status(view, i, "SUCCESS")
        pub.publish(view, final=False)
        time.sleep(0.005)
    wait_for(lambda: pub.error_count >= 1)
    time.sleep(0.1)
    background_requests = len(fake_github.requests)
    assert background_requests == 1  # one 401, then no more tries in the background
    with pytest.raises(PublishError, match="Bad credentials.*GITHUB_TOKEN"):
        pub.publish(dataclasses.replace(view, status="SUCCESS"), final=True)
    assert len(fake_github.requests) == 2 and pub.error_count == 1


class StaleFirstListing(GitHubTracker):
    """A tracker whose first comment listing misses a comment another executor is creating at that moment."""

    def __init__(self, *args: object, rival: Callable[[], None], **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.rival, self.listed = rival, 0

    def list_comments(self, number: int) -> list[Comment]:
        self.listed += 1
        if self.listed == 1:
            self.rival()  # the other executor creates its comment right after our listing
            return []
        return super().list_comments(number)


def test_two_executors_creating_at_once_converge_on_the_oldest_comment(fake_github: FakeGitHub,
                                                                       tmp_path: Path) -> None:
    prefix = str(tmp_path)
    rival = GitHubTracker(REPO, TOKEN, api_url=fake_github.base_url, throttle=False)
    rival_id: list[int] = []

    def rival_creates() -> None:
        rival_id.append(rival.create_comment(1, marker(EXP, prefix) + "\nrival's view").id)

    ours = StaleFirstListing(REPO, TOKEN, api_url=fake_github.base_url, throttle=False, rival=rival_creates)
    pub = publisher(ours)
    pub.publish(run(prefix, [step("a", prefix, "SUCCESS")], "SUCCESS"), final=True)
    [comment] = fake_github.issue_comments(REPO, 1)
    assert comment["id"] == rival_id[0] and "— SUCCESS" in comment["body"]
    assert fake_github.count("DELETE", r"/issues/comments/") == 1
