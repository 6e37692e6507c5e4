"""The noise model and the interval both fitted forms share (the offset law of ``fit.py`` and the two-variable
surface of ``surface.py``): a parametric bootstrap over the seeds' spread.

1. ``noise_sigma``: the standard deviation ``sigma`` of log L: the pooled within-budget spread of the seeds
   (``inputs.pooled_seed_sigma``), or, without repeated seeds, the fit's residual standard deviation
   (``sum r² / max(n - p, 1)``, p the free parameters). The returned source says which.
2. ``bootstrap_targets``: ``replicates`` data sets ``log L* = fitted + sigma·z`` (z standard normal from
   ``default_rng(seed)``, drawn row after row), which each form refits from its point fit.
3. ``interval``: the percentile interval of the refits' predictions at ``level`` (widened to contain the
   point), for the mean over seeds; with ``single_run`` both sides are widened in quadrature by
   ``z_level·sigma`` in log space: the interval for one new run.
"""

from __future__ import annotations

import math

import numpy as np

from operators.scaling.inputs import pooled_seed_sigma

SEED_SPREAD = "pooled seed spread"
RESIDUALS = "fit residuals (no repeated seeds)"


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


def bootstrap_targets(fitted: np.ndarray, sigma: float, replicates: int, seed: int) -> np.ndarray:
    """(replicates, n) bootstrap data sets of log L around ``fitted``."""
    rng = np.random.default_rng(seed)
    return fitted[None, :] + sigma * rng.standard_normal((replicates, fitted.size))


def interval(
    point: float, draws: np.ndarray, level: float, sigma: float, single_run: bool
) -> tuple[float, float, float]:
    """(point, low, high) from the bootstrap predictions ``draws`` (see the module docstring)."""
    tail = (1.0 - level) / 2.0
    lo, hi = (float(v) for v in np.quantile(draws, [tail, 1.0 - tail]))
    lo, hi = min(lo, point), max(hi, point)
    if not single_run:
        return point, lo, hi
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - tail))
    lo_h = math.hypot(math.log(point / lo), z * sigma)
    hi_h = math.hypot(math.log(hi / point), z * sigma)
    return point, point * math.exp(-lo_h), point * math.exp(hi_h)
