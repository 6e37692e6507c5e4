"""Builders for the executor's RunView/StepView values, for publisher tests that run without an executor."""

from __future__ import annotations

import dataclasses
import time

from marin.issue_ref import IssueRef
from marin.status.publisher import RunView, StepView


def step(name: str, prefix: str, status: str = "WAITING", *, attempt: int = 1, error: str | None = None,
         started: float | None = None, ended: float | None = None) -> StepView:
    output = f"{prefix}/{name}-0a1b2c3d"
    return StepView(name=name, hash="0a1b2c3d" + "0" * 56, output_path=output, status=status, attempt=attempt,
                    started=started, ended=ended, error_summary=error,
                    log_path=f"{output}/.marin/logs/attempt-{attempt}.log" if status == "FAILED" else None,
                    dependencies=())


def run(prefix: str, steps: list[StepView], status: str = "RUNNING", *, run_id: str = "run-1",
        experiment_id: str = "exp1_wider_router-5e6f7a8b", issue: str = "lab/experiments#1",
        description: str = "Does a wider router balance expert load?") -> RunView:
    now = time.time()
    return RunView(experiment_id=experiment_id, run_id=run_id, script="experiments/exp1_wider_router.py",
                   description=description, issue=str(IssueRef.parse(issue)), prefix=prefix, status=status,
                   started=now - 5, ended=now if status != "RUNNING" else None, steps=tuple(steps))


def with_status(view: RunView, index: int, status: str) -> RunView:
    steps = list(view.steps)
    steps[index] = dataclasses.replace(steps[index], status=status)
    return dataclasses.replace(view, steps=tuple(steps))
