"""Real executor runs (local backend) publishing to the fake GitHub API and to the local tracker.

What a researcher sees: the run's status comment on the linked issue (created, then edited by a re-run),
the run labels, metrics from the step outputs, a failed step with its error and log, an unreachable tracker
reported in the run's summary and manifest while the run itself succeeds, and the token absent from every
file under the prefix and from everything printed or logged.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import marin.tracking  # noqa: F401  (registers the issue publisher, as executor_main does)
from marin import Step, output_path_of, this_output_path
from marin.tracking.comment import marker
from marin.tracking.local import LocalTracker
from tests.fakes.github_api import FakeGitHub
from tests.tracking.conftest import REPO, TOKEN
from tests.tracking.fns import EvalLikeConfig, FailConfig, TrainLikeConfig, eval_like, fail, train_like


@pytest.fixture(autouse=True)
def _tracker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GITHUB_TOKEN", "GITHUB_API_URL", "MARIN_TRACKER", "MARIN_ISSUE_REPO",
                 "MARIN_DASHBOARD_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MARIN_TRACKER_MIN_INTERVAL", "0.05")


def pipeline(fail_eval: bool = False) -> list[Step]:
    train = Step(name="e2e/train", fn=train_like, config=TrainLikeConfig(output_path=this_output_path()))
    if fail_eval:
        failing = FailConfig(output_path=this_output_path(), message=f"bad {output_path_of(train)}")
        evaluation = Step(name="e2e/eval", fn=fail, config=failing)
    else:
        evaluation = Step(name="e2e/eval", fn=eval_like, config=EvalLikeConfig(
            model_path=output_path_of(train), output_path=this_output_path()))
    return [evaluation]


def assert_token_absent(prefix: str, *texts: str) -> None:
    leaks = [str(p) for p in Path(prefix).rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert leaks == [], f"token written to {leaks}"
    assert all(TOKEN not in text for text in texts)


def test_run_publishes_to_github_and_a_rerun_edits_the_same_comment(
        run_marin: Callable[..., Any], marin_prefix: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        server.add_issue(REPO, "Tiny pipeline")
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", server.base_url)
        first = run_marin(pipeline(), issue=f"{REPO}#1", script="experiments/exp1_tiny.py", verbose=True)
        assert first.status == "SUCCESS" and first.publisher_errors == []
        comments = server.issue_comments(REPO, 1)
        assert len(comments) == 1 and comments[0]["body"].startswith(marker(first.experiment_id,
                                                                            marin_prefix))
        body = comments[0]["body"]
        assert f"Experiment `{first.experiment_id}` — SUCCESS" in body and "2 SUCCESS" in body
        assert "loss 0.8000 @ 5" in body and "`offline r123`" in body
        assert "bpb code 0.750, prose 1.250" in body and "macro bpb 1.000" in body
        assert server.labels(REPO, 1) == ["marin:succeeded"]
        train_json = json.loads(Path(first.output_path("e2e/train"), ".marin", "step.json").read_text())
        assert train_json["issue"] == f"{REPO}#1"

        second = run_marin(pipeline(), issue=f"{REPO}#1", script="experiments/exp1_tiny.py", verbose=True)
        assert second.experiment_id == first.experiment_id and second.run_id != first.run_id
        comments = server.issue_comments(REPO, 1)
        assert len(comments) == 1 and f"run `{second.run_id}`" in comments[0]["body"]
        assert f"Earlier runs: `{first.run_id}` SUCCESS" in comments[0]["body"]
        assert server.count("POST", r"/comments$") == 1
        out, err = capfd.readouterr()
        assert_token_absent(marin_prefix, out, err, caplog.text, comments[0]["body"])


def test_failed_step_is_shown_with_its_error_and_log(run_marin: Callable[..., Any], marin_prefix: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        server.add_issue(REPO, "Failing pipeline")
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", server.base_url)
        result = run_marin(pipeline(fail_eval=True), issue=f"{REPO}#1")
        assert result.status == "FAILED" and result.publisher_errors == []
        body = server.issue_comments(REPO, 1)[0]["body"]
        log = f"{result.output_path('e2e/eval')}/.marin/logs/attempt-1.log"
        assert "#### Failed steps (1)" in body and "ValueError: bad" in body and f"log `{log}`" in body
        assert 'tests/tracking/fns.py", line' in body and "in fail\n    raise ValueError(cfg.message)" in body
        assert os.path.exists(log)
        assert server.labels(REPO, 1) == ["marin:failed"]


def test_unreachable_github_is_reported_and_the_run_succeeds(run_marin: Callable[..., Any], marin_prefix: str,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    with FakeGitHub(token=TOKEN) as gone:
        dead_url = gone.base_url
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_API_URL", dead_url)
    monkeypatch.setenv("MARIN_TRACKER_MAX_ATTEMPTS", "2")
    result = run_marin(pipeline(), issue=f"{REPO}#1", verbose=True)
    assert result.status == "SUCCESS" and {s.status for s in result.steps.values()} == {"SUCCESS"}
    assert len(result.publisher_errors) == 1
    error = result.publisher_errors[0]
    assert error["publisher"] == "issue-tracker" and f"{REPO}#1" in error["error"]
    assert "network error" in error["error"]
    manifest = json.loads(Path(marin_prefix, "experiments", f"{result.experiment_id}.json").read_text())
    assert manifest["runs"][-1]["status"] == "SUCCESS"
    assert manifest["runs"][-1]["publisher_errors"][0]["error"] == error["error"]
    assert "publisher issue-tracker failed (the run is unaffected)" in result.summary
    out, err = capfd.readouterr()
    assert_token_absent(marin_prefix, out, err, result.summary)


def test_local_tracker_gets_a_live_status_comment(run_marin: Callable[..., Any], marin_prefix: str) -> None:
    result = run_marin(pipeline(), issue="local/experiments#1", description="tiny pipeline")
    assert result.status == "SUCCESS" and result.publisher_errors == []
    tracker = LocalTracker(marin_prefix, readonly=True)
    issue = tracker.get_issue(1)
    assert issue.title == "tiny pipeline" and issue.labels == ("marin:succeeded",)
    [comment] = tracker.list_comments(1)
    assert comment.body.startswith(marker(result.experiment_id, marin_prefix)) and "— SUCCESS" in comment.body


# `marin issue new`'s skeleton is now an ablation that trains the tutorial's model: the test that runs it and
# reads its issue comment ("— SUCCESS", the step's name) is tests/experiments/test_newcomer_path.py.


def test_local_issue_comment_is_live_while_the_run_goes_on(mixed_run: Any) -> None:
    """A run in every state at once (exec's `mixed_run`, linked to openlab/demo#7, no token: local
    tracker)."""
    tracker = LocalTracker(mixed_run.prefix, repo="openlab/demo", readonly=True)

    def comment_body() -> str:
        comments = tracker.list_comments(7) if tracker.list_issues() else []
        return comments[0].body if comments else ""

    deadline = time.time() + 30
    while "🔄 RUNNING" not in comment_body() or "❌ FAILED" not in comment_body():
        assert time.time() < deadline, f"no live comment; last body: {comment_body()!r}"
        time.sleep(0.05)
    live = comment_body()
    assert "— RUNNING" in live and "`mixed/slow` | 🔄 RUNNING" in live and "⛔ DEP_FAILED" in live
    assert "ValueError: planned failure" in live
    assert tracker.get_issue(7).labels == ("marin:running",)
    result = mixed_run.release()
    assert result.status == "FAILED" and result.publisher_errors == []
    final = comment_body()
    assert "— FAILED" in final and "`mixed/slow` | ✅ SUCCESS" in final
    assert tracker.get_issue(7).labels == ("marin:failed",) and len(tracker.list_comments(7)) == 1
