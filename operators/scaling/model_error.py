"""The model-error term: how far the law itself misses when it extrapolates, measured on its ladder
(issue 34).

The bootstrap interval (:mod:`.bootstrap`) carries the noise of the runs through the law; it assumes the law
is right. On real ladders it is not quite (a bend past the top rung, a rung off the law, a schedule effect),
and an interval without that term covered 0.09-0.48 where the law was biased by 2%. So each fit measures
its own law's extrapolation error on its ladder, by a **rolling-origin backtest**:

- for each origin ``j`` (the smallest budgets that can be fitted on their own, then one more at a time, up
  to all but the top one), the law is fitted on the budgets up to ``j`` and predicts every later budget
  ``k``: an error ``e = log L_k - log pred_j(C_k)`` (``L_k`` the budget's mean over its runs, in log) at a
  distance of ``x = log10(C_k / C_j)`` decades from the centre ``C_j`` of the budgets fitted (their
  geometric mean: where the data pin the law down; a law's error grows with the distance from there, and is
  not 0 at the top rung, where a law bent by 1-2% still misses), with the variance the noise alone
  would give it, ``v = se_j(C_k)² + sigma²/m_k`` (the sub-fit's Gauss-Newton standard error of its
  extrapolation, and the noise of the ``m_k`` runs it is scored against);
- the model error per decade is estimated by moments, each backtest weighted by its precision ``w = 1/v``
  (a 3-budget sub-fit far out is mostly noise), ``tau_hat² = max(0, Σ w(e² - v)) / Σ w x²`` (the error
  beyond what noise explains, growing in proportion to the distance extrapolated), and **shrunk to a prior**
  ``TAU_PRIOR`` (0.25% of log L per decade) with ``TAU_PRIOR_WEIGHT`` (2) pseudo-backtests:
  ``tau² = (2·tau0² + n·tau_hat²) / (2 + n)`` for ``n`` backtests. A ladder too short for any backtest
  (3 budgets with E fitted) gets the prior: a stated rule, never a zero term.

At a forecast ``x = log10(C / C_from)`` decades past the centre of the fitted budgets (0 below it) the model
error's standard deviation in log L is ``tau·x``; :func:`widen` adds ``z·tau·x`` (``z`` the level's normal
quantile) in quadrature to each side of both intervals, the mean's and one run's. The record keeps it apart
from the noise: ``model_error`` (``tau_per_decade``, ``estimate``, ``backtests``, ``prior``...), and each
forecast point's ``model_error_log``.

**A floor where the backtests cannot see the law's error** (issue 34, rules ``issue-34/2`` and
``issue-34/3``): a ladder of one run per budget (no seeds, so the noise ``sigma`` is the residuals' scale)
scores each backtest against a noise variance made of the very scatter of its budgets about the law, so an
error of the law is read as noise and the moments estimate comes out 0 (on all ten one-run real ladders of the
calibration: they then missed 5 of 12 held-out runs). Such a fit takes ``tau = max(tau, TAU_FLOOR_NO_SEEDS)``:
the floor, recorded beside the estimate (``floor``, ``tau_shrunk``; ``tau_per_decade`` is what is applied). A
ladder with seeds measures its noise apart from the law and gets no floor. The floor's value is chosen on real
published ladders by a rule (``benchmarks/scaling_real.py``, docs/benchmarks/scaling-ladder.md: the value of a
fixed grid whose one-run interval covers a share of the one-run ladders' top-10% held-out runs nearest 90%,
the smallest among ties), and scored both on the data it was chosen on and out of sample, leaving one
published set out. That rule replaced "at least 90%" (rules ``issue-34/2``: 0.75%) after the latter's in-
sample coverage of 1.0 was seen, so it was not fixed before the data were: the out-of-sample figure is the one
to trust. """

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

TAU_PRIOR = 0.0025
"""The prior's model error, in log L per decade from the centre of the ladder (0.25%: 0.5% at a target a
decade past a two-decade ladder, the noise prior's size)."""
TAU_PRIOR_WEIGHT = 2.0
"""The prior's weight, in backtests: two, so a ladder with five or more backtests mostly speaks for itself."""
TAU_FLOOR_NO_SEEDS = 0.005
"""The model error's floor, in log L per decade, for a fit without seeds (the module docstring): the rule's
choice on both published sets' top-10% one-run ladders (seven forecasts; the grid value whose one-run
coverage of them is nearest 90%, the smallest among ties: 6 of 7). Scored on every held-out real run it
covers 0.946 of the top-10% and 0.889 of the >= 64x runs, the same as leaving one published set out
(chosen on the other set's ladders: 0.5% for Porian, 0.75% for Gadre). Until 2026-12-06 (evening) it was
0.75%, the smallest value covering at least 90% of the seven (all seven, whenever there are fewer than
ten), which covered every top-10% run it was chosen on (1.0; docs/benchmarks/scaling-ladder.md)."""
FLOOR_REASON = (
    "no seeds: the backtests score the law against the runs' own scatter about it, so they cannot see its "
    "error; the term takes the floor chosen on real published ladders"
)
METHOD = "rolling-origin backtest on the ladder, moments beyond the noise, per decade; shrunk to a prior"


@dataclasses.dataclass(frozen=True)
class Backtest:
    """One rolling-origin prediction: the centre of the origin's budgets, the budget predicted, the error in
    log L, the variance the noise alone gives it, and the distance in decades."""

    origin: float
    compute: float
    error_log: float
    noise_var: float

    @property
    def decades(self) -> float:
        return math.log10(self.compute / self.origin)

    def to_json(self) -> dict[str, float]:
        return {
            "origin": self.origin,
            "compute": self.compute,
            "error_log": self.error_log,
            "noise_var": self.noise_var,
            "decades": self.decades,
        }


@dataclasses.dataclass(frozen=True)
class ModelError:
    """The model-error term of one fit: ``tau`` per decade past ``c_from``, and how it was found."""

    tau: float
    estimate: float | None
    """The backtests' own estimate (None with no backtest)."""
    backtests: tuple[Backtest, ...]
    c_from: float
    """The centre (geometric mean) of the fitted budgets: distances are counted from it."""
    prior: float = TAU_PRIOR
    prior_weight: float = TAU_PRIOR_WEIGHT
    floor: float = 0.0
    """The floor on ``tau`` (``TAU_FLOOR_NO_SEEDS`` for a fit without seeds; 0 with seeds, and for a fit
    written before the floor existed)."""

    @property
    def applied(self) -> float:
        """The model error per decade the intervals use: the shrunk estimate, or the floor if larger."""
        return max(self.tau, self.floor)

    def with_prior(self, prior: float) -> ModelError:
        """The same backtests shrunk to another prior (what the real-data calibration compares)."""
        n = len(_usable(self.backtests))
        tau = prior if self.estimate is None else _shrunk(self.estimate, n, prior, self.prior_weight)
        return dataclasses.replace(self, tau=tau, prior=prior)

    def with_floor(self, floor: float) -> ModelError:
        """The same term under another floor (what the real-data calibration compares)."""
        return dataclasses.replace(self, floor=floor)

    def sd(self, compute: float) -> float:
        """The model error's standard deviation in log L at ``compute`` (0 below the ladder's centre)."""
        return self.applied * max(0.0, math.log10(compute / self.c_from))

    def to_json(self) -> dict[str, Any]:
        return {
            "method": METHOD,
            "tau_per_decade": self.applied,
            "tau_shrunk": self.tau,
            "estimate": self.estimate,
            "c_from": self.c_from,
            "prior": {"tau_per_decade": self.prior, "weight": self.prior_weight},
            "floor": {"tau_per_decade": self.floor, **({"why": FLOOR_REASON} if self.floor > 0 else {})},
            "backtests": [b.to_json() for b in self.backtests],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelError:
        prior = data.get("prior") or {}
        floor = data.get("floor") or {}
        return cls(
            tau=float(data.get("tau_shrunk", data["tau_per_decade"])),
            estimate=None if data.get("estimate") is None else float(data["estimate"]),
            backtests=tuple(
                Backtest(
                    float(b["origin"]), float(b["compute"]), float(b["error_log"]), float(b["noise_var"])
                )
                for b in data.get("backtests", [])
            ),
            c_from=float(data["c_from"]),
            prior=float(prior.get("tau_per_decade", TAU_PRIOR)),
            prior_weight=float(prior.get("weight", TAU_PRIOR_WEIGHT)),
            floor=float(floor.get("tau_per_decade", 0.0)),
        )


def _usable(backtests: Sequence[Backtest]) -> list[Backtest]:
    return [b for b in backtests if b.decades > 0 and math.isfinite(b.error_log)]


def _shrunk(tau_hat: float, n: int, prior: float, weight: float = TAU_PRIOR_WEIGHT) -> float:
    return math.sqrt((weight * prior**2 + n * tau_hat**2) / (weight + n))


def estimate(
    backtests: Sequence[Backtest], c_from: float, prior: float = TAU_PRIOR, *, seeds: bool = True
) -> ModelError:
    """The model error per decade from the backtests, shrunk to the prior; ``seeds=False`` (the noise is
    the residuals' scale) puts the floor under it (the module docstring)."""
    usable = _usable(backtests)
    floor = 0.0 if seeds else TAU_FLOOR_NO_SEEDS
    if not usable:
        return ModelError(prior, None, tuple(backtests), c_from, prior=prior, floor=floor)
    weights = [1.0 / max(b.noise_var, 1e-12) for b in usable]
    excess = sum(w * (b.error_log**2 - b.noise_var) for w, b in zip(weights, usable, strict=True))
    tau_hat = math.sqrt(
        max(0.0, excess) / sum(w * b.decades**2 for w, b in zip(weights, usable, strict=True))
    )
    tau = _shrunk(tau_hat, len(usable), prior)
    return ModelError(tau, tau_hat, tuple(backtests), c_from, prior=prior, floor=floor)


def widen(interval: tuple[float, float, float], sd: float, level: float) -> tuple[float, float, float]:
    """``(point, low, high)`` with ``z·sd`` (in log L) added in quadrature to each side's log width."""
    point, low, high = interval
    if sd <= 0:
        return interval
    z_sd = NormalDist().inv_cdf(0.5 + level / 2) * sd
    lp = math.log(point)
    down = math.hypot(lp - math.log(low), z_sd)
    up = math.hypot(math.log(high) - lp, z_sd)
    return point, math.exp(lp - down), math.exp(lp + up)
