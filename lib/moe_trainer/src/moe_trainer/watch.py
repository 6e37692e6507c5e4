"""Health rules that watch a training run while it trains, and the alert events they write (docs/health.md).

The guards of ``health.py`` act on a step; the rules here *tell someone*. :class:`WatchConfig` is a
declarative rule set (frozen dataclasses, defaults shipped, every field overridable through the train step's
``overrides``, e.g. ``{"watch.drop_rate.max_rate": 0.05}``, so the rules are versioned with the experiment).
:class:`Watcher` evaluates it on every metrics row the trainer writes, and from a background thread for the
rules about time (no progress); it never touches the training step itself.

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
``reason``) and, through :meth:`Watcher.drain`, into ``metrics.jsonl`` as rows ``{"step", "alert", "time"}``.
``{output_dir}/watch.json`` is the heartbeat (``time``, ``step``, ``session``, ``attempt``,
``blind_after_s``, the active alerts), rewritten every ``heartbeat_s``: the engine (marin/status/alerts.py)
raises "the watcher is blind" when it goes stale while the step runs, which covers a trainer too stuck to
report itself.

Risk points (:class:`RiskPoint`) are checkpoints an experiment declares in advance: "at 25% of the steps the
loss must be below x, else <plan>". Each is evaluated once, when the run reaches it, and written as
``risk_passed`` or ``risk_failed`` (with the plan), posted like an alert.

Why the file is past 400 lines: the rules, their state machine and the event file are one protocol; the
rules are small and read best next to each other.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import statistics
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import fsspec

SCHEMA = "marin-alert/v1"
ALERTS_FILE = "alerts.jsonl"
WATCH_FILE = "watch.json"
ATTEMPT_ENV = "MARIN_ATTEMPT"  # set by the engine's worker for the attempt it runs (a plain string here)
SEVERITIES = ("critical", "warning", "info")
HISTORY = 256  # train rows kept for the windowed rules (the longest default window is 64 + 8)


def _fail(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"watch.{field}={value!r}: {fix}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What every rule has: whether it is on, how bad it is, how long before it fires, and its silence."""

    enabled: bool = True
    """Evaluate this rule."""
    severity: str = "warning"
    """critical, warning or info (shown on the issue and the dashboard)."""
    pending_steps: int = 1
    """Consecutive evaluations in violation before the rule fires."""
    pending_s: float = 0.0
    """Seconds the violation must also have lasted before the rule fires."""
    resolve_steps: int = 3
    """Consecutive clear evaluations before a firing rule resolves (hysteresis against flapping)."""
    silence_s: float = 1800.0
    """A firing this soon after the rule's previous resolution is recorded as silenced (not posted)."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            _fail(f"{type(self).__name__}.severity", self.severity, f"use one of {', '.join(SEVERITIES)}")
        if self.pending_steps < 1 or self.resolve_steps < 1:
            _fail(f"{type(self).__name__}.pending_steps/resolve_steps", (self.pending_steps,
                                                                          self.resolve_steps), "use >= 1")
        if self.pending_s < 0 or self.silence_s < 0:
            _fail(f"{type(self).__name__}.pending_s/silence_s", (self.pending_s, self.silence_s), "use >= 0")


@dataclasses.dataclass(frozen=True)
class LossSpike(Rule):
    """Marin's hero-run rule: the floor of the recent losses above the trailing mean + max(min_jump,
    sigma·std)."""

    severity: str = "critical"
    recent: int = 8
    """Steps whose minimum is the recent floor."""
    trailing: int = 64
    """Steps before those whose mean and std are the baseline (the rule waits for half of them)."""
    min_jump: float = 0.05
    """Smallest rise of the floor over the trailing mean that counts."""
    sigma: float = 6.0
    """Standard deviations of the trailing window the floor must rise by."""


@dataclasses.dataclass(frozen=True)
class LevelShift(Rule):
    """The mean loss of the last ``window`` steps above the mean of the ``window`` before by ``max_shift``."""

    window: int = 32
    max_shift: float = 1.0


@dataclasses.dataclass(frozen=True)
class NonFinite(Rule):
    """A NaN or infinite loss or gradient norm (the step is skipped if health.skip_nonfinite is on)."""

    severity: str = "critical"


@dataclasses.dataclass(frozen=True)
class NormRule(Rule):
    """A norm (grad_norm before clipping, update_norm after update-norm clipping) above ``max_value``, or its
    median over the last ``window`` steps ``growth_factor`` times the median of the ``window`` before."""

    pending_steps: int = 8
    max_value: float | None = None
    """Absolute ceiling (None: off; Marin's hero runs used 2.0 for the gradient norm)."""
    window: int = 32
    growth_factor: float | None = 4.0
    """Growth of the windowed median that fires (None: off)."""


@dataclasses.dataclass(frozen=True)
class Guards(Rule):
    """A guard of health.py configured off, or on but unable to act (Marin 32B's update-norm filter was off
    for thousands of steps before its spike): update-norm clipping, skip of non-finite steps, gradient
    clipping; and update-norm clipping that never armed (its window never half filled with applied
    updates)."""

    severity: str = "critical"
    require_update_clipping: bool = True
    require_skip_nonfinite: bool = True
    require_grad_clipping: bool = False
    min_steps: int = 200
    """Runs shorter than this are not required to have update-norm clipping arm (a 20-step tutorial run has
    no history to protect); a guard configured off fires whatever the length."""


@dataclasses.dataclass(frozen=True)
class SkipRate(Rule):
    """``max_skips`` or more skipped steps within ``window_s`` seconds (Marin: 3 in 15 minutes)."""

    max_skips: int = 3
    window_s: float = 900.0


@dataclasses.dataclass(frozen=True)
class DropRate(Rule):
    """MoE: the fraction of routing assignments dropped by expert capacity above ``max_rate``."""

    pending_steps: int = 5
    max_rate: float = 0.07
    """Marin: 7%, above the intermittent 5% spikes."""


@dataclasses.dataclass(frozen=True)
class RouterEntropy(Rule):
    """MoE: the mean per-token router entropy of a layer below ``min_fraction`` of the uniform ln(E)."""

    pending_steps: int = 10
    min_fraction: float = 0.1


@dataclasses.dataclass(frozen=True)
class LoadImbalance(Rule):
    """MoE: a layer's busiest expert, as a fraction of the way from balance (max/mean = 1) to collapse
    (max/mean = E/top_k), above ``max_imbalance``."""

    pending_steps: int = 20
    max_imbalance: float = 0.75


@dataclasses.dataclass(frozen=True)
class Throughput(Rule):
    """tokens/s below ``min_fraction`` of this attempt's own median on ``most`` of the last ``window`` steps
    (counted, not averaged), or MFU below ``min_mfu`` likewise."""

    window: int = 20
    most: float = 0.8
    min_fraction: float = 0.5
    warmup: int = 10
    """Steps of this attempt before the rule starts (compilation, caches)."""
    min_mfu: float | None = None


@dataclasses.dataclass(frozen=True)
class Stall(Rule):
    """No new training step for ``no_progress_s`` seconds (checked by the watcher's thread)."""

    severity: str = "critical"
    resolve_steps: int = 1
    no_progress_s: float = 900.0


@dataclasses.dataclass(frozen=True)
class EvalRegressed(Rule):
    """The newest evaluation worse than the previous one by more than ``tolerance`` (relative)."""

    resolve_steps: int = 1
    metric: str = "micro.bpb"
    """Path inside the eval row's ``eval`` object (lower is better)."""
    tolerance: float = 0.01


@dataclasses.dataclass(frozen=True)
class RiskPoint:
    """A checkpoint declared in advance: at a point of the run a metric must lie within bounds, else the plan.

    ``metric`` is a train-row field (``loss``, ``drop_rate``...; the median of the last ``window`` rows is
    compared) or ``eval.<path>`` (the first evaluation at or after the point, e.g. ``eval.micro.bpb``). Give
    both bounds for a pre-registered band."""

    name: str
    metric: str = "loss"
    at_step: int | None = None
    at_fraction: float | None = None
    """Fraction of the run's num_steps (= of its tokens: the batch is fixed)."""
    below: float | None = None
    above: float | None = None
    action: str = ""
    """The retreat plan, posted with a failure ("else: lower the LR by 2x and resume from step 2000")."""
    window: int = 16
    severity: str = "critical"

    def __post_init__(self) -> None:
        if (self.at_step is None) == (self.at_fraction is None):
            _fail(f"risk_points[{self.name}]", (self.at_step, self.at_fraction),
                  "give at_step or at_fraction")
        if self.at_fraction is not None and not 0 < self.at_fraction <= 1:
            _fail(f"risk_points[{self.name}].at_fraction", self.at_fraction, "use a fraction in (0, 1]")
        if self.below is None and self.above is None:
            _fail(f"risk_points[{self.name}]", None, "give `below` and/or `above`")
        if self.severity not in SEVERITIES or self.window < 1:
            _fail(f"risk_points[{self.name}]", (self.severity, self.window), "severity in "
                  f"{SEVERITIES} and window >= 1")

    def step_of(self, num_steps: int) -> int:
        if self.at_step is not None:
            return self.at_step
        return max(1, math.ceil(float(self.at_fraction or 0.0) * num_steps))


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    """The health rules of a training run and where their events go (docs/health.md lists the defaults)."""

    enabled: bool = True
    """Watch the run (False: no watcher, no alerts.jsonl)."""
    heartbeat_s: float = 30.0
    """How often watch.json is rewritten (and the time rules checked)."""
    blind_after_s: float = 600.0
    """The engine raises "the watcher is blind" when watch.json is older than this while the step runs."""
    loss_spike: LossSpike = LossSpike()
    level_shift: LevelShift = LevelShift()
    nonfinite: NonFinite = NonFinite()
    grad_norm: NormRule = NormRule()
    update_norm: NormRule = NormRule()
    guards: Guards = Guards()
    skipped_steps: SkipRate = SkipRate()
    drop_rate: DropRate = DropRate()
    router_entropy: RouterEntropy = RouterEntropy()
    load_imbalance: LoadImbalance = LoadImbalance()
    throughput: Throughput = Throughput()
    stall: Stall = Stall()
    eval_regressed: EvalRegressed = EvalRegressed()
    risk_points: tuple[RiskPoint, ...] = ()
    """Checkpoints of this experiment (see RiskPoint)."""

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0 or self.blind_after_s <= self.heartbeat_s:
            _fail("heartbeat_s/blind_after_s", (self.heartbeat_s, self.blind_after_s),
                  "use heartbeat_s > 0 and blind_after_s > heartbeat_s")
        names = [r.name for r in self.risk_points]
        if len(set(names)) != len(names):
            _fail("risk_points", names, "give every risk point its own name")


RULE_NAMES = ("loss_spike", "level_shift", "nonfinite", "grad_norm", "update_norm", "guards", "skipped_steps",
              "drop_rate", "router_entropy", "load_imbalance", "throughput", "stall", "eval_regressed")
"""The rules of WatchConfig, in the order they are evaluated."""


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the rules know of the run besides its rows: its guards and its MoE shape."""

    num_steps: int
    update_window: int
    skip_nonfinite: bool
    max_grad_norm: float | None
    n_experts: int = 1
    top_k: int = 1
    capacity_factor: float | None = None


@dataclasses.dataclass(frozen=True)
class Finding:
    """A rule in violation: one sentence and the numbers behind it."""

    summary: str
    values: dict[str, Any]


def _num(x: Any) -> float:
    """A row value as a float (the trainer writes non-finite numbers as the strings "nan"/"inf")."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _finite(rows: Any, key: str) -> list[float]:
    values = (_num(r.get(key)) for r in rows)
    return [v for v in values if math.isfinite(v)]


@dataclasses.dataclass
class History:
    """What this attempt has seen (bounded): the last train rows, throughput, skip times, evaluations."""

    facts: RunFacts
    rows: deque[dict[str, Any]] = dataclasses.field(default_factory=lambda: deque(maxlen=HISTORY))
    tokens_per_s: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=2048))
    skips: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steps_seen: int = 0
    last_progress: float = 0.0
    now: float = 0.0

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[-1]


def _loss_spike(rule: LossSpike, h: History) -> Finding | None:
    losses = _finite(h.rows, "loss")[-(rule.recent + rule.trailing):]
    if len(losses) < rule.recent + max(rule.trailing // 2, 2):
        return None
    recent, trailing = losses[-rule.recent:], losses[:-rule.recent]
    floor, mean, std = min(recent), statistics.fmean(trailing), statistics.pstdev(trailing)
    threshold = mean + max(rule.min_jump, rule.sigma * std)
    if floor <= threshold:
        return None
    return Finding(f"loss floor over the last {rule.recent} steps {floor:.4f} > trailing mean {mean:.4f} + "
                   f"max({rule.min_jump:g}, {rule.sigma:g}σ = {rule.sigma * std:.4f})",
                   {"floor": floor, "trailing_mean": mean, "trailing_std": std, "threshold": threshold})


def _level_shift(rule: LevelShift, h: History) -> Finding | None:
    losses = _finite(h.rows, "loss")[-2 * rule.window:]
    if len(losses) < 2 * rule.window:
        return None
    before, after = statistics.fmean(losses[:rule.window]), statistics.fmean(losses[rule.window:])
    if after - before <= rule.max_shift:
        return None
    return Finding(f"mean loss of the last {rule.window} steps {after:.4f} is {after - before:.4f} above the "
                   f"{rule.window} before ({before:.4f}; limit {rule.max_shift:g})",
                   {"mean_recent": after, "mean_before": before, "shift": after - before})


def _nonfinite(rule: NonFinite, h: History) -> Finding | None:
    loss, grad = _num(h.row.get("loss")), _num(h.row.get("grad_norm"))
    if math.isfinite(loss) and math.isfinite(grad) and not h.row.get("nonfinite"):
        return None
    return Finding(f"non-finite training values: loss {loss}, grad_norm {grad} (skipped: "
                   f"{bool(h.row.get('skipped'))})", {"loss": str(loss), "grad_norm": str(grad),
                                                       "skipped": bool(h.row.get("skipped"))})


def _norm(rule: NormRule, h: History, metric: str) -> Finding | None:
    value = _num(h.row.get(metric))
    if rule.max_value is not None and value > rule.max_value:
        return Finding(f"{metric} {value:.4g} > {rule.max_value:g}", {metric: value, "max": rule.max_value})
    values = _finite(h.rows, metric)[-2 * rule.window:]
    if rule.growth_factor is None or len(values) < 2 * rule.window:
        return None
    before, after = statistics.median(values[:rule.window]), statistics.median(values[rule.window:])
    if before <= 0 or after / before <= rule.growth_factor:
        return None
    return Finding(f"median {metric} grew {after / before:.1f}x over {rule.window} steps ({before:.4g} -> "
                   f"{after:.4g}; limit {rule.growth_factor:g}x)",
                   {"median_before": before, "median_recent": after, "growth": after / before})


def _guards(rule: Guards, h: History) -> Finding | None:
    f, problems = h.facts, []
    arm_at = max(f.update_window // 2, 2)
    if rule.require_update_clipping and f.update_window < 2:
        problems.append(f"update-norm clipping is off (health.update_window={f.update_window})")
    elif rule.require_update_clipping and arm_at > f.num_steps >= rule.min_steps:
        problems.append(f"update-norm clipping can never act: it arms after {arm_at} applied updates and the "
                        f"run has {f.num_steps} steps (health.update_window={f.update_window})")
    elif (rule.require_update_clipping and h.row.get("update_filter_armed") is False
          and int(h.row.get("step", 0)) >= 2 * arm_at and f.num_steps >= rule.min_steps):
        problems.append(f"update-norm clipping is on but not acting: fewer than {arm_at} of "
                        f"{h.row.get('step')} steps were applied, so its window never armed")
    if rule.require_skip_nonfinite and not f.skip_nonfinite:
        problems.append("skipping non-finite steps is off (health.skip_nonfinite=false)")
    if rule.require_grad_clipping and f.max_grad_norm is None:
        problems.append("gradient clipping is off (health.max_grad_norm=null)")
    if not problems:
        return None
    return Finding("; ".join(problems), {"update_window": f.update_window, "skip_nonfinite": f.skip_nonfinite,
                                         "max_grad_norm": f.max_grad_norm})


def _skipped(rule: SkipRate, h: History) -> Finding | None:
    n = sum(1 for t in h.skips if t >= h.now - rule.window_s)
    if n < rule.max_skips:
        return None
    return Finding(f"{n} skipped steps in the last {rule.window_s:g} s (limit {rule.max_skips - 1})",
                   {"skipped": n, "window_s": rule.window_s})


def _drop_rate(rule: DropRate, h: History) -> Finding | None:
    rate = _num(h.row.get("drop_rate"))
    if not rate > rule.max_rate:
        return None
    return Finding(f"MoE drop rate {rate:.1%} > {rule.max_rate:.1%} (capacity_factor "
                   f"{h.facts.capacity_factor})", {"drop_rate": rate, "max_rate": rule.max_rate})


def _router_entropy(rule: RouterEntropy, h: History) -> Finding | None:
    entropy = [_num(e) for e in h.row.get("routing_entropy") or []]
    if h.facts.n_experts < 2 or not entropy:
        return None
    floor = rule.min_fraction * math.log(h.facts.n_experts)
    low = {i: e for i, e in enumerate(entropy) if e < floor}
    if not low:
        return None
    worst = min(low, key=lambda i: low[i])
    return Finding(f"router entropy of layer {worst} is {low[worst]:.3f} nats < {floor:.3f} "
                   f"({rule.min_fraction:g} x ln {h.facts.n_experts}) in {len(low)} layer(s)",
                   {"entropy": entropy, "floor": floor})


def _load_imbalance(rule: LoadImbalance, h: History) -> Finding | None:
    collapse = h.facts.n_experts / max(h.facts.top_k, 1)
    if collapse <= 1:
        return None
    scores = []
    for layer in h.row.get("expert_load") or []:
        loads = [_num(x) for x in layer]
        mean = statistics.fmean(loads) if loads else 0.0
        scores.append((max(loads) / mean - 1) / (collapse - 1) if mean > 0 else 0.0)
    if not scores or max(scores) <= rule.max_imbalance:
        return None
    worst = max(range(len(scores)), key=scores.__getitem__)
    return Finding(f"expert load of layer {worst} is {scores[worst]:.0%} of the way to collapse "
                   f"(limit {rule.max_imbalance:.0%})", {"imbalance": scores})


def _throughput(rule: Throughput, h: History) -> Finding | None:
    if h.steps_seen < rule.warmup + rule.window:
        return None
    history = list(h.tokens_per_s)
    median = statistics.median(history[rule.warmup:] if len(history) > rule.warmup + rule.window else history)
    recent = [_num(r.get("tokens_per_s")) for r in list(h.rows)[-rule.window:]]
    slow = sum(1 for v in recent if v < rule.min_fraction * median)
    if slow >= rule.most * rule.window:
        return Finding(f"tokens/s below {rule.min_fraction:.0%} of this attempt's median ({median:.0f}) on "
                       f"{slow} of the last {rule.window} steps", {"median_tokens_per_s": median,
                                                                   "recent": recent[-5:], "slow": slow})
    mfus = [_num(r.get("mfu")) for r in list(h.rows)[-rule.window:]]
    low = sum(1 for v in mfus if rule.min_mfu is not None and v < rule.min_mfu)
    if low and low >= rule.most * rule.window:
        return Finding(f"MFU below {rule.min_mfu:.1%} on {low} of the last {rule.window} steps",
                       {"mfu": mfus[-5:], "min_mfu": rule.min_mfu})
    return None


def _stall(rule: Stall, h: History) -> Finding | None:
    idle = h.now - h.last_progress
    if idle <= rule.no_progress_s:
        return None
    last = int(h.rows[-1]["step"]) if h.rows else None
    return Finding(f"no training step for {idle:.0f} s (limit {rule.no_progress_s:g} s); last step {last}",
                   {"idle_s": idle, "last_step": last})


def eval_value(row: Mapping[str, Any], path: str) -> float:
    """The number at dotted ``path`` inside an eval row's ``eval`` object (NaN when absent)."""
    value: Any = row.get("eval")
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return _num(value)


def _eval_regressed(rule: EvalRegressed, h: History) -> Finding | None:
    values = [eval_value(r, rule.metric) for r in h.evals[-2:]]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    before, after = values
    if after <= before * (1 + rule.tolerance):
        return None
    return Finding(f"eval {rule.metric} regressed: {before:.4f} -> {after:.4f} (tolerance "
                   f"{rule.tolerance:.1%})", {"previous": before, "latest": after})


TRAIN_CHECKS: dict[str, Callable[[Any, History], Finding | None]] = {
    "loss_spike": _loss_spike, "level_shift": _level_shift, "nonfinite": _nonfinite,
    "grad_norm": lambda r, h: _norm(r, h, "grad_norm"),
    "update_norm": lambda r, h: _norm(r, h, "update_norm"),
    "guards": _guards, "skipped_steps": _skipped, "drop_rate": _drop_rate, "router_entropy": _router_entropy,
    "load_imbalance": _load_imbalance, "throughput": _throughput, "stall": _stall,
}
"""Rules evaluated on every train row (stall too: a row is progress and clears it)."""


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


def _risk_value(rp: RiskPoint, h: History, row: Mapping[str, Any]) -> float:
    if rp.metric.startswith("eval."):
        return eval_value(row, rp.metric[len("eval."):])
    return statistics.median(_finite(list(h.rows)[-rp.window:], rp.metric) or [math.nan])


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
        self._local = "://" not in output_dir or output_dir.startswith("file://")
        self._lines: list[str] = []
        self.history = History(facts, last_progress=clock(), now=clock())
        self.states = {name: _RuleState() for name in RULE_NAMES}
        self.events: list[dict[str, Any]] = []
        self._queue: list[dict[str, Any]] = []
        self._risks = [rp for rp in cfg.risk_points if rp.step_of(facts.num_steps) > start_step]
        self.step = start_step
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resolve_earlier(start_step)
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
                self._evaluate("eval_regressed", _eval_regressed)
                self._risk_points(row, evals=True)
            elif "loss" in row:
                h.rows.append(dict(row))
                h.steps_seen += 1
                h.last_progress = h.now
                h.tokens_per_s.append(_num(row.get("tokens_per_s")))
                if row.get("skipped"):
                    h.skips.append(h.now)
                for name, check in TRAIN_CHECKS.items():
                    self._evaluate(name, check)
                self._risk_points(row, evals=False)

    def tick(self, heartbeat: bool = True) -> None:
        """The time rules (no progress), then the heartbeat; called by the thread (tests call it directly)."""
        with self._lock:
            self.history.now = self.clock()
            self._evaluate("stall", _stall)
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

    def _evaluate(self, name: str, check: Callable[[Any, History], Finding | None]) -> None:
        rule: Rule = getattr(self.cfg, name)
        if not rule.enabled:
            return
        st, now = self.states[name], self.history.now
        finding = check(rule, self.history)
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
            if rp.metric.startswith("eval.") != evals or self.step < rp.step_of(self.facts.num_steps):
                continue
            self._risks.remove(rp)
            value = _risk_value(rp, self.history, row)
            ok = math.isfinite(value) and (rp.below is None or value < rp.below) and (
                rp.above is None or value > rp.above)
            bounds = " and ".join(b for b in (f"below {rp.below:g}" if rp.below is not None else "",
                                              f"above {rp.above:g}" if rp.above is not None else "") if b)
            where = f"{rp.at_fraction:.0%} of the run" if rp.at_fraction is not None else f"step {rp.at_step}"
            summary = (f"risk point {rp.name!r}: at {where} (step {self.step}) {rp.metric} = {value:.4f}, "
                       f"must be {bounds}" + ("" if ok else f"; else: {rp.action or '(no plan given)'}"))
            values = {"value": value, "below": rp.below, "above": rp.above, "action": rp.action}
            self._write("risk_passed" if ok else "risk_failed", f"{self.session}:risk:{rp.name}",
                        f"risk:{rp.name}", "risk_point", rp.severity, Finding(summary, values),
                        since_step=self.step, since=self.history.now, silenced=False)

    # -- files -----------------------------------------------------------------------------------------------

    def _write(self, event: str, event_id: str, rule: str, kind: str, severity: str, finding: Finding, *,
               since_step: int, since: float, silenced: bool, reason: str | None = None) -> dict[str, Any]:
        record = {"schema": SCHEMA, "event": event, "id": event_id, "rule": rule, "kind": kind,
                  "severity": severity, "summary": finding.summary, "values": _plain(finding.values),
                  "step": self.step, "since_step": since_step, "since": since, "time": self.history.now,
                  "attempt": self.attempt, "session": self.session, "host": self.host, "silenced": silenced,
                  "reason": reason}
        line = json.dumps(record) + "\n"
        if self._local:
            with self.fs.open(self.alerts_path, "a") as f:
                f.write(line)
        else:
            self._lines.append(line)
            with self.fs.open(self.alerts_path, "w") as f:
                f.writelines(self._lines)
        self.events.append(record)
        self._queue.append(record)
        self._heartbeat()
        return record

    def _heartbeat(self, closed: bool = False) -> None:
        state = {"schema": SCHEMA, "time": self.clock(), "step": self.step, "session": self.session,
                 "attempt": self.attempt, "host": self.host, "heartbeat_s": self.cfg.heartbeat_s,
                 "blind_after_s": self.cfg.blind_after_s, "closed": closed,
                 "active": [st.firing["id"] for st in self.states.values() if st.firing is not None]}
        tmp = f"{self.watch_path}.tmp-{self.session}"
        with self.fs.open(tmp, "w") as f:
            json.dump(state, f)
        self.fs.mv(tmp, self.watch_path)

    def _resolve_earlier(self, start_step: int) -> None:
        """Resolve the alerts an earlier attempt left firing (it died before closing its watcher)."""
        if not self.fs.exists(self.alerts_path):
            return
        with self.fs.open(self.alerts_path, "r") as f:
            self._lines = [line for line in f if line.strip()]
        open_alerts: dict[str, dict[str, Any]] = {}
        for line in self._lines:
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
