"""The verdict on a GitHub issue (the fake GitHub API on loopback): the run's computed verdict label and
status-comment section, then `marin verdict` replacing both in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marin import Criterion, Step, this_output_path
from marin.cli import main as marin_main
from tests.fakes.github_api import FakeGitHub
from tests.marin.notebook_fns import EvalConfig, write_eval
from tests.tracking.conftest import REPO, TOKEN


@pytest.fixture(autouse=True)
def _tracker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MARIN_TRACKER", "MARIN_ISSUE_REPO", "MARIN_DASHBOARD_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MARIN_TRACKER_MIN_INTERVAL", "0.05")


def test_the_verdict_label_and_section_follow_on_github(run_marin: Callable[..., Any], marin_prefix: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    base = Step(name="eval/base", fn=write_eval, config=EvalConfig(this_output_path(), 1.3))
    new = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), 1.2))
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        server.add_issue(REPO, "Wider router")
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", server.base_url)
        result = run_marin([new, base], issue=f"{REPO}#1", hypothesis="a wider router lowers bpb",
                           criterion=Criterion("eval/new:macro.bpb", "lower", base, 0.05))
        assert result.publisher_errors == []
        assert sorted(server.labels(REPO, 1)) == ["marin:succeeded", "marin:worked"]
        [comment] = server.issue_comments(REPO, 1)
        assert "**Verdict: ✅ worked** — by marin" in comment["body"]
        assert marin_main(["verdict", result.experiment_id, "mixed", "--note", "helps python only",
                           "--by", "bob", "--prefix", marin_prefix]) == 0
        assert sorted(server.labels(REPO, 1)) == ["marin:mixed", "marin:succeeded"]
        [comment] = server.issue_comments(REPO, 1)  # edited in place, no second comment
        assert "**Verdict: 🌗 mixed** — by bob" in comment["body"] and "helps python only" in comment["body"]
        assert "| `eval/new` |" in comment["body"]  # the run's table is kept around the new section
