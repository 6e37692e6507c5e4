"""A green CI must not hide a missing install: with `CI` set, a test skipped because a component is missing
fails instead (a pytest plugin, loaded by the root conftest.py).

A skip counts as "a component is missing" when its reason says so the way this suite says it: `... is not
installed ...` (the emulators, moto, Chromium) or pytest.importorskip's `could not import ...` (sentencepiece,
fake-gcs-server, s3fs). Skips at collection (a module-level importorskip) and in setup (skipif marks,
fixtures) are both caught. Without `CI` such tests are skipped as before, with their reason in the summary.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

MISSING = ("is not installed", "could not import")


def missing_component(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    """The skip reason of `report` when it skipped for a missing component, else None."""
    if not report.skipped:
        return None
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
    return reason if any(m in reason for m in MISSING) else None


def _fail_in_ci(report: pytest.CollectReport | pytest.TestReport) -> None:
    reason = missing_component(report) if os.environ.get("CI") else None
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = ("CI is set, so a missing component fails this test instead of skipping it: "
                           f"{reason}. "
                           "Fix: install it (python3 dev.py install), or run without CI set")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _fail_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _fail_in_ci(outcome.get_result())
