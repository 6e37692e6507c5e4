"""Every test keeps the builder's private step cache in its own temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _publish_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_PUBLISH_CACHE", str(tmp_path / "publish-cache"))
