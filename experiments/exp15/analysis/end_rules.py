"""Other ways to forecast a ladder's endpoint, scored after the fact on the committed ladder records.

Not forecasts: these rules were written after the targets were seen, to say which one a next design should
register. For every ladder whose rung curves are committed (the third to the eleventh; the sixth reuses
the fifth's rungs, the tenth and eleventh the ninth's) it refits the rungs, prints each rule's signed error
against the target, and re-runs the prediction's ``late_drop`` gate on the registered forecast
(docs/benchmarks/scaling-ladder.md, 2026-12-04):

- ``end_free_e``: the offset law through the rungs' ends, E fitted (what the first six ladders and the
  eighth registered);
- ``end_fixed_e``: the same with E = 0.584 (experiments/exp15/analysis/calibrate_e.py; the seventh
  registered it, and it is in-sample for the third, fifth and sixth, whose targets calibrated it);
- ``p75_minus_max_fall``: the law through the rungs' 75% points, at the target's 75%, minus the largest
  fall any rung had from 75% to its end;
- ``p75_over_top_ratio``: that 75% forecast divided by the top rung's ratio of its 75% to its end value;
- ``p75_minus_mean_fall``: that 75% forecast minus the mean over rungs of each rung's mean fall from 75% to
  the end (the point of the ``pre_decay_anchor`` end rule, operators/scaling/end_rule.py, which the ninth
  design registered after seeing these).

``law_at_75`` scores that 75% forecast itself against the target's 75% value.

    .venv/bin/python -m experiments.exp15.analysis.end_rules

The ladders are every ``*-scaling-ladder-real-vN-rungs.json`` in ``--runs`` (default
docs/benchmarks/runs) with its verdict ``*-scaling-ladder-real-vN.json``, in the order of N, and each
``--also RUNGS:VERDICT`` (a ladder that reused another's rungs; without ``--also``, the sixth, which reused
the fifth's); each keyed by its verdict file's name.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from openlab_records import error_pct
from operators.scaling import FitSettings, fit_offset
from operators.scaling.gates import late_drop_gate

RUNS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "runs"
SIXTH = "2026-12-03-scaling-ladder-real-v5-rungs.json:2026-12-03-scaling-ladder-real-v6.json"
FIXED_E = 0.584
BOOTSTRAP = 20  # the fewest the fitter takes: only point estimates are used here


def ladders(runs: Path, also: list[str]) -> list[tuple[str, str]]:
    """(rungs record, verdict record) of every ladder in ``runs`` whose rungs are committed, then ``also``."""
    found = []
    for rungs in runs.glob("*-scaling-ladder-real-v*-rungs.json"):
        match = re.search(r"-v(\d+)-rungs\.json$", rungs.name)
        verdict = rungs.with_name(rungs.name.replace("-rungs.json", ".json"))
        if match and verdict.exists():
            found.append((int(match.group(1)), rungs.name, verdict.name))
    pairs = [(r, v) for _, r, v in sorted(found)]
    for item in also:
        rungs_name, sep, verdict_name = item.partition(":")
        if not sep or not (runs / rungs_name).exists() or not (runs / verdict_name).exists():
            raise SystemExit(f"--also {item!r}: give RUNGS:VERDICT, two record files in {runs}")
        pairs.append((rungs_name, verdict_name))
    return pairs


def _fit_point(compute: list[float], loss: list[float], at: float, fixed_e: float | None = None) -> float:
    return fit_offset(compute, loss, FitSettings(fixed_e=fixed_e, bootstrap=BOOTSTRAP)).point(at)


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


def ladder(runs_dir: Path, rungs_file: str, verdict_file: str) -> dict[str, Any]:
    """Every rule's forecast and error for one ladder, and its late-drop gate re-run."""
    record = json.loads((runs_dir / rungs_file).read_text())
    t = record["target"]
    # a prefix can hold several ladders (the tenth reused the ninth's): the verdict of this record's target
    verdicts = json.loads((runs_dir / verdict_file).read_text())["real"]
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
        "law_at_75": {"forecast": p75, "actual": actual_75, "error_pct": error_pct(p75, actual_75)},
        **{k: {"forecast": v, "error_pct": error_pct(v, actual)} for k, v in forecasts.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=Path, default=RUNS, help="the directory of the ladder records")
    p.add_argument("--also", action="append", default=None, metavar="RUNGS:VERDICT",
                   help=f"a ladder that reused another's rungs (file names in --runs; default {SIXTH})")
    args = p.parse_args()
    pairs = ladders(args.runs, [SIXTH] if args.also is None else args.also)
    out = {Path(verdict).stem: ladder(args.runs, rungs, verdict) for rungs, verdict in pairs}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
