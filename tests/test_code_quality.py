"""The lint and type checks are part of the suite: ruff clean on all code, mypy clean on the engine, the
operators and the trainer library (the same commands as scripts/check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_is_clean() -> None:
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]


def test_mypy_is_clean_on_engine_operators_and_trainer() -> None:
    out = _run("mypy", "marin", "operators", "lib/moe_trainer/src/moe_trainer")
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
