"""The irreducible loss E that exp15's seventh design fixes, fitted from the records of earlier ladders.

Six pre-registered ladders fitted E freely and every fit put it at its bound, 0: the rungs (28k-77k
parameters at 10 tokens per parameter) lie on a straight line in log-log, steepening if anything, while the
three runs of the target 10x beyond them (d64-L4, seeds 0, 100 and 200) landed 2-3.5% above that line. A
free E cannot be identified from those rungs; Marin's habit is to fix E from earlier, larger runs. This
script does that reproducibly (:func:`operators.scaling.calibrate.calibrate_e`) from the committed records,
so the value in exp15 has a provenance anyone can re-run: the offset power law ``L = E + A·C^-alpha`` (the
project's fitter, Huber on log L) through

- the fifth ladder's rungs, six seeds each, at the rule's learning rate (their held-out micro bpb at the end,
  ``docs/benchmarks/runs/2026-12-03-scaling-ladder-real-v5-rungs.json``; the sixth ladder's rungs are the
  same runs, reproduced to the digit), and
- the three target runs at 3.64e12 (6·N·D) that the third, fifth and sixth ladders scored
  (``...-real-v3.json``, ``...-real-v5.json``, ``...-real-v6.json``).

Prints JSON: the calibrated law, the free fit of the rungs alone for comparison, the rungs with E fixed at
the registered 0.584 (what exp15's seventh design forecasts), and the points of each at the budgets the
seventh design considered; and, after the fact, the calibration with the seventh ladder's target (d72-L5 at
1.04e13) added, which is not what the seventh ladder used.

    .venv/bin/python -m experiments.exp15.analysis.calibrate_e

``--family l4`` (the tenth design's E): the same calibration for the four-layer family alone, through the
ninth ladder's rungs (d24-L4..d48-L4, seeds 10-15, ``...-real-v9-rungs.json``) and every four-layer target
at 10 tokens per parameter on record (the fourth ladder's, at 20, is left out), at the end: d64-L4 (the
three above), d88-L4 (the eighth) and d96-L4 (the ninth). It also prints its backtest: the calibration
without d96-L4, fixed in the law through the eighth's and through the ninth's rungs, forecasting d96-L4's
end; and the fixed-E forecast at d104-L4 (the tenth design's target).

    .venv/bin/python -m experiments.exp15.analysis.calibrate_e --family l4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from openlab_records import error_pct
from operators.scaling import FitSettings, fit_offset
from operators.scaling.calibrate import (
    CalibrateE,
    Family,
    FamilyTarget,
    calibrate_e,
    read_family,
    rule_ends,
)

RUNS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "runs"
V5_RUNGS = "2026-12-03-scaling-ladder-real-v5-rungs.json"
SEVENTH_TARGETS = (  # (rungs record naming the target, verdict): the three d64-L4 runs
    (V5_RUNGS, "2026-12-02-scaling-ladder-real-v3.json"),
    (V5_RUNGS, "2026-12-03-scaling-ladder-real-v5.json"),
    (V5_RUNGS, "2026-12-03-scaling-ladder-real-v6.json"),
)
SEVENTH = ("2026-12-04-scaling-ladder-real-v7-rungs.json", "2026-12-04-scaling-ladder-real-v7.json")
REGISTERED_E = 0.584
BUDGETS = (3.64e12, 6e12, 1e13)
BOOTSTRAP = 20  # the fewest the fitter takes: only point estimates are printed
L4_RUNGS = {
    "eighth": "2026-12-04-scaling-ladder-real-v8-rungs.json",
    "ninth": "2026-12-04-scaling-ladder-real-v9-rungs.json",
}
L4_TARGETS = (
    *SEVENTH_TARGETS,
    ("2026-12-04-scaling-ladder-real-v8-rungs.json", "2026-12-04-scaling-ladder-real-v8.json"),
    ("2026-12-04-scaling-ladder-real-v9-rungs.json", "2026-12-04-scaling-ladder-real-v9.json"),
)
TENTH = ("2026-12-04-scaling-ladder-real-v10-rungs.json", "2026-12-04-scaling-ladder-real-v10.json")
D104_L4 = 6.0 * 693224 * 13540 * 512  # the tenth design's target, d104-L4 (operators.scaling.rules)
D112_L4 = 6.0 * 753712 * 14720 * 512  # the eleventh design's target, d112-L4 (operators.scaling.rules)


def _config(rungs: str, targets: tuple[tuple[str, str], ...]) -> CalibrateE:
    named = tuple(FamilyTarget(str(RUNS / r), str(RUNS / v)) for r, v in targets)
    return CalibrateE(str(RUNS / rungs), named)


def _settings(fixed_e: float | None = None, bootstrap: int = BOOTSTRAP) -> FitSettings:
    return FitSettings(fixed_e=fixed_e, bootstrap=bootstrap)


def main() -> dict[str, object]:
    """The seventh design's E (0.584), the fits it was compared with, and the seventh target added after."""
    family = read_family(_config(V5_RUNGS, SEVENTH_TARGETS))
    compute, loss = list(family.rung_compute), list(family.rung_loss)
    calibrated = calibrate_e(family)
    free = fit_offset(compute, loss, _settings())
    fixed = fit_offset(compute, loss, _settings(REGISTERED_E))
    seventh = read_family(_config(V5_RUNGS, (*SEVENTH_TARGETS, SEVENTH)))
    c7, end7 = seventh.targets[-1]
    later = calibrate_e(seventh)
    return {
        "inputs": {
            "rung_runs": len(loss),
            "target_compute_6nd": family.targets[0][0],
            "target_ends": [v for _, v in family.targets],
        },
        "calibrated": calibrated.params,
        "free_rungs_only": free.params,
        "points": {
            f"{c:.3g}": {
                "rungs_free_E": free.point(c),
                "rungs_E_0.584": fixed.point(c),
                "calibrated_law": calibrated.point(c),
            }
            for c in (*BUDGETS, c7)
        },
        "after_the_fact_with_seventh_target": {"compute_6nd": c7, "end": end7, "law": later.params},
    }


def _forecast(compute: list[float], loss: list[float], e: float, at: float) -> dict[str, object]:
    fixed = fit_offset(compute, loss, _settings(e, 1000))
    point, low, high = fixed.predict(at, single_run=True)
    return {"compute_6nd": at, "E_fixed": e, "forecast": point, "low": low, "high": high, "law": fixed.params}


def l4_family() -> dict[str, object]:
    """The four-layer family's calibration (the tenth design's E), its backtest on d96-L4 and its forecast
    at d104-L4."""
    family = read_family(_config(L4_RUNGS["ninth"], L4_TARGETS))
    law = calibrate_e(family).params
    d96_c, d96_end = family.targets[-1]
    backtest = {}
    for name, rungs_file in L4_RUNGS.items():
        rc, rl = rule_ends(json.loads((RUNS / rungs_file).read_text()))
        e = calibrate_e(Family(tuple(rc), tuple(rl), family.targets[:-1])).params["E"]
        fixed = fit_offset(rc, rl, _settings(e, 200))
        point, low, high = fixed.predict(d96_c, single_run=True)
        backtest[f"{name}_rungs"] = {
            "E_without_d96": e,
            "forecast": point,
            "low": low,
            "high": high,
            "actual": d96_end,
            "error_pct": error_pct(point, d96_end),
        }
    compute, loss = list(family.rung_compute), list(family.rung_loss)
    return {
        "inputs": {
            "rung_runs": len(loss),
            "targets": [{"compute_6nd": c, "end": v} for c, v in family.targets],
        },
        "calibrated": law,
        "free_rungs_only": fit_offset(compute, loss, _settings()).params,
        "backtest_d96_L4": backtest,
        "d104_L4": _forecast(compute, loss, round(law["E"], 3), D104_L4),
    }


def l4_eleventh() -> dict[str, object]:
    """The eleventh design's E: the same calibration with the tenth's target (d104-L4, seed 600) added, and
    the forecast it gives at d112-L4 through the four rungs the eleventh reuses (the ninth's, seeds 10-12;
    its fifth rung, d56-L4, had not run when this was written, so the registered point will differ)."""
    family = read_family(_config(L4_RUNGS["ninth"], (*L4_TARGETS, TENTH)))
    law = calibrate_e(family).params
    runs = json.loads((RUNS / L4_RUNGS["ninth"]).read_text())["fit_runs"]
    first3 = [r for r in runs if r["lr_multiple"] == 1.0 and r["seed"] in (10, 11, 12)]
    forecast = _forecast(
        [r["compute_6nd"] for r in first3], [r["values"]["1"] for r in first3], round(law["E"], 3), D112_L4
    )
    return {
        "inputs": {
            "rung_runs": len(family.rung_loss),
            "targets": [{"compute_6nd": c, "end": v} for c, v in family.targets],
        },
        "calibrated": law,
        "d112_L4_from_four_rungs_seeds_10_12": forecast,
    }


FAMILIES = {"": main, "l4": l4_family, "l4-eleventh": l4_eleventh}

if __name__ == "__main__":
    args = sys.argv[1:]
    family_name = args[1] if len(args) == 2 and args[0] == "--family" else "" if not args else None
    if family_name not in FAMILIES:
        raise SystemExit(
            f"usage: python -m experiments.exp15.analysis.calibrate_e [--family l4|l4-eleventh]; got {args}"
        )
    print(json.dumps(FAMILIES[family_name](), indent=1))
