"""The health rules: what each one watches, its defaults, and the check that says whether it is violated.

A rule is a frozen dataclass (its thresholds are fields, so a train step overrides them and they are
versioned with the experiment, docs/health.md) with one method, ``check(history) -> Finding | None``: a
:class:`Finding` (one sentence and the numbers behind it) when the rule is in violation on what the attempt
has seen so far, None when it is clear. ``applies(history)`` says whether the newest row is one the rule
judges at all (the pre-registered band only judges the evaluations at its points); a row it does not judge
leaves the rule's state as it was. ``rows`` says which rows a rule is evaluated on: ``train`` (every
training step), ``eval`` (every evaluation) or ``time`` (also from the watcher's thread).

The state machine around the checks (pending, resolution, silence, one firing per violation) and the files
it writes are in :mod:`moe_trainer.watch`, which also re-exports every name here.

Shapes the rules share are written once: two adjacent windows of a train metric compared
(:func:`windows`: level shift on the mean, norm growth on the median), the number of recent rows below a
floor (:func:`count_below`: throughput and MFU), and a value at a dotted path of an evaluation row
(:func:`eval_value`: the regression rule, the band and the risk points).

Why the file is past 400 lines: it is one table of fourteen rules, each a dataclass with its defaults and its
check; they read best side by side, and splitting them would only scatter that table.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

SEVERITIES = ("critical", "warning", "info")
HISTORY = 256  # train rows kept for the windowed rules (the longest default window is 64 + 8)


def fail(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"watch.{field}={value!r}: {fix}")


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


def num(x: Any) -> float:
    """A row value as a float (the trainer writes non-finite numbers as the strings "nan"/"inf")."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def finite(rows: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    values = (num(r.get(key)) for r in rows)
    return [v for v in values if math.isfinite(v)]


def eval_value(row: Mapping[str, Any], path: str) -> float:
    """The number at dotted ``path`` inside an eval row's ``eval`` object (NaN when absent)."""
    value: Any = row.get("eval")
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return num(value)


@dataclasses.dataclass
class History:
    """What this attempt has seen (bounded): the last train rows, throughput, skip times, evaluations."""

    facts: RunFacts
    rows: deque[dict[str, Any]] = dataclasses.field(default_factory=lambda: deque(maxlen=HISTORY))
    tokens_per_s: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=2048))
    skips: deque[tuple[float, int]] = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    """(time, step) of each skipped step."""
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steps_seen: int = 0
    last_progress: float = 0.0
    now: float = 0.0

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[-1]


def windows(h: History, key: str, window: int, reduce: Callable[[list[float]], float]
            ) -> tuple[float, float] | None:
    """``reduce`` of the ``window`` finite values of ``key`` before the last ``window``, and of the last
    ``window``; None until both windows are full."""
    values = finite(h.rows, key)[-2 * window:]
    if len(values) < 2 * window:
        return None
    return reduce(values[:window]), reduce(values[window:])


def count_below(rows: Iterable[Mapping[str, Any]], key: str, floor: float) -> tuple[int, list[float]]:
    """(how many of ``rows`` have ``key`` below ``floor``, the values)."""
    values = [num(r.get(key)) for r in rows]
    return sum(1 for v in values if v < floor), values


@dataclasses.dataclass(frozen=True)
class Rule:
    """What every rule has: whether it is on, how bad it is, how long before it fires, and its silence."""

    rows: ClassVar[str] = "train"
    """Which rows the rule is evaluated on: train, eval or time (train rows and the watcher's thread)."""

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
        name = type(self).__name__
        if self.severity not in SEVERITIES:
            fail(f"{name}.severity", self.severity, f"use one of {', '.join(SEVERITIES)}")
        if self.pending_steps < 1 or self.resolve_steps < 1:
            fail(f"{name}.pending_steps/resolve_steps", (self.pending_steps, self.resolve_steps), "use >= 1")
        if self.pending_s < 0 or self.silence_s < 0:
            fail(f"{name}.pending_s/silence_s", (self.pending_s, self.silence_s), "use >= 0")

    def applies(self, h: History) -> bool:
        """Whether the newest row is one this rule judges (a row it does not judge changes nothing)."""
        return True

    def check(self, h: History) -> Finding | None:
        raise NotImplementedError(type(self).__name__)


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

    def check(self, h: History) -> Finding | None:
        losses = finite(h.rows, "loss")[-(self.recent + self.trailing):]
        if len(losses) < self.recent + max(self.trailing // 2, 2):
            return None
        recent, trailing = losses[-self.recent:], losses[:-self.recent]
        floor, mean, std = min(recent), statistics.fmean(trailing), statistics.pstdev(trailing)
        threshold = mean + max(self.min_jump, self.sigma * std)
        if floor <= threshold:
            return None
        return Finding(f"loss floor over the last {self.recent} steps {floor:.4f} > trailing mean {mean:.4f} "
                       f"+ max({self.min_jump:g}, {self.sigma:g}σ = {self.sigma * std:.4f})",
                       {"floor": floor, "trailing_mean": mean, "trailing_std": std, "threshold": threshold})


@dataclasses.dataclass(frozen=True)
class LevelShift(Rule):
    """The mean loss of the last ``window`` steps above the mean of the ``window`` before by ``max_shift``."""

    window: int = 32
    max_shift: float = 1.0

    def check(self, h: History) -> Finding | None:
        found = windows(h, "loss", self.window, statistics.fmean)
        if found is None or found[1] - found[0] <= self.max_shift:
            return None
        before, after = found
        return Finding(f"mean loss of the last {self.window} steps {after:.4f} is {after - before:.4f} above "
                       f"the {self.window} before ({before:.4f}; limit {self.max_shift:g})",
                       {"mean_recent": after, "mean_before": before, "shift": after - before})


@dataclasses.dataclass(frozen=True)
class NonFinite(Rule):
    """A NaN or infinite loss or gradient norm (the step is skipped if health.skip_nonfinite is on)."""

    severity: str = "critical"

    def check(self, h: History) -> Finding | None:
        loss, grad = num(h.row.get("loss")), num(h.row.get("grad_norm"))
        if math.isfinite(loss) and math.isfinite(grad) and not h.row.get("nonfinite"):
            return None
        skipped = bool(h.row.get("skipped"))
        return Finding(f"non-finite training values: loss {loss}, grad_norm {grad} (skipped: {skipped})",
                       {"loss": str(loss), "grad_norm": str(grad), "skipped": skipped})


@dataclasses.dataclass(frozen=True)
class NormRule(Rule):
    """A norm (grad_norm before clipping, update_norm after update-norm clipping) above ``max_value``, or its
    median over the last ``window`` steps ``growth_factor`` times the median of the ``window`` before."""

    pending_steps: int = 8
    metric: str = "grad_norm"
    """The train-row field watched."""
    max_value: float | None = None
    """Absolute ceiling (None: off; Marin's hero runs used 2.0 for the gradient norm)."""
    window: int = 32
    growth_factor: float | None = 4.0
    """Growth of the windowed median that fires (None: off)."""

    def check(self, h: History) -> Finding | None:
        value = num(h.row.get(self.metric))
        if self.max_value is not None and value > self.max_value:
            return Finding(f"{self.metric} {value:.4g} > {self.max_value:g}",
                           {self.metric: value, "max": self.max_value})
        if self.growth_factor is None:
            return None
        found = windows(h, self.metric, self.window, statistics.median)
        if found is None or found[0] <= 0 or found[1] / found[0] <= self.growth_factor:
            return None
        before, after = found
        return Finding(f"median {self.metric} grew {after / before:.1f}x over {self.window} steps "
                       f"({before:.4g} -> {after:.4g}; limit {self.growth_factor:g}x)",
                       {"median_before": before, "median_recent": after, "growth": after / before})


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

    def _update_clipping(self, h: History) -> str | None:
        f, row = h.facts, h.row
        arm_at = max(f.update_window // 2, 2)
        if f.update_window < 2:
            return f"update-norm clipping is off (health.update_window={f.update_window})"
        if arm_at > f.num_steps >= self.min_steps:
            return (f"update-norm clipping can never act: it arms after {arm_at} applied updates and the "
                    f"run has {f.num_steps} steps (health.update_window={f.update_window})")
        if (row.get("update_filter_armed") is False and int(row.get("step", 0)) >= 2 * arm_at
                and f.num_steps >= self.min_steps):
            return (f"update-norm clipping is on but not acting: fewer than {arm_at} of {row.get('step')} "
                    "steps were applied, so its window never armed")
        return None

    def check(self, h: History) -> Finding | None:
        f = h.facts
        problems = [self._update_clipping(h) if self.require_update_clipping else None,
                    "skipping non-finite steps is off (health.skip_nonfinite=false)"
                    if self.require_skip_nonfinite and not f.skip_nonfinite else None,
                    "gradient clipping is off (health.max_grad_norm=null)"
                    if self.require_grad_clipping and f.max_grad_norm is None else None]
        found = [p for p in problems if p]
        if not found:
            return None
        values = {"update_window": f.update_window, "skip_nonfinite": f.skip_nonfinite,
                  "max_grad_norm": f.max_grad_norm}
        return Finding("; ".join(found), values)


@dataclasses.dataclass(frozen=True)
class SkipRate(Rule):
    """``max_skips`` or more skipped steps within ``window_s`` seconds (Marin: 3 in 15 minutes) and within
    the last ``window_steps`` steps: a burst, not the isolated skips of a fast run, for which 15 minutes is
    the whole run (a ladder's tiny runs skip about one step in 130, spread over thousands of steps)."""

    max_skips: int = 3
    window_s: float = 900.0
    window_steps: int = 100
    """Count only skips this many steps back or fewer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_skips < 1 or self.window_steps < 1 or not self.window_s > 0:
            fail("skipped_steps.max_skips/window_steps/window_s",
                 (self.max_skips, self.window_steps, self.window_s), "use >= 1, >= 1 and > 0")

    def check(self, h: History) -> Finding | None:
        step = int(h.row.get("step", 0))
        n = sum(1 for t, s in h.skips if t >= h.now - self.window_s and s > step - self.window_steps)
        if n < self.max_skips:
            return None
        return Finding(f"{n} skipped steps in the last {self.window_s:g} s and {self.window_steps} steps "
                       f"(limit {self.max_skips - 1})",
                       {"skipped": n, "window_s": self.window_s, "window_steps": self.window_steps})


@dataclasses.dataclass(frozen=True)
class DropRate(Rule):
    """MoE: the fraction of routing assignments dropped by expert capacity above ``max_rate``."""

    pending_steps: int = 5
    max_rate: float = 0.07
    """Marin: 7%, above the intermittent 5% spikes."""

    def check(self, h: History) -> Finding | None:
        rate = num(h.row.get("drop_rate"))
        if not rate > self.max_rate:
            return None
        return Finding(f"MoE drop rate {rate:.1%} > {self.max_rate:.1%} (capacity_factor "
                       f"{h.facts.capacity_factor})", {"drop_rate": rate, "max_rate": self.max_rate})


@dataclasses.dataclass(frozen=True)
class RouterEntropy(Rule):
    """MoE: the mean per-token router entropy of a layer below ``min_fraction`` of the uniform ln(E)."""

    pending_steps: int = 10
    min_fraction: float = 0.1

    def check(self, h: History) -> Finding | None:
        entropy = [num(e) for e in h.row.get("routing_entropy") or []]
        if h.facts.n_experts < 2 or not entropy:
            return None
        floor = self.min_fraction * math.log(h.facts.n_experts)
        low = {i: e for i, e in enumerate(entropy) if e < floor}
        if not low:
            return None
        worst = min(low, key=lambda i: low[i])
        return Finding(f"router entropy of layer {worst} is {low[worst]:.3f} nats < {floor:.3f} "
                       f"({self.min_fraction:g} x ln {h.facts.n_experts}) in {len(low)} layer(s)",
                       {"entropy": entropy, "floor": floor})


@dataclasses.dataclass(frozen=True)
class LoadImbalance(Rule):
    """MoE: a layer's busiest expert, as a fraction of the way from balance (max/mean = 1) to collapse
    (max/mean = E/top_k), above ``max_imbalance``."""

    pending_steps: int = 20
    max_imbalance: float = 0.75

    def check(self, h: History) -> Finding | None:
        collapse = h.facts.n_experts / max(h.facts.top_k, 1)
        if collapse <= 1:
            return None
        scores = []
        for layer in h.row.get("expert_load") or []:
            loads = [num(x) for x in layer]
            mean = statistics.fmean(loads) if loads else 0.0
            scores.append((max(loads) / mean - 1) / (collapse - 1) if mean > 0 else 0.0)
        if not scores or max(scores) <= self.max_imbalance:
            return None
        worst = max(range(len(scores)), key=scores.__getitem__)
        return Finding(f"expert load of layer {worst} is {scores[worst]:.0%} of the way to collapse "
                       f"(limit {self.max_imbalance:.0%})", {"imbalance": scores})


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

    def check(self, h: History) -> Finding | None:
        if h.steps_seen < self.warmup + self.window:
            return None
        history = list(h.tokens_per_s)
        median = statistics.median(history[self.warmup:] if len(history) > self.warmup + self.window
                                   else history)
        recent_rows = list(h.rows)[-self.window:]
        slow, recent = count_below(recent_rows, "tokens_per_s", self.min_fraction * median)
        if slow >= self.most * self.window:
            return Finding(f"tokens/s below {self.min_fraction:.0%} of this attempt's median ({median:.0f}) "
                           f"on {slow} of the last {self.window} steps",
                           {"median_tokens_per_s": median, "recent": recent[-5:], "slow": slow})
        if self.min_mfu is None:
            return None
        low, mfus = count_below(recent_rows, "mfu", self.min_mfu)
        if low and low >= self.most * self.window:
            return Finding(f"MFU below {self.min_mfu:.1%} on {low} of the last {self.window} steps",
                           {"mfu": mfus[-5:], "min_mfu": self.min_mfu})
        return None


@dataclasses.dataclass(frozen=True)
class Stall(Rule):
    """No new training step for ``no_progress_s`` seconds (checked by the watcher's thread)."""

    rows: ClassVar[str] = "time"
    severity: str = "critical"
    resolve_steps: int = 1
    no_progress_s: float = 900.0

    def check(self, h: History) -> Finding | None:
        idle = h.now - h.last_progress
        if idle <= self.no_progress_s:
            return None
        last = int(h.rows[-1]["step"]) if h.rows else None
        return Finding(f"no training step for {idle:.0f} s (limit {self.no_progress_s:g} s); last step "
                       f"{last}", {"idle_s": idle, "last_step": last})


@dataclasses.dataclass(frozen=True)
class EvalRegressed(Rule):
    """The newest evaluation worse than the previous one by more than ``tolerance`` (relative)."""

    rows: ClassVar[str] = "eval"
    resolve_steps: int = 1
    metric: str = "micro.bpb"
    """Path inside the eval row's ``eval`` object (lower is better)."""
    tolerance: float = 0.01

    def check(self, h: History) -> Finding | None:
        values = [eval_value(r, self.metric) for r in h.evals[-2:]]
        if len(values) < 2 or not all(math.isfinite(v) for v in values):
            return None
        before, after = values
        if after <= before * (1 + self.tolerance):
            return None
        return Finding(f"eval {self.metric} regressed: {before:.4f} -> {after:.4f} (tolerance "
                       f"{self.tolerance:.1%})", {"previous": before, "latest": after})


@dataclasses.dataclass(frozen=True)
class BandPoint:
    """One pre-registered evaluation point: at ``step`` the metric is predicted ``point`` within
    [``low``, ``high``]."""

    step: int
    point: float
    low: float
    high: float
    label: str = ""
    """How the forecast names the point (e.g. "25%": a fraction of the run)."""

    def __post_init__(self) -> None:
        if self.step < 1 or not all(math.isfinite(x) for x in (self.point, self.low, self.high)) or not (
                self.low <= self.point <= self.high):
            fail("eval_band.points", self, "give step >= 1 and finite low <= point <= high")


def _error_words(error: float, metric: str) -> str:
    """The signed error in words, as ``openlab_records.error_words`` says it (this library imports nothing
    outside itself; tests/records/test_one_story.py checks that the two agree)."""
    if not math.isfinite(error):
        return f"the run's {metric} could not be compared with the forecast"
    if round(error, 2) == 0:
        return f"the run's {metric} came out as forecast (within 0.005%)"
    way, fault = ("higher", "low") if error < 0 else ("lower", "high")
    return f"the run's {metric} came out {way} than forecast (the forecast was {abs(error):.2f}% too {fault})"


@dataclasses.dataclass(frozen=True)
class EvalBand(Rule):
    """An evaluation outside a pre-registered band: the evaluation at a band point's step must lie within
    [low, high] (for the scaling ladder's target, the 90% interval of its prediction.json, filled in by
    ``operators.scaling.band``). Evaluations at other steps are not judged; the next judged evaluation
    inside its band resolves the alert."""

    rows: ClassVar[str] = "eval"
    resolve_steps: int = 1
    silence_s: float = 0.0
    """No silence by default: each band point is its own pre-registered check, and a later point outside
    the band is the news even right after an earlier one resolved (the ninth real ladder's target left the
    band at 75% three minutes after it had come back in at 50%; under the rules' 30-minute default that
    firing was recorded as silenced and never posted)."""
    metric: str = "micro.bpb"
    """Path inside the eval row's ``eval`` object."""
    points: tuple[BandPoint, ...] = ()
    """The band, one point per evaluation step (empty: the rule judges nothing)."""
    source: str = ""
    """Where the band comes from (e.g. the prediction record's path and sha256), quoted in the alert."""

    def __post_init__(self) -> None:
        super().__post_init__()
        steps = [p.step for p in self.points]
        if len(set(steps)) != len(steps):
            fail("eval_band.points", steps, "give one band point per evaluation step")

    def _point(self, h: History) -> BandPoint | None:
        step = int(h.evals[-1].get("step", -1)) if h.evals else -1
        return next((p for p in self.points if p.step == step), None)

    def applies(self, h: History) -> bool:
        return self._point(h) is not None

    def check(self, h: History) -> Finding | None:
        p = self._point(h)
        if p is None:
            return None
        value = eval_value(h.evals[-1], self.metric)
        if math.isfinite(value) and p.low <= value <= p.high:
            return None
        # the signed forecast error, (predicted - actual) / actual, as the verdict and the engine state it
        # (openlab_records.error_pct; this library imports nothing outside itself, so it says it again)
        error = 100.0 * (p.point - value) / value if value and math.isfinite(value) else math.nan
        where = f" ({p.label} of the run)" if p.label else ""
        return Finding(f"eval {self.metric} at step {p.step}{where} is {value:.4f}, outside the "
                       f"pre-registered band [{p.low:.4f}, {p.high:.4f}] (predicted {p.point:.4f}; forecast "
                       f"error {error:+.2f}%: {_error_words(error, self.metric)})"
                       + (f"; band from {self.source}" if self.source else ""),
                       {"value": value, "point": p.point, "low": p.low, "high": p.high, "error_pct": error,
                        "label": p.label, "source": self.source or None})


@dataclasses.dataclass(frozen=True)
class RiskPoint:
    """A checkpoint declared in advance: at a point of the run a metric must lie within bounds, else the plan.

    ``metric`` is a train-row field (``loss``, ``drop_rate``...; the median of the last ``window`` rows is
    compared) or ``eval.<path>`` (the first evaluation at or after the point, e.g. ``eval.micro.bpb``). Give
    both bounds for a band of one point."""

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
        where = f"risk_points[{self.name}]"
        if (self.at_step is None) == (self.at_fraction is None):
            fail(where, (self.at_step, self.at_fraction), "give at_step or at_fraction")
        if self.at_fraction is not None and not 0 < self.at_fraction <= 1:
            fail(f"{where}.at_fraction", self.at_fraction, "use a fraction in (0, 1]")
        if self.below is None and self.above is None:
            fail(where, None, "give `below` and/or `above`")
        if self.severity not in SEVERITIES or self.window < 1:
            fail(where, (self.severity, self.window), f"severity in {SEVERITIES} and window >= 1")

    @property
    def on_eval(self) -> bool:
        return self.metric.startswith("eval.")

    def step_of(self, num_steps: int) -> int:
        if self.at_step is not None:
            return self.at_step
        return max(1, math.ceil(float(self.at_fraction or 0.0) * num_steps))

    def judge(self, h: History, row: Mapping[str, Any], step: int) -> tuple[bool, Finding]:
        """(passed, what to write) at ``step``, the first row at or after the point."""
        if self.on_eval:
            value = eval_value(row, self.metric[len("eval."):])
        else:
            value = statistics.median(finite(list(h.rows)[-self.window:], self.metric) or [math.nan])
        ok = math.isfinite(value) and (self.below is None or value < self.below) and (
            self.above is None or value > self.above)
        bounds = " and ".join(b for b in (f"below {self.below:g}" if self.below is not None else "",
                                          f"above {self.above:g}" if self.above is not None else "") if b)
        where = (f"{self.at_fraction:.0%} of the run" if self.at_fraction is not None
                 else f"step {self.at_step}")
        summary = (f"risk point {self.name!r}: at {where} (step {step}) {self.metric} = {value:.4f}, must be "
                   f"{bounds}" + ("" if ok else f"; else: {self.action or '(no plan given)'}"))
        return ok, Finding(summary, {"value": value, "below": self.below, "above": self.above,
                                     "action": self.action})
