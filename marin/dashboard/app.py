"""The dashboard's FastAPI application: wiring only (routers, templates, static files, headers, errors).

`create_app(prefix)` builds one read-only app for one prefix. The routers (one per resource: experiments,
steps, files, issues) each serve a JSON API under `/api/...` and the HTML page that uses it. Pages are
rendered server-side with Jinja2 (autoescape on, so every string from storage is escaped) and refreshed by
small vanilla scripts under `/static`. The Content-Security-Policy allows scripts, styles and requests to this
origin only: nothing is fetched from a CDN or any other host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marin.compare.render import environment
from marin.dashboard import predictions as prediction_view
from marin.dashboard.context import Dashboard
from marin.dashboard.files import FileNotFound
from marin.dashboard.markdown import render as render_markdown
from marin.dashboard.paths import UnsafePathError
from marin.dashboard.routers import alerts, catalogue, compare, experiments, files, issues, predictions, steps
from marin.dashboard.steps import StepNotFound
from marin.errors import CorruptFileError

HERE = Path(__file__).parent
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
ROUTERS = tuple(m.router for m in (experiments, steps, files, issues, predictions, catalogue, alerts,
                                   compare))
"""The app's routers, in the order they are included (marin.publish calls the page routes' functions)."""
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """Adds the CSP and friends to every response (plain ASGI: no per-request task overhead)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    h for h in _HEADERS if h[0] not in names
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def templates() -> Jinja2Templates:
    """The shared environment of marin/compare/render.py (one rendering path with the static site), plus the
    dashboard's own filters."""
    env = environment()
    env.filters.update(markdown=render_markdown)
    env.globals["prediction_for"] = prediction_view.for_step
    return Jinja2Templates(env=env)


def create_app(
    prefix: str, *, cache_ttl: float | None = None, storage_options: dict[str, Any] | None = None,
    metrics_cache_bytes: int | None = None,
    dash: Dashboard | None = None,
) -> FastAPI:
    """The dashboard for `prefix` (a local path, gs://bucket/path, s3://bucket/path); `metrics_cache_bytes`
    bounds the parsed metrics kept in memory (default: `marin.dashboard.metrics.cache_bytes()`). `dash`:
    readers built by the caller (marin.publish's public view passes its policy-filtered, redacting ones)."""
    app = FastAPI(
        title="marin dashboard",
        description="Read-only view of the experiments, steps, logs, metrics and local issues under a "
                    "prefix.",
        version="1",
    )
    app.state.dash = dash or Dashboard.open(prefix, cache_ttl=cache_ttl, storage_options=storage_options,
                                            metrics_cache_bytes=metrics_cache_bytes)
    app.state.templates = templates()
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(SecurityHeaders)

    def handler(status: int) -> Any:
        async def handle(request: Request, exc: Exception) -> Response:
            return error_response(request, status, str(exc))

        return handle

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(request, exc.status_code, str(exc.detail))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(UnsafePathError, handler(400))
    app.add_exception_handler(StepNotFound, handler(404))
    app.add_exception_handler(FileNotFound, handler(404))
    app.add_exception_handler(CorruptFileError, handler(500))
    return app


def error_response(request: Request, status: int, detail: str) -> Response:
    if request.url.path.startswith("/api/") or request.url.path.startswith("/raw/"):
        return JSONResponse({"detail": detail}, status_code=status)
    html: HTMLResponse = request.app.state.templates.TemplateResponse(
        request,
        "error.html",
        {"status": status, "detail": detail, "prefix": request.app.state.dash.prefix},
        status_code=status,
    )
    return html


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory marin.dashboard.app:app_from_env` (prefix from MARIN_PREFIX)."""
    return create_app(os.environ.get("MARIN_PREFIX", "./marin-out"))
