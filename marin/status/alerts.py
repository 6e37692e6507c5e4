"""Alert events of a step, read generically: what fired, what resolved, what is active, and a blind watcher.

The engine knows no ML. A step that watches itself (the trainer's health rules, docs/health.md) writes two
files in its output path, in the format of docs/formats.md ("Alerts"):

- ``alerts.jsonl``: one event per line (schema ``marin-alert/v1``): ``event`` (``fired``, ``resolved``,
  ``risk_failed``, ``risk_passed``), ``id`` (a fired event and its resolution share it), ``rule``, ``kind``,
  ``severity``, ``summary``, ``values``, ``step``, ``since_step``, ``since``, ``time``, ``attempt``,
  ``session``, ``host``, ``silenced``, ``reason``;
- ``watch.json``: the watcher's heartbeat (``time``, ``step``, ``session``, ``blind_after_s``, ``closed``).

:func:`fold` turns the events into one :class:`Alert` per id; :func:`blind_alert` is the engine's own alert
"the watcher is blind": the step is RUNNING but its heartbeat is older than ``blind_after_s`` (a trainer too
stuck to say so itself, or a node gone). The tracker posts them (marin/tracking/alerts.py); the dashboard
lists them (marin/dashboard/routers/alerts.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from marin import jsonio
from marin.errors import CorruptFileError
from marin.storage.fs import storage_for

ALERTS_FILE = "alerts.jsonl"
WATCH_FILE = "watch.json"
FIRED, RESOLVED, RISK_FAILED, RISK_PASSED = "fired", "resolved", "risk_failed", "risk_passed"
EVENTS = (FIRED, RESOLVED, RISK_FAILED, RISK_PASSED)
BLIND_RULE = "watcher_blind"


@dataclasses.dataclass(frozen=True)
class Alert:
    """One firing (or one risk point's result) and its resolution if any; ``event`` is the fired record."""

    id: str
    rule: str
    kind: str
    severity: str
    summary: str
    values: Mapping[str, Any]
    step: int | None
    since_step: int | None
    since: float | None
    time: float | None
    attempt: str | None
    host: str | None
    silenced: bool
    outcome: str
    """fired, risk_failed or risk_passed."""
    resolved: Mapping[str, Any] | None = None
    """The resolution's record (``reason``, ``step``, ``time``), None while firing."""

    @property
    def active(self) -> bool:
        return self.outcome in (FIRED, RISK_FAILED) and self.resolved is None

    @classmethod
    def from_event(cls, e: Mapping[str, Any]) -> Alert:
        def num(key: str) -> Any:
            v = e.get(key)
            return v if isinstance(v, int | float) and not isinstance(v, bool) else None

        values = e.get("values")
        return cls(id=str(e.get("id")), rule=str(e.get("rule", "?")), kind=str(e.get("kind", "rule")),
                   severity=str(e.get("severity", "warning")), summary=str(e.get("summary", "")),
                   values=values if isinstance(values, dict) else {},
                   step=num("step"), since_step=num("since_step"), since=num("since"), time=num("time"),
                   attempt=None if e.get("attempt") is None else str(e.get("attempt")),
                   host=None if e.get("host") is None else str(e.get("host")),
                   silenced=bool(e.get("silenced")), outcome=str(e.get("event")))


def parse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The events of an alerts.jsonl text (a line cut by a crash is skipped: it must not hide the rest)."""
    objs = []
    for line in lines:
        try:
            objs.append(json.loads(line))
        except ValueError:
            continue
    return valid_events(objs)


def valid_events(objs: Iterable[Any]) -> list[dict[str, Any]]:
    """The objects that are alert events (a JSON object with a known ``event`` and a string ``id``)."""
    return [e for e in objs
            if isinstance(e, dict) and e.get("event") in EVENTS and isinstance(e.get("id"), str)]


def fold(events: Iterable[Mapping[str, Any]]) -> list[Alert]:
    """One Alert per id, in the order they fired, with its resolution attached."""
    alerts: dict[str, Alert] = {}
    for e in events:
        kind = e.get("event")
        if kind == RESOLVED:
            a = alerts.get(str(e.get("id")))
            if a is not None and a.resolved is None:
                resolution = {k: e.get(k) for k in ("reason", "step", "time")}
                alerts[a.id] = dataclasses.replace(a, resolved=resolution)
        elif str(e.get("id")) not in alerts:
            alerts[str(e.get("id"))] = Alert.from_event(e)
    return list(alerts.values())


def read_alerts(output_path: str) -> tuple[list[Alert], dict[str, Any] | None]:
    """(the step's alerts, its watch.json heartbeat) from its output path; ([], None) for unwatched steps."""
    storage = storage_for(output_path)
    base = output_path.rstrip("/")
    text = storage.read_text(f"{base}/{ALERTS_FILE}")
    try:
        watch = jsonio.read_json(storage, f"{base}/{WATCH_FILE}")
    except CorruptFileError:
        watch = None
    return fold(parse_events(text.splitlines() if text else [])), watch if isinstance(watch, dict) else None


def blind_alert(watch: Mapping[str, Any] | None, *, running: bool, now: float) -> Alert | None:
    """The engine's alert for a running step whose watcher stopped reporting, or None.

    Its id names the watcher's session and the heartbeat it last saw, so a second blindness of the same
    session is a new alert, and one blindness stays one alert however often it is checked."""
    if not running or not watch or watch.get("closed"):
        return None
    beat, limit = watch.get("time"), watch.get("blind_after_s")
    if not isinstance(beat, int | float) or not isinstance(limit, int | float) or now - beat <= limit:
        return None
    session = watch.get("session")
    return Alert(id=f"{session}:{BLIND_RULE}:{beat:.0f}", rule=BLIND_RULE, kind="engine", severity="critical",
                 summary=f"the watcher is blind: no heartbeat for {now - beat:.0f} s (limit {limit:g} s); "
                         f"last step {watch.get('step')}",
                 values={"heartbeat": beat, "blind_after_s": limit}, step=watch.get("step"),
                 since_step=watch.get("step"), since=float(beat), time=now,
                 attempt=None if watch.get("attempt") is None else str(watch.get("attempt")),
                 host=watch.get("host"), silenced=False, outcome=FIRED)
