"""`marin dashboard` argument handling (serving itself is exercised by the browser test and the benchmark)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marin.dashboard.cli import main, parser, resolve_prefix


def test_defaults_bind_loopback() -> None:
    args = parser().parse_args([])
    assert (args.host, args.port, args.prefix) == ("127.0.0.1", 8000, None)


def test_prefix_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    assert resolve_prefix(None) == os.path.join(str(tmp_path), "marin-out")
    monkeypatch.setenv("MARIN_PREFIX", "gs://bucket/lab")
    assert resolve_prefix(None) == "gs://bucket/lab"
    assert resolve_prefix("rel/p") == os.path.join(str(tmp_path), "rel", "p")


def test_missing_prefix_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prefix", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
