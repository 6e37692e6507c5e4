"""Other ways to forecast a ladder's endpoint, scored after the fact on the committed ladder records.

Not forecasts: these rules were written after the targets were seen, to say which one a next design should
register. For every ladder whose rung curves are committed (the third to the eleventh; the sixth reuses
the fifth's rungs, the tenth and eleventh the ninth's) it refits the rungs, prints each rule's signed error
against the target, and re-runs the prediction's ``late_drop`` gate on the registered forecast
(docs/benchmarks/scaling-ladder.md, 2026-12-04):

- ``end_free_e``: the offset law through the rungs' ends, E fitted (what the first six ladders and the
  eighth registered);
- ``end_fixed_e``: the same with E = 0.584 (benchmarks/ladder_calibrate_e.py; the seventh registered it,
  and it is in-sample for the third, fifth and sixth, whose targets calibrated it);
- ``p75_minus_max_fall``: the law through the rungs' 75% points, at the target's 75%, minus the largest
  fall any rung had from 75% to its end;
- ``p75_over_top_ratio``: that 75% forecast divided by the top rung's ratio of its 75% to its end value;
- ``p75_minus_mean_fall``: that 75% forecast minus the mean over rungs of each rung's mean fall from 75% to
  the end (the point of the ``pre_decay_anchor`` end rule, operators/scaling/end_rule.py, which the ninth
  design registered after seeing these).

``law_at_75`` scores that 75% forecast itself against the target's 75% value.

    .venv/bin/python benchmarks/ladder_end_rules.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from operators.scaling import fit_scaling_law
from operators.scaling.gates import late_drop_gate

RUNS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "runs"
FIXED_E = 0.584
BOOTSTRAP = 20  # the fewest the fitter takes: only point estimates are used here
# (ladder, its rungs and registered points, its verdict)
LADDERS = (
    ("third", "2026-12-02-scaling-ladder-real-v3-rungs.json", "2026-12-02-scaling-ladder-real-v3.json"),
    ("fourth", "2026-12-02-scaling-ladder-real-v4-rungs.json", "2026-12-02-scaling-ladder-real-v4.json"),
    ("fifth", "2026-12-03-scaling-ladder-real-v5-rungs.json", "2026-12-03-scaling-ladder-real-v5.json"),
    ("sixth", "2026-12-03-scaling-ladder-real-v5-rungs.json", "2026-12-03-scaling-ladder-real-v6.json"),
    ("seventh", "2026-12-04-scaling-ladder-real-v7-rungs.json", "2026-12-04-scaling-ladder-real-v7.json"),
    ("eighth", "2026-12-04-scaling-ladder-real-v8-rungs.json", "2026-12-04-scaling-ladder-real-v8.json"),
    ("ninth", "2026-12-04-scaling-ladder-real-v9-rungs.json", "2026-12-04-scaling-ladder-real-v9.json"),
    ("tenth", "2026-12-04-scaling-ladder-real-v10-rungs.json", "2026-12-04-scaling-ladder-real-v10.json"),
    ("eleventh", "2026-12-04-scaling-ladder-real-v11-rungs.json", "2026-12-04-scaling-ladder-real-v11.json"),
)


def _fit_point(compute: list[float], loss: list[float], at: float, fixed_e: float | None = None) -> float:
    return fit_scaling_law(compute=compute, loss=loss, fixed_e=fixed_e, bootstrap=BOOTSTRAP).point(at)


def rules(runs: list[dict[str, Any]], target_compute: float, falls: dict[str, float]) -> dict[str, float]:
    """Each rule's endpoint forecast from one ladder's rule runs and their mean falls from 75% to the end."""
    end_x, end_y = [r["compute_6nd"] for r in runs], [r["values"]["1"] for r in runs]
    p75 = _fit_point([0.75 * c for c in end_x], [r["values"]["0.75"] for r in runs], 0.75 * target_compute)
    ends: dict[str, list[float]] = {}
    for r in runs:
        ends.setdefault(r["rung"], []).append(r["values"]["1"])
    top = min(ends, key=lambda rung: sum(ends[rung]) / len(ends[rung]))
    top_end = sum(ends[top]) / len(ends[top])
    return {
        "end_free_e": _fit_point(end_x, end_y, target_compute),
        "end_fixed_e": _fit_point(end_x, end_y, target_compute, FIXED_E),
        "p75_minus_max_fall": p75 - max(falls.values()),
        "p75_over_top_ratio": p75 * top_end / (top_end + falls[top]),
        "p75_minus_mean_fall": p75 - sum(falls.values()) / len(falls),
        "p75": p75,
    }


def ladder(rungs_file: str, verdict_file: str) -> dict[str, Any]:
    record = json.loads((RUNS / rungs_file).read_text())
    t = record["target"]
    # a prefix can hold several ladders (the tenth reused the ninth's): the verdict of this record's target
    verdicts = json.loads((RUNS / verdict_file).read_text())["real"]
    verdict = next(v for v in verdicts if v["target"] == t["name"])
    runs = [r for r in record["fit_runs"] if r["lr_multiple"] == 1.0]
    # older records' points carry no fraction: it is the step over the run's length
    points = [{**p, "fraction": p["step"] / t["num_steps"]} for p in record["points"]]
    gate = late_drop_gate(points, runs)
    assert gate is not None, rungs_file
    actual = next(p["actual"] for p in verdict["points"] if p["label"] == "100%")
    forecasts = rules(runs, 6.0 * t["n_params"] * t["num_steps"] * t["tokens_per_step"], gate["rungs"])
    p75 = forecasts.pop("p75")
    actual_75 = next(p["actual"] for p in verdict["points"] if p["label"] == "75%")
    return {
        "target": verdict["target"],
        "actual": actual,
        "actual_fall": next(p["actual"] for p in verdict["points"] if p["label"] == "75%") - actual,
        "late_drop": gate,
        "law_at_75": {"forecast": p75, "actual": actual_75, "error_pct": 100 * (p75 / actual_75 - 1)},
        **{k: {"forecast": v, "error_pct": 100 * (v / actual - 1)} for k, v in forecasts.items()},
    }


def main() -> None:
    print(json.dumps({name: ladder(rungs, verdict) for name, rungs, verdict in LADDERS}, indent=1))


if __name__ == "__main__":
    main()
