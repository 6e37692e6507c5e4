"""With `CI` set, a test skipped for a missing component fails the run; without it, it is skipped; other skips
are untouched (tests/ci_skips.py)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

MODULE = '''
import pytest

def test_emulator():
    pytest.skip("some-emulator is not installed (pip install some-emulator)")

def test_module():
    pytest.importorskip("a_module_that_is_not_there")

@pytest.mark.skipif(True, reason="/usr/bin/chromium is not installed")
def test_marked():
    pass

def test_other_reason():
    pytest.skip("only meaningful on TPU hosts")
'''
COLLECTION = '''
import pytest
pytest.importorskip("another_module_that_is_not_there")

def test_never_collected():
    pass
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool,
         **files: str) -> pytest.RunResult:
    if ci:
        monkeypatch.setenv("CI", "1")
    else:
        monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(**files)
    return pytester.runpytest("-p", "tests.ci_skips", "-p", "no:cacheprovider")


@pytest.mark.parametrize("ci", [True, False], ids=["CI-set", "CI-unset"])
def test_missing_components_fail_only_in_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                            ci: bool) -> None:
    result = _run(pytester, monkeypatch, ci, test_needs=MODULE)
    if ci:
        result.assert_outcomes(failed=2, errors=1, skipped=1)  # a skipif mark fails in setup: an error
        result.stdout.fnmatch_lines(["*CI is set, so a missing component fails*"])
    else:
        result.assert_outcomes(skipped=4)


@pytest.mark.parametrize("ci", [True, False], ids=["CI-set", "CI-unset"])
def test_a_module_skipped_at_collection_fails_only_in_ci(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch, ci: bool) -> None:
    result = _run(pytester, monkeypatch, ci, test_collect=COLLECTION)
    if ci:
        result.assert_outcomes(errors=1)
        assert result.ret != 0
    else:
        result.assert_outcomes(skipped=1)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
