"""Rendering the site's pages: the public app called in-process, and a full build split over forked workers.

:class:`AppPages` sends each page's GET straight into the public app (ASGI) on one event loop kept for the
whole build: the same middleware (PublicGate's URL rules and redaction), routers and templates as
`marin dashboard --public`, without an HTTP client, a socket or a thread per request (Starlette's
TestClient starts a portal thread for every request: about 5 ms per page, a third of the build).

:func:`render_split` renders a list of pages in `jobs` processes forked from the builder, after everything
the pages share (the experiment index, the redactor's names, the store's parsed records) is in memory; each
child renders and writes its share and sends its results back over a pipe as JSON; the parent renders the
first share itself. Forking is used only where it is safe and cheap: a local prefix and output, and no
thread running in the builder (a fork copies no threads, so a lock one held would stay locked).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import signal
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from starlette.types import ASGIApp, Message

from marin.execution.start_method import fork_hazard

T = TypeVar("T")
MIN_SPLIT = 64
"""Fewer pages than this are rendered in the builder itself (a fork costs more than it saves)."""


_INLINE = contextvars.ContextVar("marin_publish_inline", default=False)


def _inline_or(threaded: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def run_in_threadpool(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _INLINE.get():
            return func(*args, **kwargs)
        return await threaded(func, *args, **kwargs)

    run_in_threadpool.marin_inline = True  # type: ignore[attr-defined]
    return run_in_threadpool


def inline() -> None:
    """Let :class:`AppPages` requests call the app's sync endpoints and dependencies in the event loop's
    thread: FastAPI's `run_in_threadpool` (in the two modules that call it) is wrapped by one that does so
    only inside an AppPages request (a context variable its request task sets); every other request, a
    dashboard served by the same process included, still gets a worker thread. Idempotent; where FastAPI
    no longer has that name, requests keep their threads (slower, the same pages)."""
    import fastapi.dependencies.utils
    import fastapi.routing

    for module in (fastapi.routing, fastapi.dependencies.utils):
        current = getattr(module, "run_in_threadpool", None)
        if current is not None and not getattr(current, "marin_inline", False):
            module.run_in_threadpool = _inline_or(current)  # type: ignore[attr-defined]


class AppPages:
    """GET requests into an ASGI app in this thread's own event loop; (status, text) per URL."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        inline()

    def get(self, url: str) -> tuple[int, str]:
        if self._loop is None or self._pid != os.getpid():
            # one loop per process: a forked worker must not share its parent's loop (their wake-up pipe is
            # one socket, so each would swallow the other's wake-ups)
            self._loop, self._pid = asyncio.new_event_loop(), os.getpid()
        return self._loop.run_until_complete(self._get(url))

    async def _get(self, url: str) -> tuple[int, str]:
        _INLINE.set(True)  # this request's task only (run_until_complete wraps it in its own task)
        path, _, query = url.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": unquote(path), "raw_path": path.encode(), "root_path": "",
                 "query_string": query.encode(), "headers": [(b"host", b"testserver")],
                 "client": ("127.0.0.1", 0), "server": ("testserver", 80)}
        status, body = 0, bytearray()

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, body.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._loop is not None and self._pid == os.getpid():
            self._loop.close()
        self._loop = None


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
