"""The noise model and the interval both fitted forms share (the offset law of ``fit.py`` and the two-variable
surface of ``surface.py``): a parametric bootstrap over the seeds' spread, studentized.

1. ``noise_model`` (issue 34): the standard deviation ``sigma`` of log L. Repeated runs (the seeds of a
   budget,
   or of one (N, D) pair) set it by their pooled within-group spread (each group weighted by its degrees of
   freedom) only when they have at least ``SEED_DOF_MIN`` (3) degrees of freedom together; otherwise it is
   the **robust scale of the residuals**, consistent with the Huber fit: the scaled MAD of the ``n - p``
   largest absolute residuals (a Huber fit with delta 1e-3 passes through about ``p`` points, whose
   residuals are 0 by construction; the plain RMS it replaced was inflated 2-7x by a few outlying runs on
   real data). Either estimate, with ``dof`` degrees of freedom, is then **shrunk to a prior**
   ``SIGMA_PRIOR`` = 0.5% with ``SIGMA_PRIOR_DOF`` = 2 pseudo degrees of freedom:
   ``sigma² = (2·0.005² + dof·s²) / (2 + dof)``. So a ladder of 3 budgets of one run each (0 degrees of
   freedom, residuals exactly 0) gets sigma = 0.5% instead of 0 and a zero-width interval, and 4 rungs of
   one run (1 degree of freedom) cannot claim 0.1%. The record states the source, ``sigma_dof``, the raw
   ``sigma_estimate`` and ``sigma_prior``.
2. ``bootstrap_targets``: ``replicates`` data sets ``log L* = fitted + sigma·z`` (z standard normal from
   ``default_rng(seed)``, drawn row after row), which each form refits from its point fit;
   ``replicate_sigmas`` estimates each replicate's own ``sigma*`` the same way ``sigma`` was estimated.
3. ``interval``: a **bootstrap-t** interval in log space. The pivot ``t* = (log pred* - log point) / se*``
   divides each replicate's error by its own standard error: for the offset law the Gauss-Newton standard
   error of its extrapolation (``fit.local_se`` times the replicate's ``sigma*``), which is small where a
   fit's E makes the extrapolation insensitive and large where E is poorly pinned down; for the
   two-variable surface ``sigma*`` alone. Such a pivot is (nearly) free of the unknown parameters, so its
   quantiles carry what the plain percentile interval missed: ``sigma`` itself is estimated from few
   degrees of freedom (10 on a 5 x 3 ladder: a t quantile 10% wider than the normal one), the estimator is
   biased and skewed (the pivot is reflected, so a bias is subtracted rather than doubled), and how far a
   refit's prediction strays depends on the fit it starts from. The interval at ``level`` is
   ``[log point - q_hi(t*)·se, log point - q_lo(t*)·se]``, ``se`` the point fit's. With ``single_run`` the
   pivot also holds a new run's noise, ``t1* = (log pred* - log point - sigma·eps) / sqrt(se*² + sigma*²)``
   (``EPS_PER_REPLICATE`` seeded draws of eps per replicate), scaled back by ``sqrt(se² + sigma²)``: the
   interval for one new run, not the mean over seeds.
   On 200 synthetic replicates x 100 bootstrap draws (docs/benchmarks/scaling-ladder.md) the percentile
   interval covered 0.83 / 0.845 / 0.895 of three surfaces where 0.90 was asked; studentizing by ``sigma*``
   alone, 0.835 / 0.835 / 0.90; by the local standard error, 0.855 / 0.835 / 0.925. The percentile
   interval is no longer a method (fits written before 2026-12-02, without ``boot_sigma``, are refused by
   ``ScalingFit.from_json``); it remains only as the fallback when ``sigma`` is 0 (nothing to studentize by).
   The caller names the method (:class:`IntervalMethod`); its value is the text records carry in
   ``"interval"``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

INTERVAL_RULES = "issue-34/3"
"""The interval rules of this module: a robust sigma shrunk to a prior, the model-error term; without seeds,
the model error's floor (:mod:`.model_error`, 0.5% per decade) and the mean's interval carrying the runs'
scatter (:func:`mean_is_one_run`). Fit records write it as ``interval_rules``."""
INTERVAL_RULES_ISSUE34_SECOND = "issue-34/2"
"""The second rules of issue 34 (2026-12-06): as now, with a floor of 0.75% per decade (chosen by the rule
"coverage at least 90%"; the record holds the floor it used, ``model_error.floor``)."""
INTERVAL_RULES_ISSUE34_FIRST = "issue-34"
"""The first rules of issue 34 (2026-12-06): as now, but a fit without seeds had no floor on its model error
and its mean's interval left the runs' scatter out; a fit with seeds got the intervals it gets now."""
INTERVAL_RULES_V1 = "before-issue-34"
"""What a record without ``interval_rules`` was made under: sigma the plain residual RMS (or any repeats'
spread, even one pair's), no prior, no model-error term; shown as such by the readers."""
SEED_SPREAD = "pooled seed spread"
RESIDUALS = "robust scale of the fit residuals (too few repeated runs)"
BOOTSTRAP_T = "parametric bootstrap-t (pivot studentized by each replicate's local standard error)"
BOOTSTRAP_T_SIGMA = "parametric bootstrap-t (studentized by each replicate's sigma)"
MEAN_NO_SEEDS = (
    "no seeds: the runs' scatter about the law cannot be split into noise and the law's own lack of fit "
    "(that takes repeated runs), so the mean's interval carries all of it: it is the one-run interval"
)
MEAN_WITH_SEEDS = "the mean over seeds: the law's bootstrap-t interval and the model-error term"
EPS_PER_REPLICATE = 16
SIGMA_PRIOR = 0.005
"""The prior's sigma of log L (0.5%: the research note's per-seed noise, and about what the real CPU ladders'
seeds showed): what sigma is with no degrees of freedom (3 budgets of one run each)."""
SIGMA_PRIOR_DOF = 2.0
"""The prior's weight in degrees of freedom: 2 pseudo-residuals, so 10 real ones (a 5 x 3 ladder) dominate."""
SEED_DOF_MIN = 3
"""Repeated runs set sigma only with at least this many degrees of freedom; one duplicated pair (1)
does not."""
MAD_SCALE = 1.4826
"""The scaled MAD's factor: median |r| of a normal sample is 0.6745 sigma."""
SE_FLOOR = 0.05
"""No replicate's (nor the point fit's) standard error of the extrapolation is taken below this fraction of
its sigma: a fit on a bound has a local standard error of nearly 0, and the pivot divided by it overflowed."""
LOG_WIDTH_CAP = 5.0
"""Each side of an interval spans at most this much in log L (a factor of about 150): past it an interval
says nothing, and exp() of an unbounded pivot overflows."""


class IntervalMethod(enum.Enum):
    """How :func:`interval` turns the bootstrap predictions into an interval; ``value`` is the text a fit
    record writes in ``"interval"`` (unchanged from the constants above)."""

    BOOTSTRAP_T = BOOTSTRAP_T
    """Pivot studentized by each replicate's local standard error (the offset law)."""
    BOOTSTRAP_T_SIGMA = BOOTSTRAP_T_SIGMA
    """Pivot studentized by each replicate's sigma (the two-variable surface)."""


@dataclasses.dataclass(frozen=True)
class Noise:
    """The noise model of log L: ``sigma`` (what the bootstrap draws with), where the estimate came from, its
    degrees of freedom, the raw estimate (None with no degrees of freedom) and the prior it was shrunk to."""

    sigma: float
    source: str
    dof: int
    estimate: float | None
    prior: float = SIGMA_PRIOR
    prior_dof: float = SIGMA_PRIOR_DOF

    def to_json(self) -> dict[str, Any]:
        """The record's fields (``sigma_log`` is written by the fit itself)."""
        return {
            "sigma_source": self.source,
            "sigma_dof": self.dof,
            "sigma_estimate": self.estimate,
            "sigma_prior": {"sigma": self.prior, "dof": self.prior_dof},
        }


def mean_is_one_run(rules: str, noise: Noise | None) -> bool:
    """Whether a fit's interval for the mean is its one-run interval: under the current rules, when sigma is
    the residuals' scale (no seeds). Without repeated runs the scatter of the runs about the law is noise
    and lack of fit at once, and nothing in the data splits them (a lack-of-fit test needs pure error, i.e.
    repeats); the mean of many runs at a point can sit off the law by as much as one run does, so an
    interval for it narrower than one run's claims what the data cannot show. On real published runs the
    surface's misses at the top budgets were of one sign within a budget: a bias that no number of
    seeds would average away."""
    return rules == INTERVAL_RULES and noise is not None and noise.source != SEED_SPREAD


def mean_interval_text(rules: str, noise: Noise | None) -> str:
    """What a fit record says its mean's interval is (``mean_interval``)."""
    return MEAN_NO_SEEDS if mean_is_one_run(rules, noise) else MEAN_WITH_SEEDS


def noise_from_json(data: Mapping[str, Any]) -> Noise | None:
    """The noise model a fit record wrote (None for one written before issue 34, which has no
    ``sigma_dof``)."""
    if "sigma_dof" not in data:
        return None
    prior = data.get("sigma_prior") or {}
    return Noise(
        sigma=float(data["sigma_log"]),
        source=str(data["sigma_source"]),
        dof=int(data["sigma_dof"]),
        estimate=None if data.get("sigma_estimate") is None else float(data["sigma_estimate"]),
        prior=float(prior.get("sigma", SIGMA_PRIOR)),
        prior_dof=float(prior.get("dof", SIGMA_PRIOR_DOF)),
    )


def shrink(estimate: np.ndarray | float, dof: int) -> np.ndarray:
    """The estimate of sigma pooled with the prior, weighted by degrees of freedom:
    ``sqrt((nu0·s0² + dof·s²) / (nu0 + dof))`` (a scaled inverse-chi² prior's posterior mean of sigma²)."""
    est = np.asarray(estimate, dtype=float)
    return np.asarray(np.sqrt((SIGMA_PRIOR_DOF * SIGMA_PRIOR**2 + dof * est**2) / (SIGMA_PRIOR_DOF + dof)))


def robust_scale(resid: np.ndarray, n_free: int) -> np.ndarray:
    """Per row of residuals (B, n): the scaled MAD (1.4826 · median |r|) of the ``n - n_free`` largest
    absolute residuals. A Huber fit with a small threshold passes (nearly) through ``n_free`` points, like a
    least-absolute-deviations fit, so that many residuals are 0 by construction and carry no noise."""
    dof = resid.shape[-1] - n_free
    if dof <= 0:
        return np.zeros(resid.shape[:-1])
    largest = np.sort(np.abs(resid), axis=-1)[..., n_free:]
    return np.asarray(MAD_SCALE * np.median(largest, axis=-1))


def _seed_spread(ys: np.ndarray, groups: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """The pooled within-group standard deviation of each row of ``ys`` (B, n) and its degrees of freedom."""
    ss, dof = np.zeros(ys.shape[0]), 0
    for g in groups:
        if len(g) > 1:
            block = ys[:, g]
            ss += np.sum((block - block.mean(axis=1, keepdims=True)) ** 2, axis=1)
            dof += len(g) - 1
    return (np.sqrt(ss / dof) if dof else ss), dof


def noise_model(y: np.ndarray, fitted: np.ndarray, groups: list[np.ndarray], n_free: int) -> Noise:
    """The noise of log L for log losses ``y``, the fit's ``fitted`` log losses, the index groups of repeated
    runs (seeds of a budget, or of one (N, D) pair) and the fit's number of free parameters (see the module
    docstring): the repeats' pooled spread when they have at least ``SEED_DOF_MIN`` degrees of freedom, else
    the robust scale of the residuals; either way shrunk to the prior by degrees of freedom."""
    seeds, seed_dof = _seed_spread(y[None, :], groups)
    if seed_dof >= SEED_DOF_MIN:
        est, dof, source = float(seeds[0]), seed_dof, SEED_SPREAD
    else:
        dof = max(y.size - n_free, 0)
        est, source = float(robust_scale((y - fitted)[None, :], n_free)[0]), RESIDUALS
    sigma = float(shrink(est, dof))
    return Noise(sigma=sigma, source=source, dof=dof, estimate=est if dof else None)


def replicate_sigmas(
    ys: np.ndarray, boot_fitted: np.ndarray, groups: list[np.ndarray], n_free: int, noise: Noise
) -> np.ndarray:
    """Each bootstrap data set's own sigma (rows of ``ys``, (B, n)), estimated as :func:`noise_model` did for
    the data: the repeats' spread or the robust residual scale of that replicate's refit, shrunk alike."""
    if noise.source == SEED_SPREAD:
        est = _seed_spread(ys, groups)[0]
    else:
        est = robust_scale(ys - boot_fitted, n_free)
    return shrink(est, noise.dof)


def gauss_newton_se(jac: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``sqrt(g' (J'J)^-1 g)`` per row: J (B, n, p) the Jacobians of log L at the data points, g (B, p) the
    gradients at the prediction point. It is how strongly a fit's extrapolation amplifies unit noise (large
    where E is poorly pinned down); the bootstrap-t pivot of the offset law divides by it times sigma*."""
    info = np.einsum("bnp,bnq->bpq", jac, jac)
    ridge = 1e-10 * np.trace(info, axis1=1, axis2=2)[:, None, None] * np.eye(info.shape[-1])
    solved = np.linalg.solve(info + ridge, grad[..., None])[..., 0]
    return np.asarray(np.sqrt(np.maximum(np.einsum("bp,bp->b", grad, solved), 0.0)))


def bootstrap_targets(fitted: np.ndarray, sigma: float, replicates: int, seed: int) -> np.ndarray:
    """(replicates, n) bootstrap data sets of log L around ``fitted``."""
    rng = np.random.default_rng(seed)
    return fitted[None, :] + sigma * rng.standard_normal((replicates, fitted.size))


def interval(
    point: float,
    draws: np.ndarray,
    level: float,
    sigma: float,
    single_run: bool,
    method: IntervalMethod,
    *,
    boot_sigma: np.ndarray | None = None,
    rng_seed: int = 0,
    boot_se: np.ndarray | None = None,
    point_se: float | None = None,
) -> tuple[float, float, float]:
    """(point, low, high) from the bootstrap predictions ``draws`` by ``method`` (see the module docstring).

    ``BOOTSTRAP_T_SIGMA`` needs the replicates' ``boot_sigma``; ``BOOTSTRAP_T`` also the local standard
    errors of log pred (``boot_se`` per replicate, ``point_se`` at the point fit) that studentize the pivot.
    With ``sigma`` 0 (no spread to studentize by) the bootstrap-t methods give the percentile interval."""
    tail = (1.0 - level) / 2.0
    if boot_sigma is None:
        raise ValueError(f"interval({method.name}) needs boot_sigma (each replicate's sigma)")
    if method is IntervalMethod.BOOTSTRAP_T_SIGMA:
        boot_se, point_se = boot_sigma, sigma  # the pivot's scale is sigma itself
    elif boot_se is None or point_se is None:
        raise ValueError("interval(BOOTSTRAP_T) needs boot_se and point_se (the local standard errors)")
    if not sigma > 0:
        return _percentile(point, draws, tail)
    lp = math.log(point)
    # a replicate whose fit sits on a bound (E at 0 or at the smallest loss) extrapolates with a local
    # standard error of nearly 0; dividing by it made the pivot overflow (issue 34), so no scale is taken
    # below SE_FLOOR of the noise
    scale = np.maximum(boot_se, SE_FLOOR * np.maximum(boot_sigma, sigma))
    if single_run:
        eps = np.random.default_rng(rng_seed + 1).standard_normal((draws.size, EPS_PER_REPLICATE))
        run_scale = np.sqrt(scale**2 + boot_sigma**2)[:, None]
        pivot = ((np.log(draws)[:, None] - lp - sigma * eps) / run_scale).ravel()
        width = math.hypot(point_se, sigma)
    else:
        pivot = (np.log(draws) - lp) / scale
        width = max(point_se, SE_FLOOR * sigma)
    q_lo, q_hi = (float(v) for v in np.quantile(pivot, [tail, 1.0 - tail]))
    down, up = (min(max(v, 0.0), LOG_WIDTH_CAP) for v in (q_hi * width, -q_lo * width))
    return point, math.exp(lp - down), math.exp(lp + up)


def _percentile(point: float, draws: np.ndarray, tail: float) -> tuple[float, float, float]:
    """The percentile interval of ``draws`` (widened to contain the point): the bootstrap-t methods' fallback
    when ``sigma`` is 0, for the mean and for one run alike (a new run adds no noise when there is none)."""
    lo, hi = (float(v) for v in np.quantile(draws, [tail, 1.0 - tail]))
    return point, min(lo, point), max(hi, point)
