"""The dashboard's view of health alerts: a step's alerts and risk points, and every active alert.

Reads each step's ``alerts.jsonl`` and ``watch.json`` through the prefix store (cached by signature) and
folds them with :mod:`marin.status.alerts`, the engine's generic reader (docs/formats.md, "Alerts"), adding
the engine's own "the watcher is blind" for a running step whose heartbeat went stale. An alert is *active*
while it fired and has no resolution; one left open by an attempt that ended (a crash) is shown as such.

The list of every active alert (:class:`AlertIndex`, ``/alerts``) does not ask storage about every step on
every request. A step's alert files only change while the step runs, and a step only runs inside a run of an
experiment that names it, which the experiment's manifest records (a run RUNNING; its end rewrites the
manifest). So the index keeps each step's files as last read, and a request re-reads only the steps of
experiments whose manifest is new or changed since then (one more read after a run ends catches its last
events) or still has a run RUNNING; the manifests themselves come from the experiment index (one listing
per cache TTL). A prefix of finished experiments costs one directory listing per request; "the watcher is
blind" is judged at request time from the heartbeat as read.

The history (:meth:`AlertIndex.history`, the `/alerts` page's second table) is every alert the same files
hold, resolved ones included (a ladder target that left its band and came back): raised, resolved (when, at
which training step, why), by rule, by step and by the experiments (runs) naming the step, newest first.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from marin.dashboard.experiments import ExperimentIndex, step_rel
from marin.dashboard.store import PrefixStore
from marin.status import files as sf
from marin.status.alerts import ALERTS_FILE, WATCH_FILE, Alert, blind_alert, fold, valid_events

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


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


@dataclasses.dataclass(frozen=True)
class _StepFiles:
    """What a step's files said when last read: its status, its folded events and its heartbeat."""

    name: str
    status: str
    folded: list[Alert]
    watch: dict[str, Any] | None

    def view(self, path: str, now: float) -> StepAlerts:
        blind = blind_alert(self.watch, running=self.status == "RUNNING", now=now)
        rules = [a for a in self.folded if a.kind != "risk_point"] + ([blind] if blind else [])
        rules.sort(key=lambda a: a.time or 0.0, reverse=True)
        risks = [a for a in self.folded if a.kind == "risk_point"]
        return StepAlerts(path, self.name, self.status, rules, risks, self.watch)


def _read_step(store: PrefixStore, rel: str, name: str, status: str | None) -> _StepFiles:
    if status is None:
        st = store.read_json(sf.status_path(rel))
        status = str(st.get("status")) if isinstance(st, dict) else "NOT_STARTED"
    watch = store.read_json(f"{rel}/{WATCH_FILE}")
    return _StepFiles(name or rel.rsplit("/", 1)[-1], status,
                      fold(valid_events(store.read_jsonl(f"{rel}/{ALERTS_FILE}"))),
                      watch if isinstance(watch, dict) else None)


def step_alerts(store: PrefixStore, rel: str, name: str = "", status: str | None = None,
                now: float | None = None) -> StepAlerts:
    """One step's alerts, read now (the step page)."""
    return _read_step(store, rel, name, status).view(rel, time.time() if now is None else now)


def _running(manifest: dict[str, Any]) -> bool:
    return any(isinstance(r, dict) and r.get("status") == "RUNNING" for r in manifest.get("runs") or [])


class AlertIndex:
    """Every active alert under the prefix, re-reading only the steps that can have changed (see the module
    docstring)."""

    def __init__(self, store: PrefixStore, experiments: ExperimentIndex) -> None:
        self.store, self.experiments = store, experiments
        self._read: dict[str, Any] = {}  # experiment id -> the manifest signature its steps were read at
        self._steps: dict[str, _StepFiles] = {}  # step path -> its files as last read
        self._owners: dict[str, list[str]] = {}  # step path -> the experiments naming it
        self._lock = threading.Lock()

    def active(self, now: float | None = None) -> list[tuple[StepAlerts, Alert]]:
        """Every active alert (the steps of every experiment manifest), critical first, newest first."""
        now = time.time() if now is None else now
        with self._lock:
            paths = self._refresh()
        out: list[tuple[StepAlerts, Alert]] = []
        for rel in paths:
            found = self._steps[rel].view(rel, now)
            out.extend((found, a) for a in found.active)
        out.sort(key=lambda sa: (SEVERITY_RANK.get(sa[1].severity, 3), -(sa[1].time or 0.0)))
        return out

    def history(self, now: float | None = None) -> list[HistoryRow]:
        """Every alert and risk point of every step, resolved or not, newest first."""
        now = time.time() if now is None else now
        with self._lock:
            paths = self._refresh()
            owners = dict(self._owners)
        rows: list[HistoryRow] = []
        for rel in paths:
            found = self._steps[rel].view(rel, now)
            rows.extend(HistoryRow(found, a, tuple(owners.get(rel, ()))) for a in (*found.alerts,
                                                                                    *found.risk_points))
        rows.sort(key=lambda r: -(r.alert.time or 0.0))
        return rows

    def _refresh(self) -> list[str]:
        """Re-read the steps of new, changed or running experiments; return every step path, once."""
        paths: dict[str, None] = {}
        owners: dict[str, list[str]] = {}
        current: set[str] = set()
        for key, sig, manifest in self.experiments.signed_manifests():
            current.add(key)
            stale = _running(manifest) or self._read.get(key) != sig
            for entry in manifest.get("steps") or []:
                if not isinstance(entry, dict):
                    continue
                rel = step_rel(self.store, entry)
                if stale or rel not in self._steps:
                    self._steps[rel] = _read_step(self.store, rel, str(entry.get("name", "")), None)
                paths.setdefault(rel)
                owners.setdefault(rel, []).append(key)
            self._read[key] = sig
        self._owners = owners
        for key in set(self._read) - current:
            del self._read[key]
        for rel in set(self._steps) - set(paths):
            del self._steps[rel]
        return list(paths)


def as_json(a: Alert) -> dict[str, Any]:
    return {**dataclasses.asdict(a), "active": a.active}


@dataclasses.dataclass(frozen=True)
class HistoryRow:
    step: StepAlerts
    alert: Alert
    experiments: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {**as_json(self.alert), "step_path": self.step.path, "step_name": self.step.name,
                "step_status": self.step.status, "experiments": list(self.experiments)}


def filter_history(rows: list[HistoryRow], *, rule: str | None = None, run: str | None = None,
                   state: str | None = None) -> list[HistoryRow]:
    """Rows of one rule, of steps whose path or experiment contains `run`, and `active` or `resolved`
    ones (anything else: all)."""
    if rule:
        rows = [r for r in rows if r.alert.rule == rule]
    if run:
        rows = [r for r in rows if run in r.step.path or any(run in e for e in r.experiments)]
    if state == "active":
        rows = [r for r in rows if r.alert.active]
    elif state == "resolved":
        rows = [r for r in rows if not r.alert.active]
    return rows
