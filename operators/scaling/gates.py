"""Every gate of a scaling ladder: a check that can flag a forecast before its target runs.

Gates are recorded, never enforced: the record and its comment say what flagged, and a person decides whether
to run the target anyway. Each is a :class:`Gate` (which check, where, whether it flagged, what it found in
words); the prediction record's ``warnings`` are the messages of the gates that flagged.

- ``residual`` (per evaluation point, from the fit step): the fit's largest residual in units of the seeds'
  spread; flags above 3.
- ``backtest_top_rung`` (per point, from the fit step): the law fitted without the top rung, asked to predict
  it; flags when it misses by more than max(1%, 2·SE), and when that sub-fit is degenerate (a parameter on
  a bound of its range, or an interval that is not a positive range: ``degenerate``, ``reason``), which
  says the rungs below the top do not pin the law down (issue 34: such a sub-fit once crashed the gate).
- ``late_drop`` (the endpoint): the target's fall from the point before the end to the end, as the forecast
  implies it, against each rung's measured fall there; flags when it exceeds every rung's (in the third to
  eighth real ladders no target fell over the WSD decay by more than the top rungs did, and every forecast
  that implied more ended 1.9-9.2% below its target: docs/benchmarks/scaling-ladder.md).
- ``loo_spread`` (the endpoint): the leave-one-rung-out forecasts span more than the limit (5% by default) of
  the point: the law is not pinned down by the rungs. Only the endpoint is gated: at early points the
  schedule, not the law, dominates.
- ``learning_rate`` (per rung with a learning-rate check): the rule's run ends more than the tolerance above
  the best multiple tried. One formula for the gap, :func:`rule_gap`: ``(rule - best) / best``. The
  target's own check (:mod:`.lrcheck`) is not a gate: it runs after the forecast is frozen and writes a note
  on the record, sharing :func:`rule_gap` and :data:`LR_CHECK_TOLERANCE` with this one.

The figures stay in the layout records have always had (the fit's ``gates`` per point, ``late_drop`` in the
endpoint's gates, ``lr_check.by_rung``), so every record written before this module reads the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from operators.scaling.fit import ALPHA_BOUNDS, FitSettings, ScalingFit, fit_offset
from operators.scaling.surface import EXPONENT_BOUNDS, SurfaceFit

LR_CHECK_TOLERANCE = 0.003
"""The rule's learning rate holds when its run ends within this fraction of the best multiple's loss (the
research note: about 0.3%); the rungs' check and the target's (:mod:`.lrcheck`) share it."""
RESIDUAL_LIMIT_SIGMAS = 3.0
BOUND_TOL = 1e-4
"""A fitted parameter within this relative distance of a bound of its range is taken to sit on it."""


@dataclasses.dataclass(frozen=True)
class Gate:
    """One check of a forecast: ``name`` (the list in the module docstring), ``where`` (a point's label or a
    rung), whether it flagged, and what it found, in words (the record's warning when it flagged)."""

    name: str
    where: str
    flag: bool
    message: str


def rule_gap(rule: float, best: float) -> float:
    """How far the rule's learning rate ended above the best multiple tried, as a fraction of the best."""
    return (rule - best) / best


# ---- the fit step's gates, per evaluation point ---------------------------------------------------------


def fit_gates(fit: ScalingFit, compute: np.ndarray, value: np.ndarray) -> dict[str, Any]:
    """The residual and top-rung backtest figures of one fraction's fit (recorded in fit.json), ``fit`` being
    the law through (``compute``, ``value``). The backtest refits with the fit's settings (its E, Huber
    threshold and seed) on 200 replicates, and reads its standard error off the 90% interval."""
    resid = fit.residuals() / max(fit.sigma, 1e-12)
    backtest = dataclasses.replace(fit.settings, bootstrap=200, level=0.9)
    return {
        "max_abs_residual_sigmas": float(np.max(np.abs(resid))),
        "residual_flag": bool(np.max(np.abs(resid)) > RESIDUAL_LIMIT_SIGMAS),
        "backtest_top_rung": _backtest_top_rung(compute, value, backtest),
    }


def _backtest_top_rung(compute: np.ndarray, value: np.ndarray, settings: FitSettings) -> dict[str, Any]:
    top = compute.max()
    keep = compute < top * (1 - 1e-9)
    if len(np.unique(compute[keep])) < 3:
        return {"ran": False}
    sub = fit_offset(compute[keep], value[keep], settings, leave_one_out=False)
    actual = float(np.mean(value[~keep]))
    point, low, high = sub.predict(float(top))
    error = point / actual - 1
    out: dict[str, Any] = {"ran": True, "predicted": point, "actual": actual, "error": error}
    reason = degenerate_reason(sub.params, float(np.min(value[keep])), settings.fixed_e is not None)
    if reason is None and not (0 < low <= point <= high < math.inf):
        reason = f"its interval [{low!r}, {high!r}] is not a positive range around {point!r}"
    if reason is not None:  # a sub-fit on a bound says nothing about the law: the gate fires, with the cause
        return {**out, "flag": True, "degenerate": True, "reason": reason}
    se = (math.log(high) - math.log(low)) / (2 * 1.645)  # the half-width of a 90% interval is 1.645 se
    return {**out, "flag": abs(error) > max(0.01, 2 * se)}


def degenerate_reason(params: Mapping[str, float], smallest_loss: float, fixed_e: bool) -> str | None:
    """Why an offset-law fit sits on a bound of its parameters (E at 0 or at the smallest loss, alpha at
    either end of its range), in words; None when it does not."""
    e, alpha = params["E"], params["alpha"]
    if not fixed_e and e <= BOUND_TOL * smallest_loss:
        return f"E = {e:.3g} sits on its lower bound 0 (a pure power law: the rungs do not pin E down)"
    if not fixed_e and e >= smallest_loss * (1 - BOUND_TOL):
        return f"E = {e:.5g} sits on its upper bound, the smallest loss {smallest_loss:.5g}"
    low, high = ALPHA_BOUNDS
    if alpha <= low * (1 + BOUND_TOL) or alpha >= high * (1 - BOUND_TOL):
        return f"alpha = {alpha:.4g} sits on a bound of its range [{low:g}, {high:g}]"
    return None


# ---- the rungs' learning-rate check ------------------------------------------------------------------------


def rung_lr_check(rows: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, Any] | None:
    """The learning-rate check at the rungs that have one. ``rows``: one per check run (``rung``, ``seed``,
    ``multiple``, its end ``value`` and its seed's ``rule_value``, None when the rule's run is missing).
    Several seeds are compared by their means over the seeds the check ran on."""
    if not rows:
        return None
    by_rung = {}
    for rung in sorted({r["rung"] for r in rows}):
        mine = [r for r in rows if r["rung"] == rung and r["rule_value"] is not None]
        if mine:
            by_rung[rung] = _rung_gap(mine, tolerance)
    return {
        "runs": list(rows),
        "by_rung": by_rung,
        "tolerance": tolerance,
        "passed": all(v["held"] for v in by_rung.values()),
    }


def _rung_gap(mine: list[Mapping[str, Any]], tolerance: float) -> dict[str, Any]:
    seeds = sorted({r["seed"] for r in mine})
    rule = {r["seed"]: r["rule_value"] for r in mine}
    rule_mean = float(np.mean([rule[s] for s in seeds]))
    means = {
        m: float(np.mean([r["value"] for r in mine if r["multiple"] == m]))
        for m in sorted({r["multiple"] for r in mine})
    }
    best_multiple, best = min(means.items(), key=lambda kv: kv[1])
    gap = rule_gap(rule_mean, min(best, rule_mean))
    out: dict[str, Any] = {
        "rule_gap": gap,
        "held": gap <= tolerance,
        "seeds": len(seeds),
        "rule_mean": rule_mean,
        "means": {f"{m:g}": v for m, v in means.items()},
        "best_multiple": best_multiple if best < rule_mean else 1.0,
    }
    if len(seeds) > 1:
        # the seeds' spread of the rule's runs as a fraction of its mean: the gap's standard error is about
        # sqrt(2) times this (two means of len(seeds) runs each), so a gap below it is noise
        spread = float(np.std([rule[s] for s in seeds], ddof=1))
        out["mean_se"] = spread / math.sqrt(len(seeds)) / rule_mean
    return out


# ---- the endpoint's gates ----------------------------------------------------------------------------


def rung_falls(runs: Sequence[Mapping[str, Any]], start: float, end: float) -> dict[str, list[float]]:
    """Each rung's falls (one per seed, the rule's runs only) between fractions ``start`` and ``end``; runs
    without a value at either fraction are left out."""
    keys = (f"{start:g}", f"{end:g}")
    falls: dict[str, list[float]] = {}
    for r in runs:
        if r["lr_multiple"] == 1.0 and all(k in r["values"] for k in keys):
            falls.setdefault(r["rung"], []).append(r["values"][keys[0]] - r["values"][keys[1]])
    return falls


def late_drop_gate(
    points: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The target's fall between its last two points as the forecast implies it (the point before minus the
    end), against each rung's measured fall there (the mean over its seeds): ``flag`` when it is larger than
    every rung's. None when there is no earlier point or no rung has both values."""
    if len(points) < 2:
        return None
    prev, end = points[-2], points[-1]
    falls = rung_falls(runs, prev["fraction"], end["fraction"])
    if not falls:
        return None
    rungs = {rung: sum(v) / len(v) for rung, v in falls.items()}
    top = max(rungs, key=lambda rung: rungs[rung])
    implied = prev["point"] - end["point"]
    return {
        "from": prev["label"],
        "implied": implied,
        "rungs": rungs,
        "rung_max": top,
        "flag": implied > rungs[top],
    }


# ---- every gate of a forecast, in words ------------------------------------------------------------------


def _point_gates(p: Mapping[str, Any]) -> list[Gate]:
    gates = p.get("gates") or {}
    found = []
    if "max_abs_residual_sigmas" in gates:
        found.append(
            Gate(
                "residual",
                p["label"],
                bool(gates.get("residual_flag")),
                f"{p['label']}: a residual of {gates['max_abs_residual_sigmas']:.1f} sigma (above 3)",
            )
        )
    back = gates.get("backtest_top_rung") or {}
    if back.get("ran"):
        found.append(
            Gate(
                "backtest_top_rung",
                p["label"],
                bool(back.get("flag")),
                f"{p['label']}: the fit without the top rung is degenerate: {back['reason']}"
                if back.get("degenerate")
                else f"{p['label']}: the fit without the top rung misses it by {back['error']:+.1%}",
            )
        )
    return found


def _endpoint_gates(end: Mapping[str, Any], loo_spread_limit: float) -> list[Gate]:
    found = []
    late = (end.get("gates") or {}).get("late_drop") or {}
    if late:
        top = late["rung_max"]
        found.append(
            Gate(
                "late_drop",
                end["label"],
                bool(late["flag"]),
                f"{end['label']}: the forecast has the target falling by {late['implied']:.3f} from "
                f"{late['from']} to the end, more than any rung fell there (at most "
                f"{late['rungs'][top]:.3f}, {top}): the end law extrapolates a late gain no rung showed",
            )
        )
    spread = end.get("loo_spread_rel")
    if spread is not None:
        found.append(
            Gate(
                "loo_spread",
                end["label"],
                spread > loo_spread_limit,
                f"{end['label']}: leaving one rung out moves the prediction over {spread:.1%} of the point "
                f"(limit {loo_spread_limit:.0%}): the law is not pinned down by the rungs",
            )
        )
    return found


def _lr_gates(lr_check: Mapping[str, Any] | None) -> list[Gate]:
    found = []
    for rung, v in sorted(((lr_check or {}).get("by_rung") or {}).items()):
        seeds = v.get("seeds", 1)
        noise = (
            f"; the rule's mean has a standard error of {v['mean_se']:.1%}, so a gap under about "
            f"{math.sqrt(2) * v['mean_se']:.1%} is the seeds' noise"
            if "mean_se" in v
            else ""
        )
        found.append(
            Gate(
                "learning_rate",
                rung,
                not v["held"],
                f"learning-rate check at {rung}: the rule is {v['rule_gap']:.1%} worse than the best "
                f"multiple tried ({seeds} seed{'s' if seeds != 1 else ''}{noise})",
            )
        )
    return found


def ladder_gates(
    points: Sequence[Mapping[str, Any]], lr_check: Mapping[str, Any] | None, loo_spread_limit: float
) -> list[Gate]:
    """Every gate of a forecast, flagged or not, in the order the record lists its warnings."""
    per_point = [g for p in points for g in _point_gates(p)]
    return [*per_point, *_endpoint_gates(points[-1], loo_spread_limit), *_lr_gates(lr_check)]


def ladder_warnings(
    points: Sequence[Mapping[str, Any]], lr_check: Mapping[str, Any] | None, loo_spread_limit: float
) -> list[str]:
    """The messages of the gates that flagged (the prediction record's ``warnings``)."""
    return [g.message for g in ladder_gates(points, lr_check, loo_spread_limit) if g.flag]


# ---- the two-variable surface's gates (issue 34) ----------------------------------------------------------

BOOT_AT_BOUND_LIMIT = 0.1
"""The surface's ``bootstrap_at_bounds`` gate fires when more than this fraction of its replicates put an
exponent on a bound."""


def _at_bound(value: np.ndarray | float, bounds: tuple[float, float]) -> np.ndarray:
    low, high = bounds
    v = np.asarray(value)
    return np.asarray((v <= low * (1 + BOUND_TOL)) | (v >= high * (1 - BOUND_TOL)))


def surface_gates(fit: SurfaceFit) -> list[Gate]:
    """Every gate of a two-variable surface fit, flagged or not: ``law_not_decreasing`` (a term whose
    coefficient or exponent vanishes: the law stops falling in N or in D), ``e_above_data`` (E above the
    smallest observed loss less two sigma: the runs sit on the floor, or their losses were read before the
    end of a decay), ``exponent_at_bound`` and ``bootstrap_at_bounds`` (more than 10% of the replicates
    with an exponent on a bound)."""
    p, lmin = fit.params, float(fit.loss.min())
    dead = [
        k
        for k, c, x in (("N", "A", "alpha"), ("D", "B", "beta"))
        if p[c] < 1e-9 or p[x] <= 1e-3 * (1 + BOUND_TOL)
    ]
    e_limit = lmin * math.exp(-2 * fit.sigma)
    on_bound = [k for k in ("alpha", "beta") if _at_bound(p[k], EXPONENT_BOUNDS)]
    boot = np.asarray(fit.boot_theta)[:, 2:4]
    frac = float(np.mean(_at_bound(boot, EXPONENT_BOUNDS).any(axis=1))) if boot.size else 0.0
    return [
        Gate(
            "law_not_decreasing",
            "surface",
            bool(dead),
            f"the surface does not fall with {' or '.join(dead) or 'N and D'} (a term's coefficient or "
            "exponent vanished)"
            if dead
            else "the surface falls with N and with D",
        ),
        Gate(
            "e_above_data",
            "surface",
            p["E"] > e_limit,
            f"E = {p['E']:.4g} is above the smallest loss {lmin:.4g} less two sigma ({e_limit:.4g}): the "
            "runs' losses do not leave room for the law's floor (losses read before the end of a decay?)",
        ),
        Gate(
            "exponent_at_bound",
            "surface",
            bool(on_bound),
            f"{', '.join(on_bound) or 'no exponent'} on a bound of {EXPONENT_BOUNDS}",
        ),
        Gate(
            "bootstrap_at_bounds",
            "surface",
            frac > BOOT_AT_BOUND_LIMIT,
            f"{frac:.0%} of the bootstrap replicates put an exponent on a bound (limit "
            f"{BOOT_AT_BOUND_LIMIT:.0%})",
        ),
    ]
