"""Alerts: every active health alert under the prefix (JSON and a page), and one step's alerts (JSON)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from marin.dashboard.alerts import as_json, filter_history, step_alerts
from marin.dashboard.context import Dashboard, get_dashboard, page
from marin.dashboard.paths import clean_relpath

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]


@router.get("/api/alerts", tags=["alerts"])
def alerts(dash: Dash, rule: str | None = None, run: str | None = None,
           state: str | None = None) -> dict[str, Any]:
    """Active alerts (fired, not resolved; failed risk points; blind watchers), critical first; `step` is
    the training step the alert fired at, `step_path` the step's output path relative to the prefix; and
    `history`: every alert raised, resolved ones included (`resolved`: when, at which step, why), newest
    first, filtered by `rule`, `run` (part of a step path or experiment id) and `state` (active, resolved)."""
    rows = dash.alerts.active()
    history = filter_history(dash.alerts.history(), rule=rule, run=run, state=state)
    return {"active": [{**as_json(a), "step_path": s.path, "step_name": s.name, "step_status": s.status}
                       for s, a in rows],
            "history": [r.to_json() for r in history]}


@router.get("/api/alerts/{step_path:path}", tags=["alerts"])
def alerts_of_step(step_path: str, dash: Dash) -> dict[str, Any]:
    """A step's alerts (newest first) and risk points, and its watcher's heartbeat."""
    found = step_alerts(dash.store, clean_relpath(step_path))
    return {"step": found.path, "status": found.status, "watch": found.watch,
            "alerts": [as_json(a) for a in found.alerts],
            "risk_points": [as_json(a) for a in found.risk_points]}


@router.get("/alerts", response_class=HTMLResponse, include_in_schema=False)
def alerts_page(request: Request, dash: Dash, rule: str | None = None, run: str | None = None,
                state: str | None = None) -> HTMLResponse:
    rows = dash.alerts.active()
    every = dash.alerts.history()
    return page(request, "alerts.html", {
        "prefix": dash.prefix, "rows": rows,
        "history": filter_history(every, rule=rule, run=run, state=state),
        "rules": sorted({r.alert.rule for r in every}), "filters": {"rule": rule, "run": run, "state": state},
    })
