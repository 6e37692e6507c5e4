"""The read-only public view of a prefix: what the policy shows, redacted. Shared by
`marin dashboard --public` (through :class:`PublicGate`) and `marin publish` (which renders its pages
through the same app, so the server and the site agree byte for byte on what is visible).

- :class:`PublicIndex`: the dashboard's experiment index reduced to the experiments the policy selects, so
  every page built on it (list, catalogue, predictions, alerts, compare, baselines) sees only those;
- :class:`RedactingStore`: the dashboard's store whose parsed records pass through :meth:`Redactor.obj`
  (secrets and environments masked by key; users and hosts learnt as private names);
- :func:`allowed`: the URL rules (published pages and their JSON; never files, issues or the API docs;
  `/raw` only for the policy's globs, logs only when `[raw] logs = true`);
- :class:`PublicGate`: ASGI middleware refusing what `allowed` refuses (404, so hidden names are not
  confirmed), redacting every text response and rate-limiting each client (token bucket).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marin.dashboard.alerts import AlertIndex
from marin.dashboard.context import Dashboard
from marin.dashboard.experiments import ExperimentIndex, IssueLinker, step_rel
from marin.dashboard.issues import IssueReader
from marin.dashboard.metrics import MetricsReader
from marin.dashboard.store import JsonlRows, PrefixStore
from marin.publish.policy import Policy
from marin.publish.redact import Redactor
from marin.status.manifest import EXPERIMENTS_DIR

_REF = re.compile(r"^(?P<repo>[^#\s]+)#(?P<n>\d+)$")
_NAME_KEYS = ("user", "host", "author", "hostname", "username")


def _names_of(record: dict[str, Any]) -> list[str]:
    return [str(record[k]) for k in _NAME_KEYS if isinstance(record.get(k), str)]


class RedactingStore(PrefixStore):
    """A PrefixStore whose parsed JSON and JSONL records are redacted (and teach the redactor names), and
    that cannot see the steps only hidden experiments name (a step page's "previous version" of a public
    step is never a hidden one)."""

    redactor: Redactor
    hidden_steps: frozenset[str] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._names_in: dict[str, list[str]] = {}

    def hides(self, rel: str) -> bool:
        rel = rel.strip("/")
        while rel:
            if rel in self.hidden_steps:
                return True
            rel = posixpath.dirname(rel)
        return False

    def read_json(self, rel: str, *, info: dict[str, Any] | None = None) -> Any:
        return None if self.hides(rel) else super().read_json(rel, info=info)

    def read_json_many(self, rels: Sequence[str], parents: Sequence[str]) -> dict[str, Any]:
        shown = [(r, p) for r, p in zip(rels, parents, strict=True) if not self.hides(r)]
        out = super().read_json_many([r for r, _ in shown], [p for _, p in shown])
        return {r: out.get(r) for r in rels}  # a hidden file reads as absent, as read_json says

    def read_jsonl(self, rel: str, max_bytes: int = 4 << 20) -> list[dict[str, Any]]:
        return [] if self.hides(rel) else super().read_jsonl(rel, max_bytes)

    def names(self, rel: str) -> list[str]:
        if self.hides(rel):
            return []
        base = rel.strip("/")
        return [n for n in super().names(rel) if not self.hides(f"{base}/{n}" if base else n)]

    def ls(self, rel: str) -> list[dict[str, Any]]:
        if self.hides(rel):
            return []
        base = rel.strip("/")
        return [e for e in super().ls(rel) if not self.hides(f"{base}/{e['name']}" if base else e["name"])]

    def listing(self, rel: str, tails: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in super().listing(rel, tails).items() if not self.hides(k)}

    def _learn(self, value: Any) -> list[str]:
        """Teach the redactor the names `value` (a parsed record) carries; they are returned."""
        if not isinstance(value, dict):
            return []
        prov = value.get("provenance")
        names = _names_of(value) + (_names_of(prov) if isinstance(prov, dict) else [])
        self.redactor.add_names(names)
        return names

    def names_in(self, rel: str) -> list[str]:
        """The private names the record at `rel` carries as written (its parsed value is redacted: a name
        read from it would be a pseudonym), reading it if it was not read yet."""
        self.read_json(rel)
        return self._names_in.get(self.full(rel), [])

    def _parse_record(self, full: str, raw: bytes) -> Any:  # read_json and read_json_many alike
        value = super()._parse_record(full, raw)
        self._names_in[full] = self._learn(value)
        return self.redactor.obj(value)

    def _parse_jsonl(self, full: str, info: dict[str, Any], max_bytes: int) -> JsonlRows:
        rows = super()._parse_jsonl(full, info, max_bytes)
        for r in rows:
            self._learn(r)
        return JsonlRows([self.redactor.obj(r) for r in rows], rows.skipped)


class PublicIndex(ExperimentIndex):
    """The experiment index with only the experiments the policy selects."""

    def __init__(self, store: PrefixStore, issue_link: IssueLinker, policy: Policy, issues: IssueReader,
                 redactor: Redactor) -> None:
        super().__init__(store, issue_link)
        self.policy, self.issues, self.redactor = policy, issues, redactor
        self.hidden: list[str] = []
        self._step_rels: set[str] = set()

    def _labels(self, manifest: dict[str, Any]) -> tuple[str, ...]:
        m = _REF.match(str(manifest.get("issue") or ""))
        if not m or not self.issues.available():
            return ()
        issue = self.issues.get(m["repo"], int(m["n"]))
        return tuple(issue.labels) if issue is not None else ()

    def refresh(self) -> None:
        before = self._refreshed
        super().refresh()
        if self._refreshed == before:
            return
        with self._lock:
            for _, manifest, _ in self._manifests.values():
                self.redactor.add_names(_names_of(manifest))
                issue = str(manifest.get("issue") or "")
                if self.redactor.anonymous and "/" in issue:
                    self.redactor.add_names(issue.split("#")[0].split("/"))
            hidden = [k for k, (_, m, _) in self._manifests.items()
                      if not self.policy.selects(k, m, self._labels(m))]
            hidden_rels = {step_rel(self.store, e) for k in hidden
                           for e in self._manifests[k][1].get("steps") or [] if isinstance(e, dict)}
            for k in hidden:
                del self._manifests[k]
            self.hidden = sorted(set(self.hidden) | set(hidden))
            self._index_steps()
            self._step_rels = {step_rel(self.store, e) for e in self._entries.values()}
            if isinstance(self.store, RedactingStore):
                self.store.hidden_steps = frozenset(hidden_rels - self._step_rels)

    def issue_of(self, key: str) -> tuple[Any, tuple[str, ...]]:
        """What an experiment's pages show of its issue (the link, local or not) and its labels."""
        found = self.manifest(key)
        ref = str(found[0].get("issue") or "") if found else ""
        link = self.issue_link(ref) if ref else None
        return (link.model_dump(mode="json") if link else None,
                self._labels(found[0]) if found else ())

    def public_steps(self) -> set[str]:
        self.refresh()
        return self._step_rels


def open_public(prefix: str, policy: Policy, *, anonymous: bool = False, cache_ttl: float | None = None,
                storage_options: dict[str, Any] | None = None) -> tuple[Dashboard, Redactor]:
    """The dashboard readers for the public view of `prefix`, and the redactor they share."""
    store = RedactingStore(prefix, ttl=cache_ttl, storage_options=storage_options)
    roots = {prefix, store.root, "file://" + store.root}
    redactor = Redactor(roots, policy.redact.names, public_repos=policy.redact.public_repos,
                        anonymous=anonymous, salt=policy.redact.pseudonym_salt)
    store.redactor = redactor
    issues = IssueReader(store)
    experiments = PublicIndex(store, issues.link, policy, issues, redactor)
    dash = Dashboard(prefix=prefix, store=store, experiments=experiments, metrics=MetricsReader(store),
                     issues=issues, alerts=AlertIndex(store, experiments),
                     visible=lambda rel: rel.startswith(EXPERIMENTS_DIR + "/") or any(
                         p in experiments.public_steps() for p in _parents(rel)))
    return dash, redactor


def _parents(rel: str) -> list[str]:
    out, rel = [], rel.strip("/")
    while rel:
        out.append(rel)
        rel = posixpath.dirname(rel)
    return out


_OPEN = {"/", "/catalogue", "/predictions", "/alerts", "/api/experiments", "/api/catalogue",
         "/api/catalogue.md", "/api/alerts", "/api/predictions"}
_STEP_ROUTES = ("/steps/", "/api/steps/", "/api/metrics/", "/api/alerts/")


def allowed(dash: Dashboard, policy: Policy, path: str, query: str) -> bool:
    """Whether the public view serves `path?query` (see the module docstring)."""
    index = dash.experiments
    assert isinstance(index, PublicIndex)
    path = unquote(path)
    if path.startswith("/static/") or path in _OPEN:
        return True
    for route in ("/experiments/", "/api/experiments/"):
        if path.startswith(route):
            key = path[len(route):].removesuffix("/notebook")
            return index.manifest(key) is not None
    steps = index.public_steps()
    for route in _STEP_ROUTES:
        if path.startswith(route):
            return path[len(route):].strip("/") in steps
    if path.startswith("/api/logs/"):
        return policy.raw.logs and path[len("/api/logs/"):].strip("/") in steps
    if path.startswith("/raw/"):
        rel = path[len("/raw/"):].strip("/")
        return policy.raw.allows(rel) and any(rel.startswith(s + "/") for s in steps)
    if path in ("/compare", "/api/compare"):
        runs = parse_qs(query).get("runs", [])
        return all(index.manifest(r) is not None or r in steps for r in runs)
    return False


class PublicGate:
    """ASGI middleware of the public mode: URL rules, redaction of every text body, per-client rate limit."""

    def __init__(self, app: ASGIApp, dash: Dashboard, policy: Policy, redactor: Redactor,
                 rate: float = 10.0, burst: float = 40.0) -> None:
        self.app, self.dash, self.policy, self.redactor = app, dash, policy, redactor
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _take(self, client: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            ok = tokens >= 1.0
            self._buckets[client] = (tokens - 1.0 if ok else tokens, now)
        return ok

    async def _reply(self, send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("?", 0))[0]
        if not self._take(client):
            await self._reply(send, 429, "too many requests: this public view is rate-limited per client")
            return
        query = scope.get("query_string", b"").decode("latin-1")
        if not allowed(self.dash, self.policy, scope["path"], query):
            await self._reply(send, 404, "not published")
            return
        await self.app(scope, receive, self._redacting(send))

    def _redacting(self, send: Send) -> Send:
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            with contextlib.suppress(UnicodeDecodeError):
                body = self.redactor.text(body.decode("utf-8")).encode("utf-8")
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        return wrapped
