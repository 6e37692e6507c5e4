"""A step never sees the platform's own credentials (the tracker's GitHub token), unless its env passes
one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marin.execution.worker import execute_step

SEEN: dict[str, str | None] = {}


def _print_env(_: object) -> None:
    SEEN["GITHUB_TOKEN"] = os.environ.get("GITHUB_TOKEN")
    print("environment:", dict(os.environ))


def test_platform_token_is_hidden_from_steps_and_restored(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret_value_123")
    log = tmp_path / "attempt-1.log"
    result = execute_step(_print_env, None, str(log), env={})
    assert result.ok
    assert SEEN["GITHUB_TOKEN"] is None
    assert "ghp_secret_value_123" not in log.read_text()
    assert os.environ["GITHUB_TOKEN"] == "ghp_secret_value_123"  # the executor's own publisher still has it


def test_a_step_may_pass_a_token_explicitly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "platform")
    result = execute_step(_print_env, None, str(tmp_path / "a.log"), env={"GITHUB_TOKEN": "the-step-own"})
    assert result.ok and SEEN["GITHUB_TOKEN"] == "the-step-own"
    assert os.environ["GITHUB_TOKEN"] == "platform"
