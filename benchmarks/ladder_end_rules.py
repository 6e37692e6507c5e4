"""Other ways to forecast a ladder's endpoint, scored after the fact on the committed ladder records.

Not forecasts: these rules were written after the targets were seen, to say which one a next design should
register. For every recorded ladder whose rungs are committed (the third, fourth, fifth, sixth and seventh;
the sixth reuses the fifth's rungs) it refits the rungs and prints each rule's signed error against the
target (docs/benchmarks/scaling-ladder.md, 2026-12-04):

- ``end_free_e``: the offset law through the rungs' ends, E fitted (what the first six ladders registered);
- ``end_fixed_e``: the same with E = 0.584 (benchmarks/ladder_calibrate_e.py; the seventh registered it);
- ``p75_minus_max_fall``: the law through the rungs' 75% points, at the target's 75%, minus the largest
  fall any rung had from 75% to its end;
- ``p75_over_top_ratio``: that 75% forecast divided by the top rung's ratio of its 75% to its end value.

    .venv/bin/python benchmarks/ladder_end_rules.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from operators.scaling import fit_scaling_law

RUNS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "runs"
FIXED_E = 0.584
# (ladder, rungs record, target's (N, steps, tokens per step), the target's end value)
LADDERS = (
    ("third", "2026-12-02-scaling-ladder-real-v3-rungs.json", (246400, 4812, 512), 1.9455),
    ("fourth", "2026-12-02-scaling-ladder-real-v4-rungs.json", (246400, 4812, 1024), 1.8124),
    ("fifth", "2026-12-03-scaling-ladder-real-v5-rungs.json", (246400, 4812, 512), 1.9724),
    ("sixth", "2026-12-03-scaling-ladder-real-v5-rungs.json", (246400, 4812, 512), 1.9490),
    ("seventh", "2026-12-04-scaling-ladder-real-v7-rungs.json", (415592, 8116, 512), 1.78996),
)


def _means(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    by_rung: dict[str, list[float]] = {}
    for r in runs:
        by_rung.setdefault(r["rung"], []).append(r["values"][key])
    return {rung: float(np.mean(v)) for rung, v in by_rung.items()}


def rules(runs: list[dict[str, Any]], target_compute: float) -> dict[str, float]:
    """Each rule's endpoint forecast from the rule's runs of one ladder."""
    end_x, end_y = [r["compute_6nd"] for r in runs], [r["values"]["1"] for r in runs]
    x75, y75 = [0.75 * c for c in end_x], [r["values"]["0.75"] for r in runs]
    p75 = fit_scaling_law(compute=x75, loss=y75, bootstrap=50).point(0.75 * target_compute)
    m75, m100 = _means(runs, "0.75"), _means(runs, "1")
    top = min(m100, key=lambda rung: m100[rung])
    return {
        "end_free_e": fit_scaling_law(compute=end_x, loss=end_y, bootstrap=50).point(target_compute),
        "end_fixed_e": fit_scaling_law(compute=end_x, loss=end_y, fixed_e=FIXED_E, bootstrap=50).point(
            target_compute
        ),
        "p75_minus_max_fall": p75 - max(m75[k] - m100[k] for k in m100),
        "p75_over_top_ratio": p75 / (m75[top] / m100[top]),
    }


def main() -> None:
    out = {}
    for name, record, (n, steps, tokens), actual in LADDERS:
        runs = [r for r in json.loads((RUNS / record).read_text())["fit_runs"] if r["lr_multiple"] == 1.0]
        forecasts = rules(runs, 6.0 * n * steps * tokens)
        out[name] = {
            "actual": actual,
            **{k: {"forecast": v, "error_pct": 100 * (v / actual - 1)} for k, v in forecasts.items()},
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
