"""Rendering the site's pages: the public dashboard's page functions called directly, and a full build split
over forked workers.

:class:`AppPages` renders each page by calling the endpoint of the public app's route that serves its URL, as
a plain function: the route is found among the dashboard's routers (`marin.dashboard.app.ROUTERS`, matched
by Starlette's `Route.matches`, path converters included), the page's
dashboard readers are passed as the `dash` argument FastAPI would inject, and `request` is a Starlette
`Request` over a scope naming the app (what the routes read: `request.app.state.templates`). So a page is
rendered by the same route function, readers, templates and partials as `marin dashboard --public` serves
it, and the public gate's two body rules are applied as the gate applies them (`public.allowed` refuses the
URL, the redactor rewrites the whole text), without an event loop, an HTTP client or a worker thread per
page. FastAPI's own dispatch (dependency solving, a thread for each sync endpoint) is not used, and nothing
of it is patched: an exception the app turns into an error page (an exception handler's type) makes the page
a problem of the build, any other propagates, as it would out of the app.

:func:`render_split` renders a list of pages in `jobs` processes forked from the builder, after everything
the pages share (the experiment index, the redactor's names, the store's parsed records) is in memory; each
child renders and writes its share and sends its results back over a pipe as JSON; the parent renders the
first share itself. Forking is used only where it is safe and cheap: a local prefix and output, and no
thread running in the builder (a fork copies no threads, so a lock one held would stay locked).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from marin.dashboard.app import ROUTERS
from marin.execution.start_method import fork_hazard
from marin.publish.policy import Policy
from marin.publish.public import allowed
from marin.publish.redact import Redactor

T = TypeVar("T")
MIN_SPLIT = 64
"""Fewer pages than this are rendered in the builder itself (a fork costs more than it saves)."""
QUERY_LISTS = frozenset({"runs"})
"""The query parameters of the site's pages (`/compare?runs=A&runs=B`), all repeatable."""


class AppPages:
    """The text of the public app's page at a URL, by a direct call of its route's endpoint (see the module
    docstring); None where the public app would answer anything but 200."""

    def __init__(self, app: Any, policy: Policy) -> None:
        self.app, self.policy = app, policy
        self.dash = app.state.dash
        self.redactor: Redactor = app.state.redactor
        handled = [k for k in app.exception_handlers if isinstance(k, type) and k is not Exception]
        self._handled: tuple[type[BaseException], ...] = tuple(handled)

    def _route(self, scope: dict[str, Any]) -> tuple[Route, dict[str, Any]]:
        """The first route serving `scope` among the dashboard's routers, in the app's order."""
        for route in (r for router in ROUTERS for r in router.routes):
            if isinstance(route, Route):
                match, child = route.matches(scope)
                if match == Match.FULL:
                    return route, child.get("path_params", {})
        raise LookupError(f"no route of the public app serves {scope['path']!r}")

    def get(self, url: str) -> str | None:
        path, _, query = url.partition("?")
        if not allowed(self.dash, self.policy, path, query):
            return None  # the public gate's 404
        scope = {"type": "http", "method": "GET", "path": unquote(path), "root_path": "", "app": self.app,
                 "query_string": query.encode(), "headers": []}
        route, params = self._route(scope)
        args = parse_qs(query, keep_blank_values=True)
        if not set(args) <= QUERY_LISTS:
            raise ValueError(f"{url!r}: a site page has no query parameters but {sorted(QUERY_LISTS)}")
        try:
            response: Response = route.endpoint(request=Request(scope), dash=self.dash, **params, **args)
        except self._handled:
            return None  # the app's exception handlers answer these with an error page
        if response.status_code != 200:
            return None
        return self.redactor.text(bytes(response.body).decode("utf-8", errors="replace"))


def can_fork(local: bool) -> bool:
    """Render workers are forked only from a process with no other thread (not even the engine's own) and no
    runtime known to hold locks across a fork (a started JAX backend, Ray): start_method.fork_hazard."""
    return local and hasattr(os, "fork") and threading.active_count() == 1 and fork_hazard() is None


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _child(fd: int, work: Callable[[Sequence[T]], list[dict[str, Any]]], share: Sequence[T]) -> None:
    payload: dict[str, Any]
    try:
        payload = {"results": work(share)}
    except BaseException:  # reported by the parent, with the child's traceback
        payload = {"error": traceback.format_exc()}
    data = json.dumps(payload).encode()
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(data)
    finally:
        os._exit(0)


def _reap(children: list[tuple[int, int]], *, kill: bool) -> None:
    """Close each child's pipe and wait for it (after SIGKILL when `kill`)."""
    for pid, r in children:
        with contextlib.suppress(OSError):
            os.close(r)
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def render_split(items: Sequence[T], work: Callable[[Sequence[T]], list[dict[str, Any]]], jobs: int,
                 pinned: Callable[[T], bool]) -> list[dict[str, Any]]:
    """`work` over `items` in `jobs` processes (the caller checked :func:`can_fork`); items for which
    `pinned` is true are rendered by this process (their results update its state)."""
    mine = [i for i in items if pinned(i)]
    rest = [i for i in items if not pinned(i)]
    shares = [rest[k::jobs] for k in range(jobs)]
    children: list[tuple[int, int]] = []
    for share in shares[1:]:
        if not share:
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(w, work, share)
        os.close(w)
        children.append((pid, r))
    try:
        results = work(shares[0] + mine)
    except BaseException:
        _reap(children, kill=True)  # no child may outlive a failed build, blocked on a pipe nobody reads
        raise
    errors = []
    for pid, r in children:
        with os.fdopen(r, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        payload: dict[str, Any] = (json.loads(data) if data else
                                   {"error": "a render worker exited without a result"})
        if "error" in payload:
            errors.append(payload["error"])
        else:
            results += payload["results"]
    if errors:
        raise RuntimeError("marin publish: a render worker failed:\n" + "\n".join(errors))
    return results
