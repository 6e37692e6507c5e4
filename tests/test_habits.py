"""The suite's own settings are in force: the project's warnings are errors, other packages' are not, and
every test runs under a default time limit (pyproject.toml, [tool.pytest.ini_options])."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["marin.status.files", "operators.tokenize", "moe_trainer.train"])
def test_a_warning_from_the_project_is_an_error(module: str) -> None:
    with pytest.raises(UserWarning, match="from the project"):
        filename = module.replace(".", "/") + ".py"
        warnings.warn_explicit("from the project", UserWarning, filename, 1, module=module)


def test_a_warning_from_another_package_stays_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="elsewhere"):
        warnings.warn_explicit("elsewhere", DeprecationWarning, "somelib/x.py", 1, module="somelib.x")
    with pytest.warns(UserWarning, match="prefix only"):  # a name that merely starts like ours is not ours
        warnings.warn_explicit("prefix only", UserWarning, "marina/x.py", 1, module="marina.x")


def test_every_test_has_a_default_timeout(request: pytest.FixtureRequest) -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert float(options["timeout"]) > 0
    assert float(request.config.getini("timeout")) == float(options["timeout"])
