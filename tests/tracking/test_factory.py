"""Backend choice from the environment, and the publisher factory the executor consults."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.status.publisher import DEFAULT_PUBLISHER_FACTORIES, RunContext, registered_publisher_factories
from marin.tracking import issue_publisher_factory
from marin.tracking.base import TrackerAuthError
from marin.tracking.factory import choose_backend, make_tracker
from marin.tracking.github import GitHubTracker
from marin.tracking.local import LocalTracker


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GITHUB_TOKEN", "GITHUB_API_URL", "MARIN_TRACKER", "MARIN_ISSUE_REPO", "MARIN_DASHBOARD_URL",
                 "MARIN_TRACKER_MIN_INTERVAL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("repo", "token", "override", "expected"), [
    ("lab/exp", None, None, "local"),
    ("lab/exp", "ghp_abcdefghijklmnop1234", None, "github"),
    ("local/experiments", "ghp_abcdefghijklmnop1234", None, "local"),
    ("lab/exp", "ghp_abcdefghijklmnop1234", "local", "local"),
    ("lab/exp", None, "off", "off"),
], ids=["no-token", "token", "local-owner", "override-local", "off"])
def test_choose_backend(monkeypatch: pytest.MonkeyPatch, repo: str, token: str | None, override: str | None,
                        expected: str) -> None:
    if token:
        monkeypatch.setenv("GITHUB_TOKEN", token)
    if override:
        monkeypatch.setenv("MARIN_TRACKER", override)
    assert choose_backend(repo) == expected


def test_bad_backend_name_lists_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_TRACKER", "gitlab")
    with pytest.raises(ValueError, match="github, local, off"):
        choose_backend("a/b")


def test_make_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = make_tracker(None, str(tmp_path))
    assert isinstance(local, LocalTracker) and local.repo == "local/experiments"
    monkeypatch.setenv("MARIN_ISSUE_REPO", "lab/exp")
    assert make_tracker(None, str(tmp_path)).repo == "lab/exp"
    with pytest.raises(TrackerAuthError, match="needs GITHUB_TOKEN"):
        make_tracker("lab/exp", str(tmp_path), backend="github")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_abcdefghijklmnop1234")
    monkeypatch.setenv("GITHUB_API_URL", "http://127.0.0.1:1/")
    gh = make_tracker("lab/exp", str(tmp_path))
    assert isinstance(gh, GitHubTracker) and gh.api_url == "http://127.0.0.1:1"
    assert "ghp_" not in repr(gh)


def test_publisher_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # declared under the marin.publishers entry point (pyproject.toml), not registered by an import
    assert issue_publisher_factory in registered_publisher_factories()[0]
    assert issue_publisher_factory not in DEFAULT_PUBLISHER_FACTORIES
    ctx = RunContext(prefix=str(tmp_path), issue=None, experiment_id="e-1", script="s.py")
    assert issue_publisher_factory(ctx) is None
    monkeypatch.setenv("MARIN_DASHBOARD_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("MARIN_TRACKER_MIN_INTERVAL", "0.25")
    pub = issue_publisher_factory(RunContext(prefix=str(tmp_path), issue="local/experiments#5",
                                             experiment_id="e-1", script="s.py"))
    assert pub is not None and pub.issue_ref == "local/experiments#5" and pub.min_interval_s == 0.25
    assert isinstance(pub.tracker, LocalTracker) and pub.dashboard_url == "http://127.0.0.1:8000"
    assert not (tmp_path / ".marin-tracker").exists()  # building the publisher touches nothing
    monkeypatch.setenv("MARIN_TRACKER", "off")
    assert issue_publisher_factory(RunContext(prefix=str(tmp_path), issue="local/experiments#5",
                                              experiment_id="e-1", script="s.py")) is None
