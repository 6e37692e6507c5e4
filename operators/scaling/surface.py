"""The two-variable surface ``L = E + A/N^alpha + B/D^beta`` and its compute-optimal allocation.

Used when a ladder varies both parameters N and tokens D (an IsoFLOP sweep): the research note and
Open-Athena's leave-one-budget-out results favour this full surface over Chinchilla's Approach 2 minima.
Fitted like Hoffmann et al. (2022) and Besiroglu et al. (2024): in the log-sum-exp form

    log L = LSE(a - alpha·log N, b - beta·log D, e),   A = exp(a), B = exp(b), E = exp(e)

minimising the summed Huber loss (delta = 1e-3) of the residuals in log L with L-BFGS-B (analytic gradient),
started from the best points of a variable-projection grid (for fixed exponents the surface is linear in
E, A, B: non-negative least squares), keeping the best. Intervals come from the same parametric bootstrap
over the seeds' spread as the offset law (:mod:`operators.scaling.bootstrap`; each replicate refitted
from the point fit).
A fixed E is allowed (recorded in the settings).

Compute-optimal allocation under C = 6·N·D (Hoffmann et al., App. D; data-scaling-eval.md §4.3):
``G = (alpha·A / (beta·B))^(1/(alpha+beta))``, ``N* = G·(C/6)^(beta/(alpha+beta))``, ``D* = C/(6·N*)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import minimize

from operators.scaling.bootstrap import (
    INTERVAL_RULES,
    SEED_SPREAD,
    IntervalMethod,
    Noise,
    bootstrap_targets,
    gauss_newton_se,
    interval,
    mean_interval_text,
    mean_is_one_run,
    noise_model,
    replicate_sigmas,
)
from operators.scaling.fit import FORM_SURFACE, FitSettings
from operators.scaling.inputs import LadderInputError, as_array, check_fixed_e
from operators.scaling.model_error import Backtest, ModelError, estimate, widen

EXPONENT_GRID = tuple(float(v) for v in np.linspace(0.05, 1.0, 20))
EXPONENT_BOUNDS = (1e-3, 3.0)
ORIGINS = (0.5, 0.625, 0.75, 0.875)
"""Where the rolling-origin backtests of the surface start: fractions of the sorted distinct computes."""


def compute_optimal(params: Mapping[str, float], compute: float) -> dict[str, float]:
    """N*, D*, L* and D*/N* for budget ``compute`` under ``E + A/N^alpha + B/D^beta`` and C = 6·N·D."""
    e, a, b, alpha, beta = (float(params[k]) for k in ("E", "A", "B", "alpha", "beta"))
    g = (alpha * a / (beta * b)) ** (1.0 / (alpha + beta))
    n_opt = g * (compute / 6.0) ** (beta / (alpha + beta))
    d_opt = compute / (6.0 * n_opt)
    loss = e + a / n_opt**alpha + b / d_opt**beta
    return {"N": n_opt, "D": d_opt, "L": loss, "tokens_per_param": d_opt / n_opt}


def surface_loss(params: Mapping[str, float], n: float, d: float) -> float:
    """``E + A/N^alpha + B/D^beta``."""
    return float(params["E"] + params["A"] / n ** params["alpha"] + params["B"] / d ** params["beta"])


def _log_model(t: np.ndarray, ln: np.ndarray, ld: np.ndarray, fixed_e: float | None) -> np.ndarray:
    a, b, alpha, beta = t[0], t[1], t[2], t[3]
    e = math.log(fixed_e) if fixed_e is not None else t[4]
    terms = np.stack([a - alpha * ln, b - beta * ld, np.full_like(ln, e)])
    if fixed_e == 0.0:
        terms = terms[:2]
    m = terms.max(axis=0)
    return np.asarray(m + np.log(np.exp(terms - m).sum(axis=0)))


def _jacobian(t: np.ndarray, ln: np.ndarray, ld: np.ndarray, fixed_e: float | None) -> np.ndarray:
    """d log L / d theta at each (N, D), (n, p): the LSE's softmax weights times each term's derivative."""
    e = math.log(fixed_e) if fixed_e else (t[4] if fixed_e is None else -np.inf)
    terms = np.stack([t[0] - t[2] * ln, t[1] - t[3] * ld, np.full_like(ln, e)])
    w = np.exp(terms - terms.max(axis=0))
    w /= w.sum(axis=0)
    cols = [w[0], w[1], -w[0] * ln, -w[1] * ld] + ([w[2]] if fixed_e is None else [])
    return np.stack(cols, axis=-1)


def _rolling_origin(
    ln: np.ndarray, ld: np.ndarray, y: np.ndarray, theta: np.ndarray, settings: FitSettings, sigma: float
) -> list[Backtest]:
    """The surface fitted on the runs up to each origin (the distinct computes at 1/2, 5/8, 3/4 and 7/8 of
    their sorted list, when that leaves enough runs), predicting every run past it: the model-error term's
    backtests (:mod:`.model_error`; distances in decades of 6·N·D)."""
    fe, compute = settings.fixed_e, 6.0 * np.exp(ln + ld)
    distinct = np.unique(compute)
    out: list[Backtest] = []
    for frac in ORIGINS:
        origin = float(distinct[int(frac * (distinct.size - 1))])
        keep, later = compute <= origin * (1 + 1e-9), np.flatnonzero(compute > origin * (1 + 1e-9))
        if keep.sum() < len(theta) + 2 or later.size == 0:
            continue
        sub = _fit_once(ln[keep], ld[keep], y[keep], settings.huber_delta, fe, [theta])
        centre = float(np.exp(np.mean(np.log(np.unique(compute[keep])))))
        jac = _jacobian(sub, ln[keep], ld[keep], fe)[None]
        for k in later:
            grad = _jacobian(sub, ln[k : k + 1], ld[k : k + 1], fe)
            se = float(gauss_newton_se(jac, grad)[0]) * sigma
            error = float(y[k] - _log_model(sub, ln[k : k + 1], ld[k : k + 1], fe)[0])
            out.append(Backtest(centre, float(compute[k]), error, se**2 + sigma**2))
    return out


def _objective(
    t: np.ndarray, ln: np.ndarray, ld: np.ndarray, y: np.ndarray, delta: float, fixed_e: float | None
) -> tuple[float, np.ndarray]:
    """Summed Huber loss of the log residuals and its analytic gradient (softmax weights of the LSE)."""
    a, b, alpha, beta = t[0], t[1], t[2], t[3]
    e = math.log(fixed_e) if fixed_e else (t[4] if fixed_e is None else -np.inf)
    terms = np.stack([a - alpha * ln, b - beta * ld, np.full_like(ln, e)])
    m = terms.max(axis=0)
    ex = np.exp(terms - m)
    total = ex.sum(axis=0)
    w = ex / total
    r = m + np.log(total) - y
    ar = np.abs(r)
    loss = float(np.sum(np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))))
    psi = np.clip(r, -delta, delta)
    grad = [np.sum(psi * w[0]), np.sum(psi * w[1]), -np.sum(psi * w[0] * ln), -np.sum(psi * w[1] * ld)]
    if fixed_e is None:
        grad.append(np.sum(psi * w[2]))
    return loss, np.array(grad)


def _fit_once(
    ln: np.ndarray,
    ld: np.ndarray,
    y: np.ndarray,
    delta: float,
    fixed_e: float | None,
    starts: Sequence[np.ndarray],
) -> np.ndarray:
    best: tuple[float, np.ndarray] | None = None
    bounds = [(None, None), (None, None), EXPONENT_BOUNDS, EXPONENT_BOUNDS]
    if fixed_e is None:
        bounds.append((None, None))
    for x0 in starts:
        res = minimize(
            _objective,
            x0,
            args=(ln, ld, y, delta, fixed_e),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12},
        )
        if np.isfinite(res.fun) and (best is None or res.fun < best[0]):
            best = (float(res.fun), res.x)
    if best is None:
        raise LadderInputError("no start of the two-variable fit converged to a finite loss; check inputs")
    return best[1]


def _starts(
    nn: np.ndarray, dd: np.ndarray, loss: np.ndarray, fixed_e: float | None, keep: int = 3
) -> list[np.ndarray]:
    """Starting points by variable projection: for each (alpha, beta) on a grid, the model is linear in
    (E, A, B), solved by non-negative least squares in linear space; the ``keep`` best become starts."""
    from scipy.optimize import nnls

    scored: list[tuple[float, np.ndarray]] = []
    target = loss - (fixed_e or 0.0)
    for alpha, beta in itertools.product(EXPONENT_GRID, EXPONENT_GRID):
        cols = [nn**-alpha, dd**-beta] + ([np.ones_like(nn)] if fixed_e is None else [])
        design = np.stack(cols, axis=1)
        coef, rnorm = nnls(design, target)
        a, b = (math.log(max(v, 1e-12)) for v in coef[:2])
        theta = [a, b, alpha, beta] + ([math.log(max(coef[2], 1e-6))] if fixed_e is None else [])
        scored.append((float(rnorm), np.array(theta)))
    scored.sort(key=lambda item: item[0])
    return [theta for _, theta in scored[:keep]]


@dataclasses.dataclass(frozen=True)
class SurfaceFit:
    """A fitted two-variable surface; ``predict`` takes a budget (compute-optimal) or ``n=`` and ``d=``."""

    settings: FitSettings
    n: np.ndarray
    d: np.ndarray
    loss: np.ndarray
    theta: np.ndarray
    boot_theta: np.ndarray
    sigma: float
    sigma_source: str
    boot_sigma: np.ndarray
    """Each bootstrap replicate's own sigma (the bootstrap-t pivot's scale)."""
    noise: Noise | None = None
    """The noise model's figures (degrees of freedom, raw estimate, prior)."""
    model_error: ModelError | None = None
    """The model-error term (:mod:`.model_error`), added to both intervals."""

    @staticmethod
    def _params_of(t: np.ndarray, fixed_e: float | None) -> dict[str, float]:
        e = fixed_e if fixed_e is not None else math.exp(t[4])
        return {
            "E": float(e),
            "A": math.exp(t[0]),
            "B": math.exp(t[1]),
            "alpha": float(t[2]),
            "beta": float(t[3]),
        }

    @property
    def params(self) -> dict[str, float]:
        """E, A, B, alpha and beta of ``E + A/N^alpha + B/D^beta``."""
        return self._params_of(self.theta, self.settings.fixed_e)

    def _nd(self, c: float | None, n: float | None, d: float | None) -> tuple[float, float]:
        if n is not None and d is not None:
            return float(n), float(d)
        if c is None:
            raise ValueError("predict needs a compute budget c (compute-optimal N and D) or both n= and d=")
        opt = compute_optimal(self.params, c)
        return opt["N"], opt["D"]

    def predict(
        self,
        c: float | None = None,
        *,
        n: float | None = None,
        d: float | None = None,
        single_run: bool = False,
    ) -> tuple[float, float, float]:
        """(point, low, high) at (n, d), or at the compute-optimal allocation of budget ``c``."""
        nn, dd = self._nd(c, n, d)
        ln, ld = np.array([math.log(nn)]), np.array([math.log(dd)])
        fe = self.settings.fixed_e
        point = float(np.exp(_log_model(self.theta, ln, ld, fe)[0]))
        draws = np.array([np.exp(_log_model(t, ln, ld, fe)[0]) for t in self.boot_theta])
        noise_only = interval(
            point,
            draws,
            self.settings.level,
            self.sigma,
            single_run or mean_is_one_run(INTERVAL_RULES, self.noise),
            self.interval_method,
            boot_sigma=self.boot_sigma,
            rng_seed=self.settings.rng_seed,
        )
        return widen(noise_only, self.model_error_sd(6.0 * nn * dd), self.settings.level)

    def model_error_sd(self, compute: float) -> float:
        """The model error's standard deviation in log L at 6·N·D = ``compute`` (0 without the term)."""
        return 0.0 if self.model_error is None else self.model_error.sd(compute)

    @property
    def interval_method(self) -> IntervalMethod:
        """The bootstrap-t pivot studentized by each replicate's sigma."""
        return IntervalMethod.BOOTSTRAP_T_SIGMA

    def to_json(self) -> dict[str, Any]:
        """The fit as plain JSON (parameters, noise model, settings)."""
        return {
            "form": self.settings.form,
            "formula": "L = E + A / N^alpha + B / D^beta",
            "params": self.params,
            "settings": dataclasses.asdict(self.settings),
            "sigma_log": self.sigma,
            "sigma_source": self.sigma_source,
            **(self.noise.to_json() if self.noise is not None else {}),
            "interval_rules": INTERVAL_RULES,
            **({"model_error": self.model_error.to_json()} if self.model_error is not None else {}),
            "interval": self.interval_method.value,
            "mean_interval": mean_interval_text(INTERVAL_RULES, self.noise),
            "fixed_e": self.settings.fixed_e is not None,
        }


def _distinct_runs(nn: np.ndarray, dd: np.ndarray, needed: int) -> list[np.ndarray]:
    """Indices per distinct (N, D) configuration (its seeds); at least ``needed`` (the free parameters)."""
    _, inverse = np.unique(np.stack([nn, dd], axis=1), axis=0, return_inverse=True)
    groups = [np.flatnonzero(inverse.reshape(-1) == g) for g in range(int(inverse.max()) + 1)]
    if len(groups) < needed:
        raise LadderInputError(
            f"only {len(groups)} distinct (N, D) configurations; the two-variable surface "
            f"needs at least {needed}: add configurations (an IsoFLOP sweep varies both)"
        )
    return groups


def fit_surface(
    n: Sequence[float] | np.ndarray,
    d: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    settings: FitSettings,
) -> SurfaceFit:
    """Fit the surface to one (N, D, loss) triple per run (see the module docstring); ``settings.form`` must
    be :data:`operators.scaling.fit.FORM_SURFACE`."""
    if settings.form != FORM_SURFACE:
        raise LadderInputError(
            f"fit_surface got FitSettings(form={settings.form!r}); pass "
            f"FitSettings(form={FORM_SURFACE!r}, ...) "
            "(the offset power law in C is operators.scaling.fit.fit_offset)"
        )
    y_loss = as_array("loss", loss)
    nn, dd = as_array("n", n, y_loss.size), as_array("d", d, y_loss.size)
    groups = _distinct_runs(nn, dd, 3 if settings.fixed_e is not None else 5)
    check_fixed_e(settings.fixed_e, float(y_loss.min()))
    ln, ld, y = np.log(nn), np.log(dd), np.log(y_loss)
    fe = settings.fixed_e
    theta = _fit_once(ln, ld, y, settings.huber_delta, fe, _starts(nn, dd, y_loss, fe))
    fitted = _log_model(theta, ln, ld, fe)
    noise = noise_model(y, fitted, groups, theta.size)
    sigma = noise.sigma
    ys = bootstrap_targets(fitted, sigma, settings.bootstrap, settings.rng_seed)
    boot = np.array([_fit_once(ln, ld, y_star, settings.huber_delta, fe, [theta]) for y_star in ys])
    boot_fitted = np.array([_log_model(t, ln, ld, fe) for t in boot])
    boot_sigma = replicate_sigmas(ys, boot_fitted, groups, theta.size, noise)
    return SurfaceFit(
        settings=settings,
        n=nn,
        d=dd,
        loss=y_loss,
        theta=theta,
        boot_theta=boot,
        sigma=float(sigma),
        sigma_source=noise.source,
        boot_sigma=boot_sigma,
        noise=noise,
        model_error=estimate(
            _rolling_origin(ln, ld, y, theta, settings, sigma),
            float(np.exp(np.mean(np.log(np.unique(6.0 * nn * dd))))),
            seeds=noise.source == SEED_SPREAD,
        ),
    )


__all__ = ["SurfaceFit", "compute_optimal", "fit_surface", "surface_loss"]
