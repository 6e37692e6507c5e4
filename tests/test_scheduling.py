"""The order in which `python3 dev.py test` hands modules to its xdist workers (the root conftest.py): the
longest expected first, so that the slow modules do not start last."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def conftest(request: pytest.FixtureRequest) -> ModuleType:
    """The root conftest.py as pytest loaded it (the name `conftest` alone may be another directory's)."""
    [module] = [p for p in request.config.pluginmanager.get_plugins()
                if isinstance(p, ModuleType) and getattr(p, "__file__", None) == str(ROOT / "conftest.py")]
    return module


def test_scopes_are_handed_out_longest_first(conftest: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "_MODULE_SECONDS", {"tests/slow_one.py": 80, "tests/ray_a.py": 60,
                                                      "tests/ray_b.py": 50})
    queue = {  # xdist's own order: by number of tests
        "tests/quick_many.py": {f"tests/quick_many.py::t{i}": False for i in range(40)},  # 40 x 0.5 s
        "ray": {"tests/ray_a.py::t": False, "tests/ray_b.py::t1": False, "tests/ray_b.py::t2": False},
        "tests/slow_one.py": {"tests/slow_one.py::t": False},
        "tests/quick_few.py": {"tests/quick_few.py::t": False},
        "tests/quick_tie.py": {"tests/quick_tie.py::t": False},
    }
    order = [scope for scope, _ in conftest._longest_first(queue)]
    assert order == ["ray", "tests/slow_one.py", "tests/quick_many.py", "tests/quick_few.py",
                     "tests/quick_tie.py"]  # 110 s, 80 s, 20 s, then the ties in xdist's order
    assert conftest._expected_seconds(list(queue["ray"])) == 110  # each module once, however many tests


def test_every_timed_module_exists(conftest: ModuleType) -> None:
    missing = [m for m in conftest._MODULE_SECONDS if not (ROOT / m).is_file()]
    assert not missing, f"conftest._MODULE_SECONDS names modules that are gone (rename or drop them): " \
                        f"{missing}"
