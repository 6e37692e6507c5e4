"""Compare: `/compare?runs=A&runs=B...` (the page) and `/api/compare` (the same as JSON), both from
marin.compare; the page's body is the shared partial `_compare.html` (marin/compare/render.py), the one the
static site renders too.

Parameters: `runs` (repeatable, or comma-separated; experiment ids, step names, hashes or output paths; the
first is the baseline; one experiment alone is compared with its baseline), `metric` (repeatable; default
loss), `x` (step, tokens, flops), `smooth` (EMA weight, 0 = none), `logx`/`logy`, `max_points`.
A finished comparison is kept for the store's cache TTL, as every other read is: 8 clients polling the same
four 10,000-step runs cost one computation per TTL.
"""

from __future__ import annotations

import threading
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from marin.compare import AXES, CompareError, Comparison, compare
from marin.compare.render import render_compare
from marin.dashboard.compare_source import DashboardSource
from marin.dashboard.context import Dashboard, get_dashboard, page

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]
_CACHE: dict[tuple[Any, ...], tuple[float, Comparison]] = {}
_LOCK = threading.Lock()


def _names(runs: list[str]) -> list[str]:
    return [n.strip() for r in runs for n in r.split(",") if n.strip()]


def comparison(dash: Dashboard, runs: list[str], metrics: list[str], x: str, smooth: float | None,
               max_points: int) -> Comparison:
    names = _names(runs)
    key = (id(dash), tuple(names), tuple(metrics), x, smooth, max_points)
    now = time.monotonic()
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None and now - hit[0] < dash.store.ttl:
        return hit[1]
    source = DashboardSource(dash.store, dash.metrics, dash.experiments)
    try:
        result = compare(source, names, metrics=metrics or ["loss"], axis=x, ema=smooth or None,
                         max_points=max_points)
    except (CompareError, ValueError) as e:
        raise HTTPException(400, str(e)) from e
    with _LOCK:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = (now, result)
    return result


Runs = Annotated[list[str], Query(description="experiments or steps (id, name, hash, output path); the first "
                                             "is the baseline")]
Metric = Annotated[list[str], Query(description="logged metrics to draw (default: loss)")]
XAxis = Annotated[str, Query(description="x axis: step, tokens or flops", pattern="^(step|tokens|flops)$")]
Smooth = Annotated[float, Query(ge=0.0, lt=1.0, description="EMA weight on the past (0: none)")]
MaxPoints = Annotated[int, Query(ge=10, le=5000, description="points per curve after downsampling")]


@router.get("/api/compare", tags=["compare"])
def get_compare(dash: Dash, runs: Runs, metric: Metric = [], x: XAxis = "step",  # noqa: B006
                smooth: Smooth = 0.0, max_points: MaxPoints = 400) -> dict[str, Any]:
    """Runs side by side: metrics with differences vs the first, curves on shared axes, config diff."""
    return comparison(dash, runs, metric, x, smooth, max_points).to_json()


@router.get("/compare", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, dash: Dash, runs: Annotated[list[str], Query()] = [],  # noqa: B006
                 metric: Metric = [], x: XAxis = "step", smooth: Smooth = 0.0,  # noqa: B006
                 logx: bool = False, logy: bool = False, max_points: MaxPoints = 400,
                 order: str = "") -> HTMLResponse:
    names = _names(runs)
    if order == "oldest":  # ticked on the experiments list (newest first): the oldest is the baseline
        names.sort(key=lambda n: ((found := dash.experiments.manifest(n)) and found[1].created) or 0.0)
    cmp = comparison(dash, names, metric, x, smooth, max_points) if names else None
    return page(request, "compare.html", {
        "prefix": dash.prefix, "cmp": cmp, "names": names, "axes": AXES, "x": x, "smooth": smooth,
        "logx": logx, "logy": logy, "metrics": metric or ["loss"],
        "body": render_compare(cmp, log_x=logx, log_y=logy, env=request.app.state.templates.env)
        if cmp else None,
    })
