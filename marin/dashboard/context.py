"""What every request handler needs for one prefix: the store and the readers built on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from marin.dashboard.alerts import AlertIndex
from marin.dashboard.experiments import ExperimentIndex
from marin.dashboard.issues import IssueReader
from marin.dashboard.metrics import MetricsReader
from marin.dashboard.store import PrefixStore


@dataclass
class Dashboard:
    prefix: str
    store: PrefixStore
    experiments: ExperimentIndex
    metrics: MetricsReader
    issues: IssueReader
    alerts: AlertIndex
    visible: Callable[[str], bool] | None = None
    """Whether a prefix-relative path may be shown (None: everything; marin.publish's public view sets it
    for the readers that scan the prefix themselves, such as the predictions list)."""

    @classmethod
    def open(
        cls, prefix: str, *, cache_ttl: float | None = None, storage_options: dict[str, Any] | None = None,
        metrics_cache_bytes: int | None = None,
    ) -> Dashboard:
        store = PrefixStore(prefix, ttl=cache_ttl, storage_options=storage_options)
        issues = IssueReader(store)
        experiments = ExperimentIndex(store, issues.link)
        return cls(
            prefix=prefix,
            store=store,
            experiments=experiments,
            metrics=MetricsReader(store, metrics_cache_bytes),
            issues=issues,
            alerts=AlertIndex(store, experiments),
        )


def get_dashboard(request: Request) -> Dashboard:
    """FastAPI dependency: the app's Dashboard."""
    dash: Dashboard = request.app.state.dash
    return dash


def page(request: Request, template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """A server-rendered page (the app's Jinja2 templates, autoescaped)."""
    html: HTMLResponse = request.app.state.templates.TemplateResponse(
        request, template, context, status_code=status_code
    )
    return html
