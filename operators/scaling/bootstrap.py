"""The noise model and the interval both fitted forms share (the offset law of ``fit.py`` and the two-variable
surface of ``surface.py``): a parametric bootstrap over the seeds' spread, studentized.

1. ``noise_sigma``: the standard deviation ``sigma`` of log L: the pooled within-budget spread of the seeds
   (``inputs.pooled_seed_sigma``), or, without repeated seeds, the fit's residual standard deviation
   (``sum r² / max(n - p, 1)``, p the free parameters). The returned source says which.
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

import enum
import math

import numpy as np

from operators.scaling.inputs import pooled_seed_sigma

SEED_SPREAD = "pooled seed spread"
RESIDUALS = "fit residuals (no repeated seeds)"
BOOTSTRAP_T = "parametric bootstrap-t (pivot studentized by each replicate's local standard error)"
BOOTSTRAP_T_SIGMA = "parametric bootstrap-t (studentized by each replicate's sigma)"
EPS_PER_REPLICATE = 16
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


def noise_sigma(
    y: np.ndarray, fitted: np.ndarray, groups: list[np.ndarray], n_free: int
) -> tuple[float, str]:
    """(sigma of log L, where it came from) for log losses ``y``, the fit's ``fitted`` log losses, the index
    groups of repeated seeds and the fit's number of free parameters."""
    sigma = pooled_seed_sigma(y, groups)
    if sigma is not None and sigma > 0:
        return sigma, SEED_SPREAD
    resid = y - fitted
    return float(math.sqrt(np.sum(resid**2) / max(y.size - n_free, 1))), RESIDUALS


def replicate_sigmas(
    ys: np.ndarray, boot_fitted: np.ndarray, groups: list[np.ndarray], n_free: int, source: str
) -> np.ndarray:
    """Each bootstrap data set's own sigma (rows of ``ys``, (B, n)), estimated as ``noise_sigma`` did for
    the data: the pooled seed spread, or the residual spread of that replicate's refit (``boot_fitted``)."""
    if source == SEED_SPREAD:
        ss, dof = np.zeros(ys.shape[0]), 0
        for g in groups:
            if len(g) > 1:
                block = ys[:, g]
                ss += np.sum((block - block.mean(axis=1, keepdims=True)) ** 2, axis=1)
                dof += len(g) - 1
        return np.asarray(np.sqrt(ss / dof))
    return np.asarray(np.sqrt(np.sum((ys - boot_fitted) ** 2, axis=1) / max(ys.shape[1] - n_free, 1)))


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
