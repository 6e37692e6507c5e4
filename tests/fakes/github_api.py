"""A small GitHub REST API server on loopback, speaking the subset PyGithub uses for issues.

Endpoints (all under the server's own base URL, which every ``url``/``html_url`` field is built from, since
PyGithub follows those fields): ``GET /user``, ``GET /repos/{o}/{r}``, ``GET|POST /repos/{o}/{r}/issues``,
``GET|PATCH /repos/{o}/{r}/issues/{n}``, ``GET|POST .../issues/{n}/comments`` (paginated with ``Link``
headers), ``GET|PATCH|DELETE .../issues/comments/{id}``, ``GET|POST .../issues/{n}/labels`` (POST takes a bare
JSON list or ``{"labels": [...]}``) and ``DELETE .../issues/{n}/labels/{name}``.

Faults are queued with :meth:`FakeGitHub.inject` and consumed by the next matching requests: an HTTP status
with headers (5xx, 403/429 rate limits with ``X-RateLimit-Reset``/``Retry-After``), ``drop`` (close the
connection without answering, before handling) or ``drop_after`` (handle the request, then close without
answering: the client cannot know it succeeded). Every request is logged in :attr:`FakeGitHub.requests`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    authorization: str | None
    answered: int | None = None  # HTTP status sent, None when the connection was dropped


@dataclass
class Fault:
    kind: str  # "status", "drop" or "drop_after"
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "Server Error"
    method: str | None = None  # only requests with this method ...
    path_regex: str | None = None  # ... and a path matching this regex consume the fault


class _Handled(Exception):
    def __init__(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.payload, self.headers = status, payload, headers or {}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGitHub:
    """The server and its state; use as a context manager (starts on a random port of 127.0.0.1)."""

    def __init__(self, token: str = "ghp_faketoken0123456789abcdef", login: str = "marin-bot") -> None:
        self.token, self.login = token, login
        self.repos: dict[str, dict[str, Any]] = {}
        self.comments: dict[int, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self._next_comment = 1000
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-github",
                                        daemon=True)

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- test-facing helpers --------------------------------------------------------------------------------

    def add_repo(self, full_name: str) -> None:
        with self._lock:
            self.repos.setdefault(full_name, {"issues": {}, "next": 1})

    def add_issue(self, full_name: str, title: str, body: str = "", labels: tuple[str, ...] = ()) -> int:
        with self._lock:
            self.add_repo(full_name)
            return self._create_issue(full_name,
                                      {"title": title, "body": body, "labels": list(labels)})["number"]

    def inject(self, fault: Fault, times: int = 1) -> None:
        with self._lock:
            self.faults.extend(Fault(**{**fault.__dict__}) for _ in range(times))

    def issue_comments(self, full_name: str, number: int) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in sorted(self.comments.values(), key=lambda c: c["id"])
                    if c["_repo"] == full_name and c["_number"] == number]

    def labels(self, full_name: str, number: int) -> list[str]:
        with self._lock:
            return sorted(self.repos[full_name]["issues"][number]["_labels"])

    def count(self, method: str | None = None, path_regex: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if (method is None or r.method == method)
                       and (path_regex is None or re.search(path_regex, r.path)))

    # -- JSON shapes ---------------------------------------------------------------------------------------

    def _user(self) -> dict[str, Any]:
        return {"login": self.login, "id": 1, "type": "User", "url": f"{self.base_url}/users/{self.login}",
                "html_url": f"{self.base_url}/{self.login}"}

    def _repo_json(self, full_name: str) -> dict[str, Any]:
        owner, name = full_name.split("/")
        return {"id": abs(hash(full_name)) % 10**6, "name": name, "full_name": full_name, "private": False,
                "owner": {**self._user(), "login": owner}, "url": f"{self.base_url}/repos/{full_name}",
                "html_url": f"{self.base_url}/{full_name}", "has_issues": True}

    def _label_json(self, full_name: str, name: str) -> dict[str, Any]:
        quoted = urllib.parse.quote(name, safe="")
        return {"id": abs(hash(name)) % 10**6, "name": name, "color": "ededed", "default": False,
                "url": f"{self.base_url}/repos/{full_name}/labels/{quoted}"}

    def _issue_json(self, full_name: str, issue: dict[str, Any]) -> dict[str, Any]:
        api = f"{self.base_url}/repos/{full_name}/issues/{issue['number']}"
        public = {k: v for k, v in issue.items() if not k.startswith("_")}
        return {**public, "url": api, "html_url": f"{self.base_url}/{full_name}/issues/{issue['number']}",
                "comments_url": f"{api}/comments", "labels_url": f"{api}/labels{{/name}}",
                "repository_url": f"{self.base_url}/repos/{full_name}", "user": self._user(),
                "labels": [self._label_json(full_name, x) for x in sorted(issue["_labels"])],
                "comments": len(self.issue_comments(full_name, issue["number"])), "assignees": [],
                "created_at": _iso(issue["_created"]), "updated_at": _iso(issue["_updated"])}

    def _comment_json(self, comment: dict[str, Any]) -> dict[str, Any]:
        full_name, number = comment["_repo"], comment["_number"]
        public = {k: v for k, v in comment.items() if not k.startswith("_")}
        return {**public, "url": f"{self.base_url}/repos/{full_name}/issues/comments/{comment['id']}",
                "html_url": f"{self.base_url}/{full_name}/issues/{number}#issuecomment-{comment['id']}",
                "issue_url": f"{self.base_url}/repos/{full_name}/issues/{number}", "user": self._user(),
                "created_at": _iso(comment["_created"]), "updated_at": _iso(comment["_updated"])}

    # -- state changes ---------------------------------------------------------------------------------------

    def _create_issue(self, full_name: str, body: dict[str, Any]) -> dict[str, Any]:
        repo = self.repos[full_name]
        number = repo["next"]
        repo["next"] += 1
        now = time.time()
        repo["issues"][number] = {"id": number + 50_000, "number": number, "title": body.get("title", ""),
                                  "body": body.get("body"), "state": "open",
                                  "_labels": set(body.get("labels", [])),
                                  "_created": now, "_updated": now}
        return repo["issues"][number]

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if path == "/user" and method == "GET":
            return 200, self._user()
        m = re.fullmatch(r"/repos/([^/]+/[^/]+)(/.*)?", path)
        if not m or m.group(1) not in self.repos:
            raise _Handled(404, {"message": "Not Found"})
        full_name, rest = m.group(1), m.group(2) or ""
        repo = self.repos[full_name]

        def issue_of(n: str) -> dict[str, Any]:
            if int(n) not in repo["issues"]:
                raise _Handled(404, {"message": "Not Found"})
            return repo["issues"][int(n)]

        if rest == "" and method == "GET":
            return 200, self._repo_json(full_name)
        if rest == "/issues" and method == "GET":
            state = query.get("state", ["open"])[0]
            found = [i for i in sorted(repo["issues"].values(), key=lambda i: -i["number"])
                     if state == "all" or i["state"] == state]
            return 200, [self._issue_json(full_name, i) for i in found]
        if rest == "/issues" and method == "POST":
            if not isinstance(body, dict) or not body.get("title"):
                raise _Handled(422, {"message": "Validation Failed"})
            return 201, self._issue_json(full_name, self._create_issue(full_name, body))
        if m2 := re.fullmatch(r"/issues/comments/(\d+)", rest):
            comment = self.comments.get(int(m2.group(1)))
            if comment is None or comment["_repo"] != full_name:
                raise _Handled(404, {"message": "Not Found"})
            if method == "GET":
                return 200, self._comment_json(comment)
            if method == "PATCH":
                comment["body"], comment["_updated"] = body["body"], time.time()
                return 200, self._comment_json(comment)
            if method == "DELETE":
                del self.comments[comment["id"]]
                return 204, None
        if m2 := re.fullmatch(r"/issues/(\d+)", rest):
            issue = issue_of(m2.group(1))
            if method == "GET":
                return 200, self._issue_json(full_name, issue)
            if method == "PATCH":
                for key in ("title", "body", "state"):
                    if key in body:
                        issue[key] = body[key]
                if "labels" in body:
                    issue["_labels"] = set(body["labels"])
                issue["_updated"] = time.time()
                return 200, self._issue_json(full_name, issue)
        if m2 := re.fullmatch(r"/issues/(\d+)/comments", rest):
            issue = issue_of(m2.group(1))
            if method == "GET":
                return 200, [self._comment_json(c) for c in self.issue_comments(full_name, issue["number"])]
            if method == "POST":
                self._next_comment += 1
                now = time.time()
                comment = {"id": self._next_comment, "body": body["body"], "_repo": full_name,
                           "_number": issue["number"], "_created": now, "_updated": now}
                self.comments[comment["id"]] = comment
                return 201, self._comment_json(comment)
        if m2 := re.fullmatch(r"/issues/(\d+)/labels", rest):
            issue = issue_of(m2.group(1))
            if method == "POST":
                names = body["labels"] if isinstance(body, dict) else body
                if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                    raise _Handled(422, {"message": "Invalid request: labels must be a list of strings"})
                issue["_labels"].update(names)
            if method in ("GET", "POST"):
                return 200, [self._label_json(full_name, x) for x in sorted(issue["_labels"])]
        if (m2 := re.fullmatch(r"/issues/(\d+)/labels/([^/]+)", rest)) and method == "DELETE":
            issue = issue_of(m2.group(1))
            name = urllib.parse.unquote(m2.group(2))
            if name not in issue["_labels"]:
                raise _Handled(404, {"message": "Label does not exist"})
            issue["_labels"].discard(name)
            return 200, [self._label_json(full_name, x) for x in sorted(issue["_labels"])]
        raise _Handled(404, {"message": f"Not Found (fake server has no {method} {rest or '/'})"})

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for i, fault in enumerate(self.faults):
            if (fault.method is None or fault.method == method) and (
                    fault.path_regex is None or re.search(fault.path_regex, path)):
                return self.faults.pop(i)
        return None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def _handle(self, method: str) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                entry = Request(method, parsed.path, urllib.parse.parse_qs(parsed.query), body,
                                self.headers.get("Authorization"))
                with server._lock:
                    server.requests.append(entry)
                    fault = server._take_fault(method, parsed.path)
                    if fault is not None and fault.kind == "drop":
                        self.close_connection = True
                        return
                    if fault is not None and fault.kind == "status":
                        status, payload = fault.status, {"message": fault.message}
                        headers = dict(fault.headers)
                    elif self.headers.get("Authorization") != f"token {server.token}":
                        status, payload, headers = 401, {"message": "Bad credentials"}, {}
                    else:
                        headers = {}
                        try:
                            status, payload = server._route(method, parsed.path, entry.query, body)
                        except _Handled as handled:
                            status, payload, headers = handled.status, handled.payload, handled.headers
                    if fault is not None and fault.kind == "drop_after":
                        self.close_connection = True
                        return
                    status, payload, headers = server._paginate(status, payload, headers, parsed)
                    entry.answered = status
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                if data:  # GitHub's 204s carry no Content-Type
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                # GitHub sends an ETag on every answer, weak (W/) on reads, of the body it sends
                weak = "W/" if method == "GET" else ""
                self.send_header("ETag", f'{weak}"{hashlib.sha256(data).hexdigest()}"')
                defaults = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999",
                            "X-RateLimit-Reset": str(int(time.time()) + 3600)}
                for key, value in {**defaults, **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

            def do_PUT(self) -> None:
                self._handle("PUT")

        return Handler

    def _paginate(self, status: int, payload: Any, headers: dict[str, str],
                  parsed: urllib.parse.SplitResult) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(payload, list) or status != 200:
            return status, payload, headers
        query = urllib.parse.parse_qs(parsed.query)
        per_page = int(query.get("per_page", ["30"])[0])
        page = int(query.get("page", ["1"])[0])
        chunk = payload[(page - 1) * per_page: page * per_page]
        last = max(1, -(-len(payload) // per_page))
        if last == 1:
            return status, chunk, headers

        def link(n: int, rel: str) -> str:  # GitHub adds only `page` to the query the client sent
            query = urllib.parse.urlencode({**plain, "page": n})
            return f'<{self.base_url}{parsed.path}?{query}>; rel="{rel}"'

        plain = {k: v[0] for k, v in query.items() if k != "page"}
        # GitHub's order: next, last, first, prev; the first page has no first/prev, the last no next/last
        rels = ([link(page + 1, "next"), link(last, "last")] if page < last else []) + (
            [link(1, "first"), link(page - 1, "prev")] if page > 1 else [])
        return status, chunk, {**headers, "Link": ", ".join(rels)}
