"""Posting a real run's alerts to a local issue the way the issue publisher does (AlertPoster.poll)."""

from __future__ import annotations

import time
from pathlib import Path

from marin.status.publisher import RunView, StepView
from marin.tracking.alerts import AlertPoster
from marin.tracking.local import LocalTracker


def post_alerts(output_path: Path, prefix: Path, *, name: str | None = None,
                status: str = "SUCCESS") -> list[str]:
    """Post the alerts of the step whose output is ``output_path`` to issue 1 of a local tracker under
    ``prefix`` (created when missing); returns the new comment bodies."""
    tracker = LocalTracker(str(prefix), "local/health")
    if not tracker.list_issues():
        tracker.create_issue("health alerts", "injected faults")
    before = {c.id for c in tracker.list_comments(1)}
    now = time.time()
    step = StepView(name=name or f"train/{output_path.name}", hash="ab12cd34" + "0" * 56,
                    output_path=str(output_path), status=status, attempt=1, started=now - 60, ended=now,
                    error_summary=None, log_path=None, dependencies=())
    view = RunView(experiment_id="exp17_health-ab12cd34", run_id="r1", script="experiments/exp17.py",
                   description="health", issue="local/health#1", prefix=str(prefix), status="SUCCESS",
                   started=now - 61, ended=now, steps=(step,))
    AlertPoster(tracker, 1, dashboard_url="http://dash.local").poll(view)
    return [c.body for c in tracker.list_comments(1) if c.id not in before]
