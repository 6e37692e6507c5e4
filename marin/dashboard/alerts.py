"""The dashboard's view of health alerts: a step's alerts and risk points, and every active alert.

Reads each step's ``alerts.jsonl`` and ``watch.json`` through the prefix store (cached by signature) and
folds them with :mod:`marin.status.alerts`, the engine's generic reader (docs/formats.md, "Alerts"), adding
the engine's own "the watcher is blind" for a running step whose heartbeat went stale. An alert is *active*
while it fired and has no resolution; one left open by an attempt that ended (a crash) is shown as such.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from marin.dashboard.experiments import ExperimentIndex
from marin.dashboard.store import PrefixStore
from marin.status import files as sf
from marin.status.alerts import ALERTS_FILE, WATCH_FILE, Alert, blind_alert, fold, valid_events


@dataclasses.dataclass(frozen=True)
class StepAlerts:
    """One step's alerts (newest first), its risk points, and whether its watcher reports."""

    path: str
    name: str
    status: str
    alerts: list[Alert]
    risk_points: list[Alert]
    watch: dict[str, Any] | None

    @property
    def active(self) -> list[Alert]:
        return [a for a in (*self.alerts, *self.risk_points) if a.active]


def step_alerts(store: PrefixStore, rel: str, name: str = "", status: str | None = None,
                now: float | None = None) -> StepAlerts:
    if status is None:
        st = store.read_json(sf.status_path(rel))
        status = str(st.get("status")) if isinstance(st, dict) else "NOT_STARTED"
    events = valid_events(store.read_jsonl(f"{rel}/{ALERTS_FILE}"))
    watch = store.read_json(f"{rel}/{WATCH_FILE}")
    watch = watch if isinstance(watch, dict) else None
    folded = fold(events)
    blind = blind_alert(watch, running=status == "RUNNING", now=time.time() if now is None else now)
    rules = [a for a in folded if a.kind != "risk_point"] + ([blind] if blind else [])
    rules.sort(key=lambda a: a.time or 0.0, reverse=True)
    risks = [a for a in folded if a.kind == "risk_point"]
    return StepAlerts(rel, name or rel.rsplit("/", 1)[-1], status, rules, risks, watch)


def active_alerts(store: PrefixStore, index: ExperimentIndex) -> list[tuple[StepAlerts, Alert]]:
    """Every active alert under the prefix (the steps of every experiment manifest), critical first."""
    seen: set[str] = set()
    out: list[tuple[StepAlerts, Alert]] = []
    listing = index.query(limit=1_000_000)
    for summary in listing.items:
        detail = index.detail(summary.id)
        for step in detail.steps if detail else []:
            if step.path in seen:
                continue
            seen.add(step.path)
            found = step_alerts(store, step.path, step.name, step.status)
            out.extend((found, a) for a in found.active)
    rank = {"critical": 0, "warning": 1, "info": 2}
    out.sort(key=lambda sa: (rank.get(sa[1].severity, 3), -(sa[1].time or 0.0)))
    return out


def as_json(a: Alert) -> dict[str, Any]:
    return {**dataclasses.asdict(a), "active": a.active}
