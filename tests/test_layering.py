"""The import rules, checked: import-linter's contracts in pyproject.toml (a broken one fails this test), and
what `import marin` brings in (no tracker, no dashboard: they are found through entry points or imported by
their commands)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import marin

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_in_pyproject_hold() -> None:
    done = _lint()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout and "4 kept" in done.stdout


def test_a_broken_import_contract_fails_the_check(tmp_path: Path) -> None:
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["marin"]\n\n[[tool.importlinter.contracts]]\n'
        'name = "graph never reads status (false: the plan reads status files)"\ntype = "forbidden"\n'
        'source_modules = ["marin.graph"]\nforbidden_modules = ["marin.status"]\n'
    )
    done = _lint("--config", str(config))
    assert done.returncode != 0
    assert "BROKEN" in done.stdout and "marin.graph.plan -> marin.status" in done.stdout


def test_import_marin_imports_no_tracker_and_no_dashboard() -> None:
    code = (
        "import sys, marin; bad = sorted(m for m in sys.modules if m.startswith(('marin.tracking', "
        "'marin.dashboard'))); print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_publisher_api_is_exported_from_marin() -> None:
    for name in ("Publisher", "RunView", "StepView", "RunContext", "register_publisher_factory"):
        assert name in marin.__all__ and hasattr(marin, name)
