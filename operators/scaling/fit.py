"""The scaling-law fitter: ``L = E + A·C^(-alpha)`` (or ``E + A/N^a + B/D^b``), Huber on log L, intervals.

    from operators.scaling import FitSettings, fit_offset
    fit = fit_offset([...], [...], FitSettings())      # compute and loss: one entry per rung and seed
    point, low, high = fit.predict(1e13)               # the 90% interval at compute 1e13
    fit.params                                         # {"E": ..., "A": ..., "alpha": ...}

**Form and loss.** The offset power law is fitted in the parametrisation ``log L = log(E + exp(k - alpha·u))``
with ``u = log(C / C_ref)`` (``C_ref`` the geometric mean of the budgets, which keeps ``k`` well conditioned),
minimising the *summed* Huber loss of the residuals in log L with ``delta = 1e-3`` (Besiroglu et al. 2024,
arXiv 2404.10102, who attribute Chinchilla's misfit partly to averaging). Bounds ``0 <= E < min L`` and
``1e-3 <= alpha <= 5``; the point fit runs a batched Levenberg-Marquardt from a grid of E and alpha, then
polishes the best start with scipy's bounded trust-region solver. A fixed E (Marin's habit) is allowed and
stated in :attr:`ScalingFit.settings`.

**Interval: parametric bootstrap-t over the seeds' spread.** The pooled within-budget standard deviation
``sigma`` of log L (the seeds of one budget differ only by their seeds) is the noise model: each replicate
draws ``log L* = fitted + sigma·z`` at every measured point and refits (a vectorised Levenberg-Marquardt with
Huber weights, warm-started at the point fit), and estimates its own ``sigma*`` from its draws. The
quantiles of the studentized pivot ``(log pred* - log point) / se*`` (``se*`` that replicate's Gauss-Newton
standard error of the extrapolation, :func:`local_se` times ``sigma*``) bound the 90% interval *of the
mean over seeds* (:mod:`operators.scaling.bootstrap`: this carries the uncertainty of ``sigma`` itself, 10
degrees of freedom on a 5 x 3 ladder, the estimator's bias and skew, and how the spread of the refits
depends on the fit they start from, which the plain percentile interval missed: 0.83-0.895 coverage where
0.90 was asked); ``predict(c, single_run=True)`` adds a new
run's noise to the pivot, the interval for one new run at ``c`` (what a single target run is scored
against). Without enough repeated seeds ``sigma`` is the robust scale of the fit's residuals, and either is
shrunk to a stated prior (:func:`operators.scaling.bootstrap.noise_model`, recorded in ``sigma_source``,
``sigma_dof``, ``sigma_prior``); each replicate's ``sigma*`` is estimated alike. Both intervals then add the
model-error term (:mod:`operators.scaling.model_error`: a rolling-origin backtest of the law on the ladder,
recorded as ``model_error``; without seeds it has a floor). Without seeds the mean's interval is the
one-run interval: nothing in the data splits the runs' scatter into noise and the law's lack of fit
(:func:`operators.scaling.bootstrap.mean_is_one_run`). The test suite checks 0.85-0.95 coverage
on a fixed set of replicates; ``benchmarks/scaling_ladder.py`` on 200 replicates of three surfaces.

**Leave-one-rung-out.** With at least four budgets (three with a fixed E) the law is refitted without each
budget; :meth:`ScalingFit.loo` gives those refits' predictions, whose spread says how much one rung moves the
forecast (Open-Athena's check of Delphi).

(About 480 lines: the batched solver, the point fit and the fit object with its record state are one
unit; splitting them would spread the parametrisation over three files.)

The two-variable surface (:func:`operators.scaling.surface.fit_surface`, same :class:`FitSettings` with
``form=FORM_SURFACE``) lives in :mod:`operators.scaling.surface`; the input checks in
:mod:`operators.scaling.inputs`; the noise model and interval both forms share in
:mod:`operators.scaling.bootstrap`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from operators.scaling.bootstrap import (
    INTERVAL_RULES,
    INTERVAL_RULES_V1,
    SEED_SPREAD,
    IntervalMethod,
    Noise,
    bootstrap_targets,
    gauss_newton_se,
    interval,
    mean_interval_text,
    mean_is_one_run,
    noise_from_json,
    noise_model,
    replicate_sigmas,
)
from operators.scaling.inputs import (
    LadderInputError,
    as_array,
    check_budgets,
    check_decreasing,
    check_fixed_e,
    check_not_a_sweep,
)
from operators.scaling.model_error import Backtest, ModelError, estimate, widen

FORM_OFFSET = "offset_power_law"
FORM_SURFACE = "two_variable"
ALPHA_BOUNDS = (1e-3, 5.0)
E_GRID = (0.0, 0.25, 0.5, 0.75, 0.9)
ALPHA_GRID = (0.05, 0.15, 0.3, 0.6, 1.0)


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """How a law was fitted (all of it goes into the prediction record)."""

    form: str = FORM_OFFSET
    huber_delta: float = 1e-3
    bootstrap: int = 1000
    rng_seed: int = 0
    level: float = 0.9
    fixed_e: float | None = None
    min_budgets: int = 3

    def __post_init__(self) -> None:
        if self.form not in (FORM_OFFSET, FORM_SURFACE):
            raise ValueError(f"form={self.form!r} must be {FORM_OFFSET!r} or {FORM_SURFACE!r}")
        if not self.huber_delta > 0:
            raise ValueError(f"huber_delta={self.huber_delta} must be > 0")
        if self.bootstrap < 20:
            raise ValueError(
                f"bootstrap={self.bootstrap} replicates are too few for the bootstrap interval; "
                "use >= 20 (1000 for a record)"
            )
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"level={self.level} must be in (0, 1), e.g. 0.9")
        if self.fixed_e is not None and not (math.isfinite(self.fixed_e) and self.fixed_e >= 0):
            raise ValueError(f"fixed_e={self.fixed_e} must be a finite value >= 0, or None to fit E")
        if self.min_budgets < 3:
            raise ValueError(f"min_budgets={self.min_budgets} must be >= 3 (the law has three parameters)")


# ---- the model in log space ------------------------------------------------------------------------------


def _unpack(theta: np.ndarray, fixed_e: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E, k, alpha) from parameter rows (B, 3), or (B, 2) with E fixed."""
    if fixed_e is None:
        return theta[..., 0], theta[..., 1], theta[..., 2]
    return np.full(theta.shape[:-1], fixed_e), theta[..., 0], theta[..., 1]


def _log_model(theta: np.ndarray, u: np.ndarray, fixed_e: float | None) -> tuple[np.ndarray, np.ndarray]:
    """log L at ``u`` for each parameter row (B, n), and the Jacobian (B, n, p)."""
    e, k, a = _unpack(theta, fixed_e)
    power = np.exp(np.minimum(k[..., None] - a[..., None] * u, 700.0))
    total = e[..., None] + power
    jac = [power / total, -u * power / total]
    if fixed_e is None:
        jac.insert(0, 1.0 / total)
    return np.log(total), np.stack(jac, axis=-1)


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.asarray(np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)))


def _clip(theta: np.ndarray, e_max: float, fixed_e: float | None) -> np.ndarray:
    out = theta.copy()
    if fixed_e is None:
        out[..., 0] = np.clip(out[..., 0], 0.0, e_max)
    out[..., -1] = np.clip(out[..., -1], *ALPHA_BOUNDS)
    return out


def refit_batch(
    theta0: np.ndarray,
    u: np.ndarray,
    y: np.ndarray,
    *,
    delta: float,
    fixed_e: float | None,
    e_max: np.ndarray | float,
    iters: int = 60,
) -> np.ndarray:
    """Minimise the summed Huber loss of log residuals for B data sets at once (rows of ``y``, (B, n)).

    Levenberg-Marquardt on iteratively reweighted least squares (weight min(1, delta/|r|)), started at
    ``theta0`` (B, p); each row keeps its own damping and accepts a step only if its loss went down."""
    theta = _clip(theta0.copy(), float(np.max(e_max)), fixed_e)
    e_cap = np.broadcast_to(np.asarray(e_max, dtype=float), theta.shape[:1])
    if fixed_e is None:
        theta[:, 0] = np.minimum(theta[:, 0], e_cap)
    lam = np.full(theta.shape[0], 1e-3)
    model, jac = _log_model(theta, u, fixed_e)
    cost = _huber(model - y, delta).sum(axis=1)
    for _ in range(iters):
        r = model - y
        w = np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300))
        jtw = jac * w[..., None]
        h = np.einsum("bnp,bnq->bpq", jtw, jac)
        g = np.einsum("bnp,bn->bp", jtw, r)
        damp = h + lam[:, None, None] * (
            np.eye(h.shape[-1]) * np.diagonal(h, axis1=1, axis2=2)[:, None, :] + 1e-12 * np.eye(h.shape[-1])
        )
        step = np.linalg.solve(damp, -g[..., None])[..., 0]
        cand = _clip(theta + step, float(np.max(e_cap)), fixed_e)
        if fixed_e is None:
            cand[:, 0] = np.minimum(cand[:, 0], e_cap)
        cand_model, cand_jac = _log_model(cand, u, fixed_e)
        cand_cost = _huber(cand_model - y, delta).sum(axis=1)
        ok = np.isfinite(cand_cost) & (cand_cost < cost)
        gain = np.where(ok, cost - cand_cost, 0.0)
        theta[ok], model[ok], jac[ok], cost[ok] = cand[ok], cand_model[ok], cand_jac[ok], cand_cost[ok]
        lam = np.where(ok, lam / 3.0, lam * 4.0)
        # a row is done when its damping exploded (no descent left) or its last step gained almost nothing
        if np.all((lam > 1e8) | (ok & (gain <= 1e-14 * np.maximum(cost, 1e-30)))):
            break
    return theta


def local_se(theta: np.ndarray, u: np.ndarray, u_c: np.ndarray, fixed_e: float | None) -> np.ndarray:
    """Per unit noise, the Gauss-Newton standard error of log L at ``u_c`` for each parameter row of
    ``theta`` (B, p), from the Jacobians at the data points ``u`` (:func:`bootstrap.gauss_newton_se`)."""
    return gauss_newton_se(_log_model(theta, u, fixed_e)[1], _log_model(theta, u_c, fixed_e)[1][:, 0, :])


def _point_fit(u: np.ndarray, y: np.ndarray, delta: float, fixed_e: float | None) -> np.ndarray:
    """The best of a grid of starts (E fractions of min L x alpha values), each run by the batched
    Levenberg-Marquardt, then polished by scipy's bounded trust-region solver from the best one."""
    lmin = float(np.exp(y.min()))
    check_fixed_e(fixed_e, lmin)
    e_max = lmin * (1.0 - 1e-6)
    e_starts = (fixed_e,) if fixed_e is not None else tuple(f * lmin for f in E_GRID)
    starts = []
    for e0 in e_starts:
        for a0 in ALPHA_GRID:
            k0 = float(np.mean(np.log(np.exp(y) - e0) + a0 * u))
            starts.append([k0, a0] if fixed_e is not None else [e0, k0, a0])
    batch = refit_batch(
        np.array(starts),
        u,
        np.broadcast_to(y, (len(starts), y.size)).copy(),
        delta=delta,
        fixed_e=fixed_e,
        e_max=e_max,
    )
    costs = _huber(_log_model(batch, u, fixed_e)[0] - y, delta).sum(axis=1)
    if not np.isfinite(costs).any():
        raise LadderInputError("no start of the fit converged to a finite loss; check the inputs")
    x0 = batch[int(np.nanargmin(np.where(np.isfinite(costs), costs, np.inf)))]
    lo = [-np.inf, ALPHA_BOUNDS[0]] if fixed_e is not None else [0.0, -np.inf, ALPHA_BOUNDS[0]]
    hi = [np.inf, ALPHA_BOUNDS[1]] if fixed_e is not None else [e_max, np.inf, ALPHA_BOUNDS[1]]
    x0 = np.clip(x0, np.array(lo) + 1e-12, np.array(hi) - 1e-12)

    def resid(t: np.ndarray) -> np.ndarray:
        return np.asarray(_log_model(t[None, :], u, fixed_e)[0][0] - y)

    sol = least_squares(
        resid,
        x0,
        loss="huber",
        f_scale=delta,
        bounds=(lo, hi),
        method="trf",
        x_scale="jac",
        xtol=1e-14,
        ftol=1e-14,
        gtol=1e-14,
        max_nfev=500,
    )
    polished = np.asarray(sol.x)  # scipy's OptimizeResult is untyped
    return polished if _huber(resid(polished), delta).sum() <= _huber(resid(x0), delta).sum() else x0


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """A fitted law with its interval machinery. Build it with :func:`fit_offset`."""

    settings: FitSettings
    compute: np.ndarray
    loss: np.ndarray
    c_ref: float
    theta: np.ndarray
    boot_theta: np.ndarray
    sigma: float
    sigma_source: str
    loo_theta: tuple[tuple[float, np.ndarray], ...]
    boot_sigma: np.ndarray
    """Each bootstrap replicate's own sigma (the bootstrap-t pivot's scale)."""
    noise: Noise | None = None
    """The noise model's figures (degrees of freedom, raw estimate, prior); None for a fit read back from a
    record written under the old interval rules (before issue 34), which had none."""
    rules: str = INTERVAL_RULES
    """The interval rules the fit was made under (``INTERVAL_RULES_V1`` for a fit.json written before issue
    34: sigma the plain residual RMS or any repeats' spread, no prior, no model-error term)."""
    model_error: ModelError | None = None
    """The model-error term (:mod:`.model_error`), added to both intervals; None for a fit written under the
    old interval rules."""

    @property
    def interval_method(self) -> IntervalMethod:
        """The bootstrap-t pivot studentized by each replicate's local standard error."""
        return IntervalMethod.BOOTSTRAP_T

    @property
    def params(self) -> dict[str, float]:
        """E, A and alpha of ``L = E + A·C^(-alpha)`` (C in the units given)."""
        e, k, a = (float(v) for v in _unpack(self.theta, self.settings.fixed_e))
        return {"E": e, "A": math.exp(k + a * math.log(self.c_ref)), "alpha": a}

    def _u(self, c: float) -> np.ndarray:
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"predict: compute {c!r} must be a positive number")
        return np.array([math.log(c / self.c_ref)])

    def point(self, c: float) -> float:
        """The fitted law at compute ``c``."""
        return float(np.exp(_log_model(self.theta[None, :], self._u(c), self.settings.fixed_e)[0][0, 0]))

    def predict(self, c: float, *, single_run: bool = False) -> tuple[float, float, float]:
        """(point, low, high): the law at ``c`` and its interval at ``settings.level``; for the mean over
        seeds, or (``single_run``) for one new run, widened by the seeds' spread. A fit without seeds gives
        the mean the one-run interval (:func:`operators.scaling.bootstrap.mean_is_one_run`)."""
        fe, u_c = self.settings.fixed_e, self._u(c)
        draws = np.exp(_log_model(self.boot_theta, u_c, fe)[0][:, 0])
        u = np.log(self.compute / self.c_ref)
        noise_only = interval(
            self.point(c),
            draws,
            self.settings.level,
            self.sigma,
            single_run or mean_is_one_run(self.rules, self.noise),
            self.interval_method,
            boot_sigma=self.boot_sigma,
            rng_seed=self.settings.rng_seed,
            boot_se=local_se(self.boot_theta, u, u_c, fe) * self.boot_sigma,
            point_se=float(local_se(self.theta[None, :], u, u_c, fe)[0]) * self.sigma,
        )
        return widen(noise_only, self.model_error_sd(c), self.settings.level)

    def model_error_sd(self, c: float) -> float:
        """The model error's standard deviation in log L at compute ``c`` (0 for a fit without the term)."""
        return 0.0 if self.model_error is None else self.model_error.sd(c)

    def loo(self, c: float) -> list[dict[str, float]]:
        """Leave-one-budget-out: each refit's prediction at ``c`` (empty when there are too few budgets)."""
        u = self._u(c)
        return [
            {
                "left_out": left,
                "prediction": float(np.exp(_log_model(t[None, :], u, self.settings.fixed_e)[0][0, 0])),
            }
            for left, t in self.loo_theta
        ]

    def residuals(self) -> np.ndarray:
        """log L minus the fitted log L at every input point."""
        u = np.log(self.compute / self.c_ref)
        return np.asarray(np.log(self.loss) - _log_model(self.theta[None, :], u, self.settings.fixed_e)[0][0])

    def to_json(self, *, full: bool = False) -> dict[str, Any]:
        """The fit as plain JSON (parameters, noise model, residuals, settings); ``full`` adds what
        :meth:`from_json` needs to predict again (inputs, raw parameters, bootstrap and leave-one-out
        fits)."""
        out: dict[str, Any] = {
            "form": self.settings.form,
            "formula": "L = E + A * C^(-alpha)",
            "params": self.params,
            "settings": dataclasses.asdict(self.settings),
            "sigma_log": self.sigma,
            "sigma_source": self.sigma_source,
            **(self.noise.to_json() if self.noise is not None else {}),
            "interval_rules": self.rules,
            **({"model_error": self.model_error.to_json()} if self.model_error is not None else {}),
            "interval": self.interval_method.value,
            "mean_interval": mean_interval_text(self.rules, self.noise),
            "c_ref": self.c_ref,
            "residuals_log": [float(r) for r in self.residuals()],
            "fixed_e": self.settings.fixed_e is not None,
        }
        if full:
            out["state"] = {
                "compute": self.compute.tolist(),
                "loss": self.loss.tolist(),
                "theta": self.theta.tolist(),
                "boot_theta": self.boot_theta.tolist(),
                "loo_theta": [[left, t.tolist()] for left, t in self.loo_theta],
                "boot_sigma": self.boot_sigma.tolist(),
            }
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScalingFit:
        """The fit written by ``to_json(full=True)``."""
        if "state" not in data:
            raise ValueError("ScalingFit.from_json needs the output of to_json(full=True) (no 'state' key)")
        st = data["state"]
        if "boot_sigma" not in st:
            raise ValueError(
                "ScalingFit.from_json: the fit's state has no 'boot_sigma' (each bootstrap replicate's "
                "sigma): it was written before 2026-12-02 with the percentile interval, which is no longer "
                "read; re-run the fit step (or fit_offset) to get a fit with the bootstrap-t interval"
            )
        return cls(
            settings=FitSettings(**data["settings"]),
            compute=np.asarray(st["compute"]),
            loss=np.asarray(st["loss"]),
            c_ref=float(data["c_ref"]),
            theta=np.asarray(st["theta"]),
            boot_theta=np.asarray(st["boot_theta"]),
            sigma=float(data["sigma_log"]),
            sigma_source=str(data["sigma_source"]),
            loo_theta=tuple((float(left), np.asarray(t)) for left, t in st["loo_theta"]),
            boot_sigma=np.asarray(st["boot_sigma"]),
            noise=noise_from_json(data),
            rules=str(data.get("interval_rules", INTERVAL_RULES_V1)),
            model_error=ModelError.from_json(data["model_error"]) if "model_error" in data else None,
        )


def fit_offset(
    compute: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    settings: FitSettings,
    *,
    leave_one_out: bool = True,
    n: Sequence[float] | np.ndarray | None = None,
) -> ScalingFit:
    """Fit ``L = E + A·C^(-alpha)`` to one (compute, loss) pair per rung and seed; see the module docstring.

    ``settings.form`` must be :data:`FORM_OFFSET` (the two-variable surface is
    :func:`operators.scaling.surface.fit_surface`). Raises :class:`LadderInputError` for inputs that must
    not be fitted (see :mod:`operators.scaling.inputs`). ``leave_one_out=False`` skips the
    leave-one-rung-out refits (simulations that need only the interval; not a setting: the record's
    ``loo`` is then empty). ``n``, each run's parameter count when known, only checks that the runs of one
    budget are one model size (seeds), not an IsoFLOP sweep."""
    if settings.form != FORM_OFFSET:
        raise LadderInputError(
            f"fit_offset got FitSettings(form={settings.form!r}); it fits {FORM_OFFSET!r}: use "
            "operators.scaling.surface.fit_surface for the two-variable surface, or FitSettings() here"
        )
    y_loss = as_array("loss", loss)
    c = as_array("compute", compute, n=y_loss.size)
    sizes = None if n is None else as_array("n", n, n=y_loss.size)
    return _fit_offset(c, y_loss, settings, leave_one_out, sizes)


def _fit_offset(
    c: np.ndarray, loss: np.ndarray, settings: FitSettings, leave_one_out: bool, n: np.ndarray | None
) -> ScalingFit:
    groups = check_budgets(c, settings.min_budgets)
    check_not_a_sweep(c, loss, groups, n)
    check_decreasing(c, loss, groups)
    c_ref = float(np.exp(np.mean(np.log([c[g[0]] for g in groups]))))
    u, y = np.log(c / c_ref), np.log(loss)
    theta = _point_fit(u, y, settings.huber_delta, settings.fixed_e)
    fitted = _log_model(theta[None, :], u, settings.fixed_e)[0][0]
    noise = noise_model(y, fitted, groups, theta.size)
    sigma = noise.sigma
    ys = bootstrap_targets(fitted, sigma, settings.bootstrap, settings.rng_seed)
    e_max = np.exp(ys.min(axis=1)) * (1.0 - 1e-6)
    boot = refit_batch(
        np.repeat(theta[None, :], settings.bootstrap, axis=0),
        u,
        ys,
        delta=settings.huber_delta,
        fixed_e=settings.fixed_e,
        e_max=e_max,
    )
    boot_fitted = _log_model(boot, u, settings.fixed_e)[0]
    boot_sigma = replicate_sigmas(ys, boot_fitted, groups, theta.size, noise)
    loo: list[tuple[float, np.ndarray]] = []
    enough = leave_one_out and len(groups) - 1 >= (3 if settings.fixed_e is None else 2)
    for j, g in enumerate(groups if enough else []):
        keep = np.concatenate([h for i, h in enumerate(groups) if i != j])
        loo.append((float(c[g[0]]), _point_fit(u[keep], y[keep], settings.huber_delta, settings.fixed_e)))
    return ScalingFit(
        settings=settings,
        compute=c,
        loss=loss,
        c_ref=c_ref,
        theta=theta,
        boot_theta=boot,
        sigma=float(sigma),
        sigma_source=noise.source,
        loo_theta=tuple(loo),
        boot_sigma=boot_sigma,
        noise=noise,
        model_error=estimate(
            _rolling_origin(c, u, y, groups, settings, sigma), c_ref, seeds=noise.source == SEED_SPREAD
        ),
    )


def _rolling_origin(
    c: np.ndarray, u: np.ndarray, y: np.ndarray, groups: list[np.ndarray], settings: FitSettings, sigma: float
) -> list[Backtest]:
    """The law fitted on the smallest budgets (3, or 2 with E fixed; then one more at a time), predicting
    every larger budget: the model-error term's backtests (:mod:`.model_error`)."""
    fe, first = settings.fixed_e, 3 if settings.fixed_e is None else 2
    out = []
    for j in range(first, len(groups)):
        keep = np.concatenate(groups[:j])
        theta = _point_fit(u[keep], y[keep], settings.huber_delta, fe)
        centre = float(np.exp(np.mean([math.log(c[h[0]]) for h in groups[:j]])))
        for g in groups[j:]:
            u_k = u[g[:1]]
            predicted = float(_log_model(theta[None, :], u_k, fe)[0][0, 0])
            se = float(local_se(theta[None, :], u[keep], u_k, fe)[0]) * sigma
            error = float(np.mean(y[g])) - predicted
            out.append(Backtest(centre, float(c[g[0]]), error, se**2 + sigma**2 / len(g)))
    return out
