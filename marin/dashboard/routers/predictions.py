"""Pre-registered predictions: the calibration list (every forecast under the prefix, its verdict, the
hit rate of the 90% intervals) as JSON and as a page."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from marin.dashboard.context import Dashboard, get_dashboard
from marin.tracking.predictions import list_predictions

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]


def _listing(dash: Dashboard) -> dict[str, Any]:
    listing = list_predictions(dash.prefix)
    if dash.visible is None:
        return listing
    rows = [r for r in listing["predictions"] if dash.visible(dash.store.relative(str(r["path"])) or "")]
    scored = [r for r in rows if r["inside"] is not None]
    hit_rate = sum(bool(r["inside"]) for r in scored) / len(scored) if scored else None
    return {**listing, "predictions": rows, "scored": len(scored), "hit_rate": hit_rate}


@router.get("/api/predictions", tags=["predictions"])
def predictions(dash: Dash) -> dict[str, Any]:
    """Every prediction.json under the prefix: hash check, where it was posted, forecast, verdict."""
    return _listing(dash)


@router.get("/predictions", response_class=HTMLResponse, include_in_schema=False)
def predictions_page(request: Request, dash: Dash) -> HTMLResponse:
    response: HTMLResponse = request.app.state.templates.TemplateResponse(
        request, "predictions.html", {"prefix": dash.prefix, "listing": _listing(dash)}
    )
    return response
