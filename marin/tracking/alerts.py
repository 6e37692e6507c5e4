"""Alerts on the issue: one comment per firing, one per resolution, never twice (docs/health.md).

:class:`AlertPoster` is driven by the issue publisher (marin/tracking/publisher.py): at every flush, and
between flushes while steps run, it reads the alert events of the run's steps (marin/status/alerts.py) and
posts what is new:

- a *fired* alert (not silenced): a comment saying what, where (step, attempt, host, output path), since when,
  the values, and a link to the step's dashboard page (its charts);
- its *resolution* (the condition cleared, or the attempt ended; a step that ended while an alert was still
  open in its file, e.g. after a crash, gets "the attempt ended (FAILED) with this alert open");
- a *failed risk point*, with the experiment's plan (passed ones are shown on the dashboard, not posted);
- the engine's own "the watcher is blind" (a running step whose heartbeat went stale) and its recovery.

Debounce comes from the events themselves: a rule in violation for 1,000 steps is one fired event and one
resolution, so one comment each. Nothing is posted twice across restarts: every comment starts with a marker
``<!-- marin-alert:{hash8}:{id}:{phase} -->``, what was posted is recorded in the step's
``.marin/alerts-posted.json`` (by issue), and the first post of a publisher lists the issue's comments once
for markers (a crash between posting and recording cannot duplicate).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

from marin import jsonio
from marin.errors import CorruptFileError
from marin.status.alerts import BLIND_RULE, FIRED, RISK_FAILED, Alert, blind_alert, read_alerts
from marin.status.publisher import RunView, StepView
from marin.storage.base import Storage
from marin.storage.fs import storage_for
from marin.tracking.base import Tracker

POSTED_FILE = ".marin/alerts-posted.json"
MARKER = "<!-- marin-alert:{key} -->"
ICONS = {"critical": "🔴", "warning": "🟠", "info": "🔵"}


@dataclasses.dataclass(frozen=True)
class Post:
    """One comment to make: its marker key, the step and the text."""

    key: str
    step: StepView
    body: str


def _utc(ts: float | None) -> str:
    if ts is None:
        return "?"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _md(text: Any) -> str:
    """Text from a step's files, safe inside a Markdown comment (no raw HTML, no code-span breaks)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def _values(values: Mapping[str, Any]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.5g}"
        if isinstance(v, list) and len(v) > 8:
            return json.dumps(v[:8])[:-1] + ", ...]"
        return json.dumps(v) if not isinstance(v, str) else v
    return " · ".join(f"`{_md(k)}` {_md(one(v))}" for k, v in values.items() if v is not None) or "—"


def _read_posted(storage: Storage, path: str) -> Any:
    """The step's alerts-posted.json, or {} when it is absent or not JSON (as if nothing had been posted)."""
    try:
        data = jsonio.read_json(storage, path)
    except CorruptFileError:
        return {}
    return {} if data is None else data


class AlertPoster:
    """Posts the alert events of a run's steps to issue ``number`` (see the module docstring)."""

    def __init__(self, tracker: Tracker, number: int, *, dashboard_url: str | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.tracker, self.number = tracker, number
        self.issue_ref = f"{tracker.repo}#{number}"
        self.dashboard_url = dashboard_url.rstrip("/") if dashboard_url else None
        self.clock = clock or time.time
        self._on_issue: dict[str, int] | None = None  # markers found on the issue (listed once)
        self._posted: dict[str, dict[str, int]] = {}  # output path -> key -> comment id
        self._finished: set[str] = set()  # steps polled once after their attempt ended
        self.posted_count = 0

    # -- what to post ----------------------------------------------------------------------------------------

    def plan(self, run: RunView) -> list[Post]:
        """Every comment the run's steps call for that is not on the issue yet."""
        out: list[Post] = []
        for step in run.steps:
            running = step.status == "RUNNING"
            ran_here = step.started is not None and step.started >= run.started - 1.0
            if not running and (not ran_here or step.output_path in self._finished):
                continue
            out.extend(self._step_posts(run, step, running))
        return out

    def _step_posts(self, run: RunView, step: StepView, running: bool) -> list[Post]:
        alerts, watch = read_alerts(step.output_path)
        if not alerts and watch is None:
            return []
        posted = self._posted_for(step)
        wanted: list[tuple[str, str]] = []
        for a in alerts:
            if a.silenced or a.outcome not in (FIRED, RISK_FAILED):
                continue
            fired_key = self._key(step, a.id, "fired")
            wanted.append((fired_key, self._fired_body(run, step, a)))
            if a.outcome == FIRED and a.resolved is not None:
                wanted.append((self._key(step, a.id, "resolved"),
                               self._resolved_body(step, a, str(a.resolved.get("reason") or "cleared"),
                                                   a.resolved.get("step"), a.resolved.get("time"))))
            elif a.outcome == FIRED and not running:
                wanted.append((self._key(step, a.id, "resolved"), self._resolved_body(
                    step, a, f"the attempt ended ({step.status}) with this alert open", a.step, step.ended)))
        wanted.extend(self._blind_posts(run, step, watch, running, posted))
        return [Post(k, step, body) for k, body in wanted if k not in posted and not self._seen(k)]

    def _blind_posts(self, run: RunView, step: StepView, watch: Mapping[str, Any] | None, running: bool,
                     posted: Mapping[str, int]) -> list[tuple[str, str]]:
        now = self.clock()
        blind = blind_alert(watch, running=running, now=now)
        out = []
        if blind is not None:
            out.append((self._key(step, blind.id, "fired"), self._fired_body(run, step, blind)))
        for key in posted:
            alert_id = key.split(":", 1)[1].rsplit(":", 1)[0]
            still = blind is not None and blind.id == alert_id
            if (f":{BLIND_RULE}:" in key and key.endswith(":fired") and not still
                    and self._key(step, alert_id, "resolved") not in posted):
                reason = ("the heartbeat resumed" if running
                          else f"the step is no longer running ({step.status})")
                stub = Alert(alert_id, BLIND_RULE, "engine", "critical", "", {}, None, None, None, None, None,
                             None, False, FIRED)
                out.append((self._key(step, alert_id, "resolved"),
                            self._resolved_body(step, stub, reason, (watch or {}).get("step"), now)))
        return out

    # -- posting ---------------------------------------------------------------------------------------------

    def due(self, run: RunView) -> bool:
        return bool(self.plan(run))

    def poll(self, run: RunView) -> int:
        """Post what is new for ``run``'s steps; returns the number of comments made."""
        posts = self.plan(run)
        for post in posts:
            if self._seen(post.key):
                continue
            comment = self.tracker.create_comment(self.number, f"{MARKER.format(key=post.key)}\n{post.body}")
            self._record(post.step, post.key, comment.id)
            self.posted_count += 1
        for step in run.steps:
            if step.status != "RUNNING" and step.started is not None and step.started >= run.started - 1.0:
                self._finished.add(step.output_path)
        return len(posts)

    def _key(self, step: StepView, alert_id: str, phase: str) -> str:
        return f"{step.hash[:8]}:{alert_id}:{phase}"

    def _seen(self, key: str) -> bool:
        if self._on_issue is None:
            self._on_issue = {}
            for c in self.tracker.list_comments(self.number):
                head = c.body.split("\n", 1)[0]
                if head.startswith("<!-- marin-alert:") and head.endswith(" -->"):
                    self._on_issue[head[len("<!-- marin-alert:"):-len(" -->")]] = c.id
        return key in self._on_issue

    def _posted_for(self, step: StepView) -> dict[str, int]:
        if step.output_path not in self._posted:
            path = f"{step.output_path.rstrip('/')}/{POSTED_FILE}"
            data = _read_posted(storage_for(step.output_path), path)
            by_issue = data.get("issues", {}) if isinstance(data, dict) else {}
            mine = by_issue.get(self.issue_ref, {}) if isinstance(by_issue, dict) else {}
            self._posted[step.output_path] = {str(k): int(v) for k, v in mine.items()}
        return self._posted[step.output_path]

    def _record(self, step: StepView, key: str, comment_id: int) -> None:
        self._posted_for(step)[key] = comment_id
        if self._on_issue is not None:
            self._on_issue[key] = comment_id
        storage = storage_for(step.output_path)
        path = f"{step.output_path.rstrip('/')}/{POSTED_FILE}"
        data = _read_posted(storage, path)
        issues = data.setdefault("issues", {}) if isinstance(data, dict) else {}
        issues[self.issue_ref] = self._posted[step.output_path]
        jsonio.write_json(storage, path, {"schema": "marin-alerts-posted/v1", "issues": issues}, pretty=True)

    # -- the comments ----------------------------------------------------------------------------------------

    def _link(self, run: RunView, step: StepView) -> str:
        prefix = run.prefix.rstrip("/")
        rel = step.output_path[len(prefix) + 1:] if step.output_path.startswith(prefix + "/") else \
            step.output_path
        if self.dashboard_url:
            return f"[charts on the dashboard]({self.dashboard_url}/steps/{rel})"
        return f"`marin dashboard --prefix {_md(prefix)}`, page `/steps/{_md(rel)}`"

    def _fired_body(self, run: RunView, step: StepView, a: Alert) -> str:
        what = "Risk point failed" if a.outcome == RISK_FAILED else "Alert"
        icon = ICONS.get(a.severity, "🟠")
        return "\n".join([
            f"{icon} **{what}: `{_md(a.rule)}`** ({_md(a.severity)}) on `{_md(step.name)}`",
            "",
            f"**What:** {_md(a.summary)}",
            f"**Where:** step {a.step} · attempt {_md(a.attempt or step.attempt)} · host "
            f"`{_md(a.host or '?')}` · `{_md(step.output_path)}`",
            f"**Since:** step {a.since_step}, {_utc(a.since)}",
            f"**Values:** {_values(a.values)}",
            f"**Chart:** {self._link(run, step)}",
            "",
            "<sub>One comment per firing; its resolution is posted as a comment of its own.</sub>"
            if a.outcome == FIRED else "<sub>A risk point is checked once, when the run reaches it.</sub>",
        ])

    def _resolved_body(self, step: StepView, a: Alert, reason: str, at_step: Any, at: Any) -> str:
        when = _utc(at) if isinstance(at, int | float) else "?"
        return (f"✅ **Resolved: `{_md(a.rule)}`** on `{_md(step.name)}`: {_md(reason)} at step {at_step}, "
                f"{when} (fired at step {a.since_step}, {_utc(a.since)}).")
