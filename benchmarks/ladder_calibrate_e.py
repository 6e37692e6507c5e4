"""The irreducible loss E that exp15's seventh design fixes, fitted from the records of earlier ladders.

Six pre-registered ladders fitted E freely and every fit put it at its bound, 0: the rungs (28k-77k
parameters at 10 tokens per parameter) lie on a straight line in log-log, steepening if anything, while the
three runs of the target 10x beyond them (d64-L4, seeds 0, 100 and 200) landed 2-3.5% above that line. A
free E cannot be identified from those rungs; Marin's habit is to fix E from earlier, larger runs. This
script does that reproducibly from the committed records, so the value in exp15 has a provenance anyone can
re-run: the offset power law ``L = E + A·C^-alpha`` (the project's fitter, Huber on log L) through

- the fifth ladder's rungs, six seeds each, at the rule's learning rate (their held-out micro bpb at the end,
  ``docs/benchmarks/runs/2026-12-03-scaling-ladder-real-v5-rungs.json``; the sixth ladder's rungs are the
  same runs, reproduced to the digit), and
- the three target runs at 3.64e12 (6·N·D) that the third, fifth and sixth ladders scored
  (``...-real-v3.json``, ``...-real-v5.json``, ``...-real-v6.json``).

Prints JSON: the calibrated law, the free fit of the rungs alone for comparison, and both laws' points at
the budgets the seventh design considers.

    .venv/bin/python benchmarks/ladder_calibrate_e.py
"""

from __future__ import annotations

import json
from pathlib import Path

from operators.scaling import fit_scaling_law

RUNS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "runs"
RUNGS = RUNS / "2026-12-03-scaling-ladder-real-v5-rungs.json"
TARGETS = (
    "2026-12-02-scaling-ladder-real-v3.json",
    "2026-12-03-scaling-ladder-real-v5.json",
    "2026-12-03-scaling-ladder-real-v6.json",
)
BUDGETS = (3.64e12, 6e12, 1e13)


def _rungs() -> tuple[list[float], list[float], float]:
    record = json.loads(RUNGS.read_text())
    runs = [r for r in record["fit_runs"] if r["lr_multiple"] == 1.0]
    t = record["target"]
    target_compute = 6.0 * t["n_params"] * t["num_steps"] * t["tokens_per_step"]
    return [r["compute_6nd"] for r in runs], [r["values"]["1"] for r in runs], target_compute


def _target_ends() -> list[float]:
    ends = []
    for name in TARGETS:
        verdict = json.loads((RUNS / name).read_text())["real"][0]
        ends.append(next(p["actual"] for p in verdict["points"] if p["label"] == "100%"))
    return ends


def main() -> None:
    compute, loss, target_compute = _rungs()
    ends = _target_ends()
    with_targets = compute + [target_compute] * len(ends)
    calibrated = fit_scaling_law(compute=with_targets, loss=loss + ends, bootstrap=200)
    free = fit_scaling_law(compute=compute, loss=loss, bootstrap=200)
    fixed = fit_scaling_law(compute=compute, loss=loss, fixed_e=calibrated.params["E"], bootstrap=200)
    out = {
        "inputs": {"rung_runs": len(loss), "target_compute_6nd": target_compute, "target_ends": ends},
        "calibrated": calibrated.params,
        "free_rungs_only": free.params,
        "points": {
            f"{c:.3g}": {
                "rungs_free_E": free.point(c),
                "rungs_fixed_E": fixed.point(c),
                "calibrated_law": calibrated.point(c),
            }
            for c in BUDGETS
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
