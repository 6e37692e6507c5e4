"""Real api.github.com exchanges, recorded by PyGithub's maintainers, served back on loopback.

PyGithub's source distribution ships ``tests/ReplayData/<Class>.<test>.txt``: for each exchange ten lines
(protocol, verb, host, port, path+query, request headers as a Python dict literal, request body or ``None``,
status, response headers as a list of ``(name, value)`` tuples, response body), then a blank line; the
format is written and read by the sdist's ``tests/Framework.py``. :func:`replay_data` reads the sdist of the
installed PyGithub from ``<venv>/cache/pygithub-sdist`` (``dev.py`` downloads it before the tests, which run
without network), downloading it there itself when it is missing, and never unpacks it.

:class:`ReplayGitHub` serves a list of exchanges: a request is answered by the first not yet used exchange
with the same method, path and query (query parameters in any order); its JSON body must equal the
recorded one. Everything that matches nothing is recorded in :attr:`ReplayGitHub.mismatches` with the
nearest recorded request and answered 400 (which the tracker does not retry); :meth:`ReplayGitHub.check`
(called on exit) then fails the test.
``https://api.github.com`` in bodies and ``Link`` headers is rewritten to the server's own base URL, since
PyGithub follows ``url`` fields.
"""

from __future__ import annotations

import ast
import difflib
import importlib.metadata
import json
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

RECORDED_API = "https://api.github.com"
DROPPED_HEADERS = {"content-length", "transfer-encoding", "content-encoding", "connection", "status"}


@dataclass
class Exchange:
    """One recorded request and GitHub's answer to it."""

    source: str  # "<file>:<line>" of the exchange's first line
    method: str
    path: str
    query: tuple[tuple[str, str], ...]  # sorted
    request_body: str | None
    status: int
    headers: list[tuple[str, str]]
    body: str

    @property
    def target(self) -> str:
        query = urllib.parse.urlencode(self.query)
        return f"{self.method} {self.path}{'?' + query if query else ''}"

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def split_target(url: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    parts = urllib.parse.urlsplit(url)
    return parts.path, tuple(sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))


def parse_replay(text: str, name: str) -> list[Exchange]:
    """The exchanges of one ReplayData file (literals read with ast.literal_eval, never eval).

    A streamed answer (a file download, recorded as base64 lines up to a blank one) is refused with a
    ValueError naming the line: the tracker never receives one."""
    lines = text.split("\n")
    out: list[Exchange] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if i + 10 > len(lines):
            raise ValueError(f"{name}:{i + 1}: truncated exchange ({len(lines) - i} lines, 10 expected)")
        protocol, method, _host, _port, url, _req_headers, req_body, status, headers, body = (
            line.strip() for line in lines[i:i + 10])
        if protocol not in ("http", "https"):
            raise ValueError(f"{name}:{i + 1}: expected a protocol line, found {protocol[:60]!r}")
        path, query = split_target(url)
        out.append(Exchange(f"{name}:{i + 1}", method, path, query, None if req_body == "None" else req_body,
                            int(status), [(str(k), str(v)) for k, v in ast.literal_eval(headers)], body))
        i += 10
    return out


def sdist_dir() -> Path:
    return Path(sys.prefix) / "cache" / "pygithub-sdist"


@cache
def _sdist() -> Path:
    version = importlib.metadata.version("PyGithub")
    path = sdist_dir() / f"pygithub-{version}.tar.gz"
    if path.exists():
        return path
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--retries", "1", "--no-binary", ":all:",
           "--no-deps", f"PyGithub=={version}", "-d", str(sdist_dir())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not path.exists():
        pytest.fail(f"PyGithub's sdist (its recorded GitHub exchanges) is not at {path} and downloading it "
                    f"failed ({done.stderr.strip()[-300:] or 'no error text'}); run `python3 dev.py install` "
                    f"or `{' '.join(cmd)}` with network", pytrace=False)
    return path


@cache
def _replay_files() -> dict[str, str]:
    with tarfile.open(_sdist(), "r:gz") as tar:
        return {Path(m.name).name.removesuffix(".txt"): tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile() and "/tests/ReplayData/" in m.name}


def replay_data(*names: str) -> list[Exchange]:
    """The exchanges of the named recordings (``Class.test``), in order."""
    files = _replay_files()
    out: list[Exchange] = []
    for name in names:
        if name not in files:
            near = difflib.get_close_matches(name, files, n=3)
            pytest.fail(f"no recording {name!r} in PyGithub's ReplayData (nearest: {near})", pytrace=False)
        out.extend(parse_replay(files[name], name))
    return out


@dataclass
class Served:
    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body: Any
    authorization: str | None
    exchange: Exchange | None


@dataclass
class ReplayGitHub:
    """Serves recorded exchanges on 127.0.0.1; use as a context manager."""

    exchanges: list[Exchange]
    served: list[Served] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="replay-github",
                                        daemon=True)

    def __enter__(self) -> ReplayGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if exc[0] is None:
            self.check()

    def check(self) -> None:
        """Fail when a request matched no recording."""
        if self.mismatches:
            pytest.fail("requests GitHub was not recorded answering:\n" + "\n".join(self.mismatches),
                        pytrace=False)

    def rewrite(self, text: str) -> str:
        return text.replace(RECORDED_API, self.base_url)

    def targets(self) -> list[str]:
        """``METHOD path?query`` of every request served, in order."""
        return [f"{s.method} {s.path}" + ("?" + urllib.parse.urlencode(s.query) if s.query else "")
                for s in self.served]

    def _match(self, method: str, path: str, query: tuple[tuple[str, str], ...],
               body: Any) -> Exchange | str:
        candidates = [(i, x) for i, x in enumerate(self.exchanges) if i not in self._used
                      and (x.method, x.path, x.query) == (method, path, query)]
        asked = f"{method} {path}{'?' + urllib.parse.urlencode(query) if query else ''}"
        if not candidates:
            recorded = [x.target for i, x in enumerate(self.exchanges) if i not in self._used]
            near = difflib.get_close_matches(asked, recorded, n=1, cutoff=0.0)
            return f"  {asked}: no unused recording; nearest recorded request: {near[0] if near else 'none'}"
        index, exchange = candidates[0]
        recorded_body = json.loads(exchange.request_body) if exchange.request_body else None
        if body != recorded_body:
            return (f"  {asked}: body {json.dumps(body)} differs from the body GitHub accepted "
                    f"({exchange.source}): {exchange.request_body}")
        self._used.add(index)
        return exchange

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                path, query = split_target(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with server._lock:
                    found = server._match(self.command, path, query, body)
                    exchange = found if isinstance(found, Exchange) else None
                    server.served.append(Served(self.command, path, query, body,
                                                self.headers.get("Authorization"), exchange))
                    if exchange is None:
                        server.mismatches.append(str(found))
                if exchange is None:
                    data = json.dumps({"message": f"replay: {found}"}).encode()
                    status, headers = 400, [("Content-Type", "application/json")]  # not retried
                else:
                    data = server.rewrite(exchange.body).encode()
                    status = exchange.status
                    headers = [(k, server.rewrite(v)) for k, v in exchange.headers
                               if k.lower() not in DROPPED_HEADERS]
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        return Handler
