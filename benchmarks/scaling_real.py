"""Calibration of the scaling fitters on real published runs (issue 34): held-out error, interval coverage.

    python benchmarks/scaling_real.py [--bootstrap 200] [--full runs.json.gz]

The printed JSON has the summary and calibration tables and one row per forecast (its point, error, interval
and width under the shipped settings); ``--full`` also writes each forecast under every prior and floor of
the grids (``by_prior``, ``by_floor``), which the calibration tables are computed from.

The sets (tests/data/scaling/, provenance in its README): Porian et al. 2024 (IsoFLOP sweeps on RefinedWeb and
OpenWebText2, cosine decay to each run's own budget: final losses) and Gadre et al. 2024 (an over-training
grid on C4, RedPajama and RefinedWeb, evaluated on C4). Each training data set is fitted on its own.

Two fitters, the way this project fits each kind of ladder:

- ``surface``: :func:`operators.scaling.fit_surface` on every run (``E + A/N^a + B/D^b``), predicting each
  held-out run at its own (N, D);
- ``offset``: :func:`operators.scaling.fit_offset` on a ladder of one run per budget, the ladders labs run:
  Porian's compute-optimal frontier (each budget's best run) and Gadre's runs at 20 tokens per parameter.

Two held-out kinds: ``top10`` (the top 10% of runs, or of ladder budgets, by compute 6·N·D; at least one) and
``far64`` (fitted on the runs at or below 1/64 of the largest compute, scored on every run at least 64x
beyond the largest fitted one). Reported per set, fitter and kind, and pooled per kind: median and max
|error| (``(predicted - actual) / actual``), the coverage of the 90% one-run and mean intervals (each held-out
run is one run, so the one-run interval is the one that should cover 90%), the median one-run interval width
(relative to the point), the crash count, and the narrowest interval among forecasts at least 10x beyond
the fitted runs (goal: none under 1%). Goal: pooled one-run coverage 0.85-0.95 for both kinds, no crash.

``calibration``: the model-error prior (:mod:`operators.scaling.model_error`) treated as a constant to be
chosen where it can be scored out of sample: every forecast is scored under each prior of ``PRIORS``
(:meth:`ModelError.with_prior`, no refit), a prior is chosen by :func:`choose_prior` on the other published
set (``lodo``), on a nested split inside the set's own fitted runs (``nested``), or on the scored runs
themselves (``in_sample``, for comparison), and scored beside the shipped one; each with the share of single
runs the mean's interval should cover under the noise model (``coverage_mean_expected_on_one_run``).

``floor_calibration`` (issue 34, rules ``issue-34/2``): the model error's floor for fits without seeds
(:data:`operators.scaling.model_error.TAU_FLOOR_NO_SEEDS`), scored the same way on the grid ``FLOORS``
(:meth:`ModelError.with_floor`, no refit). The rule, fixed before this calibration ran: the floor is for
ladders whose backtests cannot see the law's error, so it is chosen on the one-run-per-budget ladders'
forecasts (the ``offset`` fitter) by :func:`choose` (the smallest value whose one-run interval covers at
least 90% of them); ``leave_one_set_out`` chooses it on the other published set's ladders of the same
held-out kind and scores every forecast of this set under it (surface and ladder: the floor applies to
every fit without seeds); ``in_sample`` chooses it on this set's own ladders (for comparison); ``shipped``
is the constant in the code; ``code_in_sample`` is the rule's choice on both sets' top-10% ladder forecasts
(``choice_for_the_code``: top 10% is the kind a lab's ladder forecasts, a few times past its top rung),
scored on every forecast, the data it was chosen on. Two rules (``FLOOR_RULES``): ``floor_calibration``
is ``at_least_90`` (the first rule: the smallest value covering at least 90%), ``floor_calibration_nearest``
is ``nearest_90`` (the value covering the share nearest 90%, the smallest among ties), fixed before its
figures were computed because "at least 90%" of fewer than ten forecasts means all of them; the shipped
constant is ``nearest_90``'s choice since 2026-12-06 (evening).
Every set here has one run per (N, D): every fit is one without seeds, so the mean's interval is the one-run
interval (:func:`operators.scaling.bootstrap.mean_is_one_run`) and the two coverages agree.

``scatter`` (a diagnostic, not used by any rule): how much of the runs' scatter about the surface a smooth
curve inside one group would leave too: per Porian budget a parabola in log N, per Gadre model size one in
log D (groups of at least five runs), the residuals' pooled standard deviation in log L beside the
surface's robust residual scale. Noise and the curve's own misfit together; without repeats the split
between noise and the surface's lack of fit stays unknown.
"""

from __future__ import annotations

import os

# one BLAS thread: the surface's L-BFGS-B refits are 30x slower with a threaded BLAS on a busy machine
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from statistics import NormalDist  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from operators.scaling import FORM_SURFACE, FitSettings, fit_offset, fit_surface  # noqa: E402
from operators.scaling.gates import surface_gates  # noqa: E402
from operators.scaling.inputs import group_by_budget  # noqa: E402
from operators.scaling.model_error import TAU_FLOOR_NO_SEEDS, TAU_PRIOR  # noqa: E402
from tests.data.scaling import Runs, load  # noqa: E402

SETS = ("porian2024", "gadre2024")
KINDS = ("top10", "far64")
PRIORS = (0.0, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06)
"""The model-error priors tried (log L per decade; ``model_error.TAU_PRIOR`` among them), fixed before any
run of the calibration."""
FLOORS = PRIORS
"""The model-error floors tried for fits without seeds (the same grid, fixed before the floor's calibration
ran)."""
Z90 = NormalDist().inv_cdf(0.95)


def split(compute: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(fitted, held out) masks over runs by compute (see the module docstring)."""
    if kind == "top10":
        distinct = np.unique(compute)
        cut = distinct[-max(1, math.ceil(0.1 * distinct.size))]
        return compute < cut, compute >= cut
    fitted = compute <= compute.max() / 64 * (1 + 1e-9)
    return fitted, compute >= 64 * compute[fitted].max() * (1 - 1e-9) if fitted.any() else ~fitted


def ladder_of(name: str, runs: Runs) -> Runs:
    """The one-run-per-budget ladder of a set: Porian's frontier (each budget's best run); Gadre's runs at 20
    tokens per parameter."""
    if name == "gadre2024":
        return runs.subset(np.isclose(runs.d / runs.n, 20.0, rtol=1e-3))
    best = [g[np.argmin(runs.loss[g])] for g in group_by_budget(runs.compute, rel_tol=1e-3)]
    return runs.subset(np.isin(np.arange(runs.loss.size), best))


def _fitted(fitter: str, fit_runs: Runs, bootstrap: int) -> tuple[Any, list[str]]:
    if fitter == "surface":
        fit = fit_surface(
            fit_runs.n, fit_runs.d, fit_runs.loss, FitSettings(form=FORM_SURFACE, bootstrap=bootstrap)
        )
        return fit, [g.name for g in surface_gates(fit) if g.flag]
    return fit_offset(fit_runs.compute, fit_runs.loss, FitSettings(bootstrap=bootstrap)), []


def _intervals(fit: Any, fitter: str, held: Runs, i: int) -> dict[str, Any]:
    """The one-run and the mean's interval of one held-out run under ``fit`` (its own model-error term)."""
    if fitter == "surface":
        one = fit.predict(n=float(held.n[i]), d=float(held.d[i]), single_run=True)
        return _cover(float(held.loss[i]), one, fit.predict(n=float(held.n[i]), d=float(held.d[i])))
    one = fit.predict(float(held.compute[i]), single_run=True)
    return _cover(float(held.loss[i]), one, fit.predict(float(held.compute[i])))


def _row(fit: Any, fitter: str, held: Runs, i: int, top: float) -> dict[str, Any]:
    """One held-out run's forecast: the point, its error, and for every model-error prior in ``PRIORS`` (the
    fit's own floor) and every floor in ``FLOORS`` (the shipped prior) whether the one-run and the mean's
    interval cover it, and their widths."""
    actual, me = float(held.loss[i]), fit.model_error
    by_prior = {
        str(prior): _intervals(dataclasses.replace(fit, model_error=me.with_prior(prior)), fitter, held, i)
        for prior in PRIORS
    }
    by_floor = {
        str(floor): _intervals(dataclasses.replace(fit, model_error=me.with_floor(floor)), fitter, held, i)
        for floor in FLOORS
    }
    point = fit.predict(n=float(held.n[i]), d=float(held.d[i])) if fitter == "surface" else None
    point_value = float(point[0]) if point else float(fit.predict(float(held.compute[i]))[0])
    return {
        "n": float(held.n[i]),
        "d": float(held.d[i]),
        "beyond": float(held.compute[i]) / top,
        "decades_from_centre": math.log10(float(held.compute[i]) / me.c_from),
        "actual": actual,
        "point": point_value,
        "error_pct": 100 * (point_value - actual) / actual,
        "sigma_log": fit.sigma,
        "sigma_source": fit.sigma_source,
        "tau_estimate": me.estimate,
        "tau_shrunk": me.tau,
        "tau_floor": me.floor,
        **by_prior[str(TAU_PRIOR)],
        "by_prior": by_prior,
        "by_floor": by_floor,
    }


def _cover(
    actual: float, one: tuple[float, float, float], mean: tuple[float, float, float]
) -> dict[str, Any]:
    """Coverage and width of both intervals for one run, and the share of single runs the mean's interval
    should cover if the noise model holds (``2·Phi(z·h_mean/h_one) - 1``, half-widths in log L): the mean's
    interval is for the mean over seeds, so on single runs it should under-cover by that much."""
    point = one[0]
    h_one = (math.log(one[2]) - math.log(one[1])) / 2
    h_mean = (math.log(mean[2]) - math.log(mean[1])) / 2
    expected = 2 * NormalDist().cdf(Z90 * h_mean / h_one) - 1 if h_one > 0 else 0.0
    return {
        "inside": bool(one[1] <= actual <= one[2]),
        "inside_mean": bool(mean[1] <= actual <= mean[2]),
        "width_pct": 100 * (one[2] - one[1]) / point,
        "width_mean_pct": 100 * (mean[2] - mean[1]) / point,
        "mean_expected_on_one_run": expected,
    }


def evaluate(
    name: str, subset: str, runs: Runs, fitter: str, kind: str, bootstrap: int, nested: bool = False
) -> dict[str, Any]:
    """The forecasts of one (set, training data, fitter, held-out kind). ``nested``: the calibration split
    inside the fitted runs (their own top slice held out, the rest fitted), which never sees the runs that
    ``nested=False`` scores."""
    data = runs if fitter == "surface" else ladder_of(name, runs)
    fitted, held = split(data.compute, kind)
    if nested:
        data = data.subset(fitted)
        fitted, held = split(data.compute, kind)
    out: dict[str, Any] = {"set": name, "subset": subset, "fitter": fitter, "kind": kind, "nested": nested}
    out.update(fitted_runs=int(fitted.sum()), held_out=int(held.sum()))
    try:
        fit, gates = _fitted(fitter, data.subset(fitted), bootstrap)
        top, held_runs = float(data.compute[fitted].max()), data.subset(held)
        rows = [_row(fit, fitter, held_runs, i, top) for i in range(held_runs.loss.size)]
    except Exception as e:  # a crash is a figure of this benchmark: counted and named, never hidden
        return {**out, "crash": f"{type(e).__name__}: {e}"[:300], "forecasts": []}
    out["sigma_estimate"] = fit.noise.estimate if fit.noise is not None else None
    return {**out, "crash": None, "gates_flagged": gates, "forecasts": rows}


def summarise(
    results: list[dict[str, Any]], prior: float = TAU_PRIOR, *, floor: float | None = None
) -> dict[str, Any]:
    """Figures of ``results``' forecasts under a model-error prior (the fits' own floor), or, with
    ``floor``, under that floor (the shipped prior)."""
    grid, value = ("by_prior", prior) if floor is None else ("by_floor", floor)
    rows = [{**r, **r[grid][str(value)]} for res in results for r in res["forecasts"]]
    far = [r for r in rows if r["beyond"] >= 10]
    errors = np.abs([r["error_pct"] for r in rows]) if rows else np.array([np.nan])

    def mean_of(key: str) -> float | None:
        return float(np.mean([r[key] for r in rows])) if rows else None

    def median_of(key: str) -> float | None:
        return float(np.median([r[key] for r in rows])) if rows else None

    return {
        "prior": prior,
        "floor": floor,
        "forecasts": len(rows),
        "median_abs_error_pct": float(np.median(errors)),
        "max_abs_error_pct": float(np.max(errors)),
        "coverage_single_run": mean_of("inside"),
        "coverage_mean": mean_of("inside_mean"),
        "coverage_mean_expected_on_one_run": mean_of("mean_expected_on_one_run"),
        "median_width_single_run_pct": median_of("width_pct"),
        "median_width_mean_pct": median_of("width_mean_pct"),
        "crashes": sum(res["crash"] is not None for res in results),
        "narrowest_width_at_10x_pct": min(
            (min(r["width_pct"], r["width_mean_pct"]) for r in far), default=None
        ),
        "forecasts_at_10x": len(far),
    }


def choose_prior(results: list[dict[str, Any]]) -> float:
    """The calibration rule, fixed before the calibration ran: the smallest prior in ``PRIORS`` whose
    one-run interval covers at least 90% of the calibration forecasts (the largest if none does). The one-run
    interval is the one a single held-out run should fall in 90% of the time."""
    return choose(results, "by_prior", PRIORS)


def choose(results: list[dict[str, Any]], grid: str, values: tuple[float, ...]) -> float:
    """The smallest of ``values`` whose one-run interval (under ``grid``: ``by_prior`` or ``by_floor``)
    covers at least 90% of the forecasts of ``results`` (the largest if none does)."""
    rows = [r for res in results for r in res["forecasts"]]
    for value in values:
        if rows and np.mean([r[grid][str(value)]["inside"] for r in rows]) >= 0.9:
            return value
    return values[-1]


def choose_nearest(results: list[dict[str, Any]], grid: str, values: tuple[float, ...]) -> float:
    """The value of ``values`` whose one-run interval (under ``grid``) covers a share of the forecasts of
    ``results`` nearest the nominal 0.90, the smallest among ties. Fixed (2026-12-06, evening) before its
    figures were computed, for the reason that ``choose``'s "at least 90%" asks for every forecast covered
    whenever there are fewer than ten (seven top-10% ladder forecasts: 7 of 7), so its choice over-covers by
    construction on small calibration sets; this one asks for the count nearest 90% (6 of 7)."""
    rows = [r for res in results for r in res["forecasts"]]
    if not rows:
        return values[-1]
    gap = {v: abs(float(np.mean([r[grid][str(v)]["inside"] for r in rows])) - 0.9) for v in values}
    return min(values, key=lambda v: (round(gap[v], 12), v))


FLOOR_RULES = {"at_least_90": choose, "nearest_90": choose_nearest}
"""The floor's choice rules: ``at_least_90`` (the rule the floor of rules ``issue-34/2`` was chosen by;
reported as ``floor_calibration``) and ``nearest_90`` (the rule the shipped floor, rules ``issue-34/3``, was
chosen by, adopted after the first rule's in-sample 1.0 was seen; ``floor_calibration_nearest``)."""


def floor_calibration(results: list[dict[str, Any]], rule: str = "at_least_90") -> dict[str, Any]:
    """The floor for fits without seeds chosen out of sample (the module docstring) by ``FLOOR_RULES[rule]``:
    per held-out kind and set, chosen on the other set's one-run ladders (``leave_one_set_out``), on this
    set's own (``in_sample``), the shipped constant, and the rule's choice for the code
    (``choice_for_the_code``, on both sets' top-10% ladders) scored on everything (``code_in_sample``);
    pooled per kind."""
    pick = FLOOR_RULES[rule]
    scored = [r for r in results if not r["nested"]]
    ladders = [r for r in scored if r["fitter"] == "offset"]
    code = pick([r for r in ladders if r["kind"] == "top10"], "by_floor", FLOORS)
    out: dict[str, Any] = {"floors": list(FLOORS), "rule": (pick.__doc__ or "").split("\n")[0]}
    for kind in KINDS:
        pooled: dict[str, list[dict[str, Any]]] = {
            "leave_one_set_out": [], "in_sample": [], "shipped": [], "code_in_sample": []}
        for name in SETS:
            mine = [r for r in scored if r["set"] == name and r["kind"] == kind]
            picks = {
                "leave_one_set_out": pick(
                    [r for r in ladders if r["set"] != name and r["kind"] == kind], "by_floor", FLOORS
                ),
                "in_sample": pick(
                    [r for r in ladders if r["set"] == name and r["kind"] == kind], "by_floor", FLOORS
                ),
                "shipped": TAU_FLOOR_NO_SEEDS,
                "code_in_sample": code,
            }
            for how, floor in picks.items():
                out[f"{name}/{kind}/{how}"] = summarise(mine, floor=floor)
                out[f"{name}/{kind}/{how}/ladders"] = summarise(
                    [r for r in mine if r["fitter"] == "offset"], floor=floor
                )
                pooled[how].append(out[f"{name}/{kind}/{how}"])
        for how, parts in pooled.items():
            out[f"pooled/{kind}/{how}"] = _pool(parts)
    out["choice_for_the_code"] = code
    return out


def calibration(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The model-error prior chosen out of sample, and the coverage it gives where it was not chosen:

    - ``leave_one_set_out``: chosen on the other published set's forecasts of the same held-out kind,
      scored on this set's;
    - ``nested``: chosen on this set's nested split (its fitted runs' own top 10% held out, top10 only),
      scored on its real top 10%;
    - ``in_sample``: chosen on the very forecasts it is scored on (what not to trust; for comparison);
    - ``shipped``: ``model_error.TAU_PRIOR``; and the prior both sets' forecasts of a kind would choose
      together (``choice_on_both_sets``; ``choice_on_everything``: both kinds, the rule for the shipped one).
    """
    scored = [r for r in results if not r["nested"]]
    out: dict[str, Any] = {"priors": list(PRIORS), "rule": choose_prior.__doc__.split(":", 1)[1].strip()}
    for kind in KINDS:
        pooled: dict[str, list[dict[str, Any]]] = {"lodo": [], "nested": [], "in_sample": [], "shipped": []}
        for name in SETS:
            mine = [r for r in scored if r["set"] == name and r["kind"] == kind]
            other = [r for r in scored if r["set"] != name and r["kind"] == kind]
            inner = [r for r in results if r["nested"] and r["set"] == name and r["kind"] == kind]
            picks = {"lodo": choose_prior(other), "in_sample": choose_prior(mine), "shipped": TAU_PRIOR}
            if inner:
                picks["nested"] = choose_prior(inner)
            for how, prior in picks.items():
                out[f"{name}/{kind}/{how}"] = summarise(mine, prior)
                pooled[how].append(out[f"{name}/{kind}/{how}"])
        for how, parts in pooled.items():
            if parts:
                out[f"pooled/{kind}/{how}"] = _pool(parts)
        out[f"pooled/{kind}/choice_on_both_sets"] = choose_prior([r for r in scored if r["kind"] == kind])
    out["choice_on_everything"] = choose_prior(scored)
    return out


def _pool(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled coverage of per-set summaries (each scored under its own factor): forecast-weighted means."""
    n = sum(p["forecasts"] for p in parts)

    def weighted(key: str) -> float:
        return sum(p[key] * p["forecasts"] for p in parts) / n

    return {
        "priors": [p["prior"] for p in parts],
        "floors": [p["floor"] for p in parts],
        "forecasts": n,
        "median_abs_error_pct_per_set": [p["median_abs_error_pct"] for p in parts],
        "max_abs_error_pct_per_set": [p["max_abs_error_pct"] for p in parts],
        "coverage_single_run": weighted("coverage_single_run"),
        "coverage_mean": weighted("coverage_mean"),
        "coverage_mean_expected_on_one_run": weighted("coverage_mean_expected_on_one_run"),
        "median_width_single_run_pct_per_set": [p["median_width_single_run_pct"] for p in parts],
        "median_width_mean_pct_per_set": [p["median_width_mean_pct"] for p in parts],
    }


def scatter(name: str, runs: Runs, surface_sigma: float | None) -> dict[str, Any]:
    """The ``scatter`` diagnostic of one training data set (the module docstring)."""
    if name == "porian2024":
        groups, x = group_by_budget(runs.compute, rel_tol=1e-3), np.log(runs.n)
    else:
        groups, x = [np.flatnonzero(runs.n == size) for size in np.unique(runs.n)], np.log(runs.d)
    ss, dof = 0.0, 0
    for g in (g for g in groups if len(g) >= 5):
        y = np.log(runs.loss[g])
        r = y - np.polyval(np.polyfit(x[g], y, 2), x[g])
        ss, dof = ss + float(r @ r), dof + len(g) - 3
    return {
        "within_group_sd_log": math.sqrt(ss / dof) if dof else None,
        "within_group_dof": dof,
        "surface_robust_sd_log": surface_sigma,
    }


def without_grids(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` without each forecast's ``by_prior`` and ``by_floor`` grids (about nine tenths of the
    output; the calibration tables summarise them): what the printed JSON keeps per forecast."""
    grids = ("by_prior", "by_floor")
    return [{**r, "forecasts": [{k: v for k, v in f.items() if k not in grids} for f in r["forecasts"]]}
            for r in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--full", metavar="PATH", default=None,
                   help="also write every forecast's interval under every prior and floor of the grids "
                   "(gzip-compressed JSON at PATH); the printed JSON keeps the per-forecast rows "
                   "without them")
    args = p.parse_args()
    t0 = time.time()
    cases = [
        (name, subset, runs, fitter, kind)
        for name in SETS
        for subset, runs in load(name).items()
        for fitter in ("surface", "offset")
        for kind in KINDS
    ]
    results = [evaluate(*case, args.bootstrap) for case in cases]
    nested = [evaluate(*case, args.bootstrap, nested=True) for case in cases if case[-1] == "top10"]
    scored = {
        f"{name}/{kind}": [r for r in results if r["set"] == name and r["kind"] == kind]
        for name in SETS
        for kind in KINDS
    }
    summary = {key: summarise(parts) for key, parts in scored.items()}
    summary.update({f"pooled/{kind}": summarise([r for r in results if r["kind"] == kind]) for kind in KINDS})
    summary.update(
        {
            f"pooled/{kind}/{fitter}": summarise(
                [r for r in results if r["kind"] == kind and r["fitter"] == fitter]
            )
            for kind in KINDS
            for fitter in ("surface", "offset")
        }
    )
    summary["nested_calibration_split"] = summarise(nested)
    surfaces = {
        (r["set"], r["subset"]): r.get("sigma_estimate")
        for r in results
        if r["fitter"] == "surface" and r["kind"] == "top10"
    }
    out = {
        "summary": summary,
        "calibration": calibration(results + nested),
        "floor_calibration": floor_calibration(results),
        "floor_calibration_nearest": floor_calibration(results, "nearest_90"),
        "scatter": {
            f"{name}/{subset}": scatter(name, runs, surfaces.get((name, subset)))
            for name in SETS
            for subset, runs in load(name).items()
        },
        "runs": without_grids(results),
        "nested_runs": without_grids(nested),
        "bootstrap": args.bootstrap,
        "model_error_prior": TAU_PRIOR,
        "model_error_floor_no_seeds": TAU_FLOOR_NO_SEEDS,
        "wall_s": time.time() - t0,
    }
    if args.full:
        with gzip.open(args.full, "wt") as f:
            json.dump({**out, "runs": results, "nested_runs": nested}, f)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
