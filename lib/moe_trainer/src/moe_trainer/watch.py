"""The watcher: evaluates the health rules on a training run while it trains, and writes the alert events
(docs/health.md).

The guards of ``health.py`` act on a step; the rules *tell someone*. :class:`WatchConfig` is a declarative
rule set (frozen dataclasses, defaults shipped, every field overridable through the train step's
``overrides``, e.g. ``{"watch.drop_rate.max_rate": 0.05}``, so the rules are versioned with the experiment);
the rules themselves and their checks are in :mod:`moe_trainer.health_rules` (every name of it is importable
from here too). :class:`Watcher` evaluates the rules on every metrics row the trainer writes, and from a
background thread for the rules about time (no progress); it never touches the training step itself.

Each rule has a ``severity`` (critical, warning, info), a pending time (``pending_steps`` consecutive
evaluations in violation, and ``pending_s`` seconds), a resolution hysteresis (``resolve_steps`` clear
evaluations) and a ``silence_s`` window (a firing within that long of the previous resolution of the same
rule is written as ``silenced`` and not posted). A rule that is in violation for 1,000 steps fires once and
resolves once. Everything is scoped to one attempt: the watcher keeps its history in memory, so a resumed run
starts fresh (its median throughput, its loss windows), and its first act is to resolve the alerts an
earlier attempt left open (reason ``attempt ended``).

Events go to ``{output_dir}/alerts.jsonl`` (one JSON object per line, schema ``marin-alert/v1``: ``event``
fired / resolved / risk_failed / risk_passed, ``id``, ``rule``, ``kind``, ``severity``, ``summary``,
``values``, ``step``, ``since_step``, ``since``, ``time``, ``attempt``, ``session``, ``host``, ``silenced``,
``reason``), appended through :mod:`moe_trainer.jsonl` like ``metrics.jsonl``, and, through
:meth:`Watcher.drain`, into ``metrics.jsonl`` as rows ``{"step", "alert", "time"}``.
``{output_dir}/watch.json`` is the heartbeat (``time``, ``step``, ``session``, ``attempt``,
``blind_after_s``, the active alerts), rewritten every ``heartbeat_s``: the engine (marin/status/alerts.py)
raises "the watcher is blind" when it goes stale while the step runs, which covers a trainer too stuck to
report itself.

Risk points (:class:`RiskPoint`) are checkpoints an experiment declares in advance: "at 25% of the steps the
loss must be below x, else <plan>". Each is evaluated once, when the run reaches it, and written as
``risk_passed`` or ``risk_failed`` (with the plan), posted like an alert.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec

from moe_trainer.health_rules import (
    HISTORY,
    SEVERITIES,
    BandPoint,
    DropRate,
    EvalBand,
    EvalRegressed,
    Finding,
    Guards,
    History,
    LevelShift,
    LoadImbalance,
    LossSpike,
    NonFinite,
    NormRule,
    RiskPoint,
    RouterEntropy,
    Rule,
    RunFacts,
    SkipRate,
    Stall,
    Throughput,
    eval_value,
    fail,
    num,
)
from moe_trainer.jsonio import write_atomic
from moe_trainer.jsonl import JsonlFile, is_local

SCHEMA = "marin-alert/v1"
ALERTS_FILE = "alerts.jsonl"
WATCH_FILE = "watch.json"
ATTEMPT_ENV = "MARIN_ATTEMPT"  # set by the engine's worker for the attempt it runs (a plain string here)


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    """The health rules of a training run and where their events go (docs/health.md lists the defaults).

    The rules are evaluated in field order."""

    enabled: bool = True
    """Watch the run (False: no watcher, no alerts.jsonl)."""
    heartbeat_s: float = 30.0
    """How often watch.json is rewritten (and the time rules checked)."""
    blind_after_s: float = 600.0
    """The engine raises "the watcher is blind" when watch.json is older than this while the step runs."""
    loss_spike: LossSpike = LossSpike()
    level_shift: LevelShift = LevelShift()
    nonfinite: NonFinite = NonFinite()
    grad_norm: NormRule = NormRule(metric="grad_norm")
    update_norm: NormRule = NormRule(metric="update_norm")
    guards: Guards = Guards()
    skipped_steps: SkipRate = SkipRate()
    drop_rate: DropRate = DropRate()
    router_entropy: RouterEntropy = RouterEntropy()
    load_imbalance: LoadImbalance = LoadImbalance()
    throughput: Throughput = Throughput()
    stall: Stall = Stall()
    eval_regressed: EvalRegressed = EvalRegressed()
    eval_band: EvalBand = EvalBand()
    """An evaluation outside a pre-registered band (the ladder's target gets it from its prediction.json)."""
    risk_points: tuple[RiskPoint, ...] = ()
    """Checkpoints of this experiment (see RiskPoint)."""

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0 or self.blind_after_s <= self.heartbeat_s:
            fail("heartbeat_s/blind_after_s", (self.heartbeat_s, self.blind_after_s),
                 "use heartbeat_s > 0 and blind_after_s > heartbeat_s")
        names = [r.name for r in self.risk_points]
        if len(set(names)) != len(names):
            fail("risk_points", names, "give every risk point its own name")

    def rules(self) -> Iterator[tuple[str, Rule]]:
        """(name, rule) of every rule, in evaluation order."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Rule):
                yield f.name, value


RULE_NAMES = tuple(name for name, _ in WatchConfig().rules())
"""The rules of WatchConfig, in the order they are evaluated."""


@dataclasses.dataclass
class _RuleState:
    """The pending / firing / resolving state machine of one rule in one attempt."""

    bad: int = 0
    good: int = 0
    since_step: int = 0
    since: float = 0.0
    firing: dict[str, Any] | None = None
    last_resolved: float = -math.inf
    fired: int = 0


class Watcher:
    """Evaluates a WatchConfig on one attempt's metrics rows and writes alerts.jsonl / watch.json."""

    def __init__(self, cfg: WatchConfig, output_dir: str, facts: RunFacts, *, start_step: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.facts, self.clock = cfg, facts, clock
        self.session = uuid.uuid4().hex[:8]
        self.attempt = os.environ.get(ATTEMPT_ENV) or None
        self.host = socket.gethostname()
        self.fs, root = fsspec.core.url_to_fs(output_dir.rstrip("/"))
        self.fs.makedirs(root, exist_ok=True)
        self.alerts_path, self.watch_path = f"{root}/{ALERTS_FILE}", f"{root}/{WATCH_FILE}"
        earlier = self._read_events()
        self._file = JsonlFile(self.fs, self.alerts_path, local=is_local(output_dir), lines=earlier)
        self.history = History(facts, last_progress=clock(), now=clock())
        self.rules = dict(cfg.rules())
        self.states = {name: _RuleState() for name in self.rules}
        self.events: list[dict[str, Any]] = []
        self._queue: list[dict[str, Any]] = []
        self._risks = [rp for rp in cfg.risk_points if rp.step_of(facts.num_steps) > start_step]
        self.step = start_step
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resolve_earlier(earlier, start_step)
        self._heartbeat()

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> Watcher:
        """Start the thread that checks the time rules and rewrites watch.json."""
        interval = self.cfg.heartbeat_s
        if self.cfg.stall.enabled:
            interval = min(interval, self.cfg.stall.no_progress_s / 4)
        self._thread = threading.Thread(target=self._loop, args=(max(interval, 0.05),), daemon=True,
                                        name="moe-trainer-watch")
        self._thread.start()
        return self

    def _loop(self, interval: float) -> None:
        last_beat = self.clock()
        while not self._stop.wait(interval):
            self.tick(heartbeat=self.clock() - last_beat >= self.cfg.heartbeat_s)
            last_beat = self.clock() if self.clock() - last_beat >= self.cfg.heartbeat_s else last_beat

    def close(self, reason: str = "the attempt ended") -> None:
        """Stop the thread, resolve what still fires (alerts are scoped to the attempt), beat once more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for name, st in self.states.items():
                if st.firing is not None:
                    self._resolve(name, st, reason)
            self._heartbeat(closed=True)

    # -- evaluation ------------------------------------------------------------------------------------------

    def observe(self, row: Mapping[str, Any]) -> None:
        """Evaluate the rules on one metrics row (a train row has ``loss``, an eval row ``eval``)."""
        with self._lock:
            h = self.history
            h.now = self.clock()
            self.step = int(row.get("step", self.step))
            if "eval" in row:
                h.evals.append(dict(row))
                self._evaluate_rows("eval")
                self._risk_points(row, evals=True)
            elif "loss" in row:
                h.rows.append(dict(row))
                h.steps_seen += 1
                h.last_progress = h.now
                h.tokens_per_s.append(num(row.get("tokens_per_s")))
                if row.get("skipped"):
                    h.skips.append((h.now, self.step))
                self._evaluate_rows("train", "time")  # a train row is progress: it clears the stall
                self._risk_points(row, evals=False)

    def tick(self, heartbeat: bool = True) -> None:
        """The time rules (no progress), then the heartbeat; called by the thread (tests call it directly)."""
        with self._lock:
            self.history.now = self.clock()
            self._evaluate_rows("time")
            if heartbeat:
                self._heartbeat()

    def drain(self) -> list[dict[str, Any]]:
        """The events since the last call, as metrics.jsonl rows ``{"step", "alert", "time"}``; ``step`` is
        the newest row's (W&B needs steps that never decrease; the event keeps its own)."""
        with self._lock:
            out, self._queue = self._queue, []
            step = self.step
        return [{"step": max(step, int(e["step"])), "alert": e, "time": e["time"]} for e in out]

    def active(self) -> list[dict[str, Any]]:
        with self._lock:
            return [st.firing for st in self.states.values() if st.firing is not None]

    def _evaluate_rows(self, *kinds: str) -> None:
        for name, rule in self.rules.items():
            if rule.rows in kinds and rule.enabled and rule.applies(self.history):
                self._step_state(name, rule, rule.check(self.history))

    def _step_state(self, name: str, rule: Rule, finding: Finding | None) -> None:
        """Advance the rule's state machine by one evaluation (fire after pending, resolve after clear)."""
        st, now = self.states[name], self.history.now
        if finding is None:
            st.bad = 0
            if st.firing is not None:
                st.good += 1
                if st.good >= rule.resolve_steps:
                    self._resolve(name, st, "the condition cleared")
            return
        st.good = 0
        if st.bad == 0:
            st.since_step, st.since = self.step, now
        st.bad += 1
        if st.firing is None and st.bad >= rule.pending_steps and now - st.since >= rule.pending_s:
            st.fired += 1
            silenced = now - st.last_resolved < rule.silence_s
            st.firing = self._write("fired", f"{self.session}:{name}:{st.fired}", name, "rule", rule.severity,
                                    finding, since_step=st.since_step, since=st.since, silenced=silenced)
        elif st.firing is not None:
            st.firing = {**st.firing, "latest": {"step": self.step, "summary": finding.summary}}

    def _resolve(self, name: str, st: _RuleState, reason: str) -> None:
        fired = st.firing or {}
        self._write("resolved", fired["id"], name, "rule", fired["severity"],
                    Finding(f"resolved: {reason}", {}), since_step=fired["since_step"], since=fired["since"],
                    silenced=bool(fired.get("silenced")), reason=reason)
        st.firing, st.good, st.last_resolved = None, 0, self.history.now

    def _risk_points(self, row: Mapping[str, Any], *, evals: bool) -> None:
        for rp in list(self._risks):
            if rp.on_eval != evals or self.step < rp.step_of(self.facts.num_steps):
                continue
            self._risks.remove(rp)
            ok, finding = rp.judge(self.history, row, self.step)
            self._write("risk_passed" if ok else "risk_failed", f"{self.session}:risk:{rp.name}",
                        f"risk:{rp.name}", "risk_point", rp.severity, finding,
                        since_step=self.step, since=self.history.now, silenced=False)

    # -- files -----------------------------------------------------------------------------------------------

    def _write(self, event: str, event_id: str, rule: str, kind: str, severity: str, finding: Finding, *,
               since_step: int, since: float, silenced: bool, reason: str | None = None) -> dict[str, Any]:
        record = {"schema": SCHEMA, "event": event, "id": event_id, "rule": rule, "kind": kind,
                  "severity": severity, "summary": finding.summary, "values": _plain(finding.values),
                  "step": self.step, "since_step": since_step, "since": since, "time": self.history.now,
                  "attempt": self.attempt, "session": self.session, "host": self.host, "silenced": silenced,
                  "reason": reason}
        self._file.append(json.dumps(record) + "\n", durable=True)
        self.events.append(record)
        self._queue.append(record)
        self._heartbeat()
        return record

    def _heartbeat(self, closed: bool = False) -> None:
        state = {"schema": SCHEMA, "time": self.clock(), "step": self.step, "session": self.session,
                 "attempt": self.attempt, "host": self.host, "heartbeat_s": self.cfg.heartbeat_s,
                 "blind_after_s": self.cfg.blind_after_s, "closed": closed,
                 "active": [st.firing["id"] for st in self.states.values() if st.firing is not None]}
        write_atomic(self.fs, self.watch_path, [json.dumps(state).encode()])

    def _read_events(self) -> list[str]:
        """The lines an earlier attempt wrote to alerts.jsonl ([] for a first attempt)."""
        if not self.fs.exists(self.alerts_path):
            return []
        with self.fs.open(self.alerts_path, "r") as f:
            return [line for line in f if line.strip()]

    def _resolve_earlier(self, lines: list[str], start_step: int) -> None:
        """Resolve the alerts an earlier attempt left firing (it died before closing its watcher)."""
        open_alerts: dict[str, dict[str, Any]] = {}
        for line in lines:
            e = json.loads(line)
            if e.get("event") == "fired":
                open_alerts[e["id"]] = e
            elif e.get("event") == "resolved":
                open_alerts.pop(e.get("id"), None)
        for e in open_alerts.values():
            self._write("resolved", e["id"], e["rule"], e.get("kind", "rule"), e.get("severity", "warning"),
                        Finding("resolved: its attempt ended (a new attempt started)", {}),
                        since_step=e.get("since_step", start_step), since=e.get("since", 0.0),
                        silenced=bool(e.get("silenced")), reason="its attempt ended")


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-safe values: non-finite floats as strings (JSON has no NaN)."""
    def one(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, list | tuple):
            return [one(x) for x in v]
        return v
    return {k: one(v) for k, v in values.items()}


def facts_of(train_config: Any) -> RunFacts:
    """The RunFacts of a moe_trainer TrainConfig."""
    health, model = train_config.health, train_config.model
    return RunFacts(num_steps=train_config.num_steps, update_window=health.update_window,
                    skip_nonfinite=health.skip_nonfinite, max_grad_norm=health.max_grad_norm,
                    n_experts=model.n_experts if model.moe_layers else 1, top_k=model.top_k,
                    capacity_factor=model.capacity_factor)


__all__ = [
    "ALERTS_FILE", "ATTEMPT_ENV", "HISTORY", "RULE_NAMES", "SCHEMA", "SEVERITIES", "WATCH_FILE", "BandPoint",
    "DropRate", "EvalBand", "EvalRegressed", "Finding", "Guards", "History", "LevelShift", "LoadImbalance",
    "LossSpike", "NonFinite", "NormRule", "RiskPoint", "RouterEntropy", "Rule", "RunFacts", "SkipRate",
    "Stall", "Throughput", "WatchConfig", "Watcher", "eval_value", "facts_of",
]
