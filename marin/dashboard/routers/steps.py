"""Steps: a step's full picture, its log tail (follow it by passing `offset` back) and its metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from marin.compare.fitplot import FitChart, fit_chart
from marin.compare.step_view import step_view
from marin.dashboard.alerts import StepAlerts, step_alerts
from marin.dashboard.context import Dashboard, get_dashboard, page
from marin.dashboard.paths import clean_relpath
from marin.dashboard.predictions import for_step as prediction_for
from marin.dashboard.results import source
from marin.dashboard.schemas import LogTail, Metrics, StepDetail
from marin.dashboard.steps import log_tail, step_detail
from marin.status import files as sf

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]
MAX_LOG_BYTES = 1 << 20


@router.get("/api/steps/{step_path:path}", response_model=StepDetail, tags=["steps"])
def get_step(step_path: str, dash: Dash) -> StepDetail:
    """A step by its output path relative to the prefix, e.g. `demo/total-5e6f7a8b`."""
    return step_detail(dash.store, clean_relpath(step_path), dash.issues.link, dash.experiments)


@router.get("/api/logs/{step_path:path}", response_model=LogTail, tags=["steps"])
def get_log(
    step_path: str,
    dash: Dash,
    attempt: Annotated[
        int | None, Query(ge=1, description="attempt number; default: the current one")
    ] = None,
    offset: Annotated[
        int | None, Query(ge=0, description="byte offset to read from (the `end` of the last call)")
    ] = None,
    max_bytes: Annotated[int, Query(ge=1, le=MAX_LOG_BYTES)] = 64 << 10,
) -> LogTail:
    """The tail of a step's log: the last `max_bytes`, or what was appended after `offset`."""
    rel = clean_relpath(step_path)
    if dash.store.read_json(sf.status_path(rel)) is None and dash.store.info(sf.meta_dir(rel)) is None:
        raise HTTPException(404, f"no step at {rel!r}")
    return log_tail(dash.store, rel, attempt, offset, max_bytes)


@router.get("/api/metrics/{step_path:path}", response_model=Metrics, tags=["steps"])
def get_metrics(
    step_path: str,
    dash: Dash,
    max_points: Annotated[int, Query(ge=2, le=20000)] = 1000,
) -> Metrics:
    """Training curves (metrics.jsonl, downsampled), the latest expert load, and eval results (eval.json)."""
    rel = clean_relpath(step_path)
    metrics = dash.metrics.metrics(rel, max_points)
    if metrics is None:
        raise HTTPException(404, f"step {rel!r} has neither metrics.jsonl nor eval.json")
    return metrics


@router.get("/steps/{step_path:path}", response_class=HTMLResponse, include_in_schema=False)
def step_page(step_path: str, request: Request, dash: Dash,
              smooth: Annotated[float, Query(ge=0.0, lt=1.0)] = 0.0) -> HTMLResponse:
    step = get_step(step_path, dash)
    res = step_view(source(dash), step.path, step.name or step.path, ema=smooth or None)
    return page(
        request, "step.html",
        {"prefix": dash.prefix, "step": step, "alerts": _alerts(dash, step), "res": res,
         "fit": _fit_plot(dash, step)},
    )


def _fit_plot(dash: Dashboard, step: StepDetail) -> FitChart | None:
    """The ladder's fit plot on its fit step's page (fit.json) and its prediction step's (prediction.json,
    with the fit.json of the dependency that wrote one, and the target's actual value once it landed)."""
    fit_doc = dash.store.read_json(f"{step.path}/fit.json")
    if isinstance(fit_doc, dict):
        return fit_chart(fit_doc)
    prediction = dash.store.read_json(f"{step.path}/prediction.json")
    if not isinstance(prediction, dict):
        return None
    for dep in step.dependencies:
        fit_doc = dash.store.read_json(f"{dep.path}/fit.json")
        if isinstance(fit_doc, dict):
            pred = prediction_for(dash.prefix, step.path)
            points = (pred or {}).get("points") or []
            actual = next((p.actual for p in reversed(points) if p.actual is not None), None)
            return fit_chart(fit_doc, prediction, actual)
    return None


def _alerts(dash: Dashboard, step: StepDetail) -> StepAlerts:
    """The step's health alerts and risk points (the "Health alerts" section; docs/health.md)."""
    return step_alerts(dash.store, step.path, step.name or "", step.status.status)
