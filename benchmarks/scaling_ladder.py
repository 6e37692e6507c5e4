"""Benchmark of the scaling-ladder forecaster: a synthetic backtest and the real CPU ladder's verdict (JSON).

    python benchmarks/scaling_ladder.py [--replicates 200] [--bootstrap 200] [--prefix ladder-out]

**Synthetic backtest.** Truth ``L = E + A/N^alpha + B/D^beta`` at a fixed 20 tokens per parameter on three
surfaces (the research note's E=1, alpha=0.34, beta=0.28 with loss about 2.7 -> 1.6; alpha=0.5, beta=0.25;
and Besiroglu-like exponents alpha=0.35, beta=0.37), 5 rungs at half-decade compute spacing (a 100x span),
3 seeds each with 0.5% multiplicative noise, the target 10x beyond the top rung. Each replicate fits the
offset power law in 6·N·D (:func:`operators.scaling.fit_offset`) and predicts the target: reported are
the bias, median and p90 of the endpoint error against the true mean, and the coverage of the 90% interval
(of the mean; and of the single-run interval against one noisy target run), whose method the JSON names
(the fitter's parametric bootstrap-t since 2026-12-02). Targets (issue #15): median error <= 1%, coverage
0.85-0.95.

**Real ladder.** With ``--prefix``, every ``prediction.json`` under it with its ``verdict.json``: the
prediction, interval, actual and error at each evaluation point and the fraction of points inside
(target: endpoint error <= 1.5% and inside its interval).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from openlab_records import error_pct
from operators.scaling import FitSettings, fit_offset
from operators.scaling.bootstrap import BOOTSTRAP_T
from operators.scaling.surface import surface_loss

SURFACES = {
    "note (E=1, a=0.34, b=0.28)": {"E": 1.0, "A": 19.3, "B": 18.5, "alpha": 0.34, "beta": 0.28},
    "a=0.5, b=0.25": {"E": 1.0, "A": 77.5, "B": 11.0, "alpha": 0.5, "beta": 0.25},
    "Besiroglu-like (a=0.35, b=0.37)": {"E": 1.0, "A": 21.0, "B": 66.0, "alpha": 0.35, "beta": 0.37},
}


def backtest(
    params: dict[str, float], replicates: int, bootstrap: int, noise: float, seed: int
) -> dict[str, Any]:
    rung_n = 6e3 * 10 ** (0.25 * np.arange(5))
    target_n = rung_n[-1] * math.sqrt(10.0)

    def truth(n: float) -> float:
        return surface_loss(params, n, 20 * n)

    compute = np.repeat(6 * rung_n * 20 * rung_n, 3)
    means = np.repeat([truth(n) for n in rung_n], 3)
    target_c, target_true = 6 * target_n * 20 * target_n, truth(target_n)
    rng = np.random.default_rng(seed)
    errors, hits, run_hits = [], [], []
    for r in range(replicates):
        loss = means * np.exp(noise * rng.standard_normal(means.size))
        fit = fit_offset(compute, loss, FitSettings(bootstrap=bootstrap, rng_seed=r), leave_one_out=False)
        point, low, high = fit.predict(target_c)
        errors.append(error_pct(point, target_true))
        hits.append(low <= target_true <= high)
        one_run = target_true * math.exp(noise * rng.standard_normal())
        _, low1, high1 = fit.predict(target_c, single_run=True)
        run_hits.append(low1 <= one_run <= high1)
    e = np.asarray(errors)
    return {
        "loss_range": [truth(rung_n[0]), truth(rung_n[-1])],
        "target_loss": target_true,
        "bias_pct": float(e.mean()),
        "median_abs_error_pct": float(np.median(np.abs(e))),
        "p90_abs_error_pct": float(np.quantile(np.abs(e), 0.9)),
        "coverage_mean_interval": float(np.mean(hits)),
        "coverage_single_run_interval": float(np.mean(run_hits)),
    }


def real_ladder(prefix: str) -> list[dict[str, Any]]:
    from marin.tracking.predictions import list_predictions
    from openlab_records import Verdict, read_json

    out = []
    for row in list_predictions(prefix)["predictions"]:
        entry: dict[str, Any] = {
            "prediction": row["path"],
            "sha256": row["sha256"],
            "verified": row["verified"],
            "posted": row["posted"],
            "target": row["target"],
        }
        if row["verdict_path"]:
            verdict = Verdict.from_json(read_json(row["verdict_path"]), row["verdict_path"])
            keys = ("label", "step", "point", "low", "high", "actual", "error_pct", "inside")
            entry["points"] = [{k: p.to_json()[k] for k in keys} for p in verdict.points]
            entry["endpoint_error_pct"] = verdict.endpoint.error_pct
            entry["endpoint_inside"] = verdict.endpoint.inside
            entry["coverage"] = verdict.hits / len(verdict.points)
        out.append(entry)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicates", type=int, default=200)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--noise", type=float, default=0.005)
    p.add_argument("--prefix", default=None, help="a prefix holding a real ladder's prediction and verdict")
    args = p.parse_args()
    t0 = time.time()
    result: dict[str, Any] = {}
    if args.replicates > 0:  # --replicates 0: only the real ladder
        synthetic = {
            name: backtest(params, args.replicates, args.bootstrap, args.noise, seed=i)
            for i, (name, params) in enumerate(SURFACES.items())
        }
        result["synthetic"] = {
            "design": "5 rungs x 3 seeds, half-decade spacing, 20 tokens/param, "
            f"{args.noise:.1%} noise, target 10x the top rung",
            "interval": BOOTSTRAP_T,
            "replicates": args.replicates,
            "bootstrap": args.bootstrap,
            "surfaces": synthetic,
            "wall_s": time.time() - t0,
        }
    if args.prefix:
        result["real"] = real_ladder(args.prefix)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
