"""The ``pre_decay_anchor`` endpoint rule: the end forecast from the point before it and the rungs' late fall.

``"law"`` (the default rule) forecasts the end like every other point, by the law fitted through the rungs'
values there. ``"pre_decay_anchor"``: the law through the rungs' last point before the end (75%: before the
WSD decay, which starts at 80%) gives the target's value there, and the end is that value minus the rungs'
mean fall from that point to the end (each rung weighs the same; a rung's fall is the mean over its seeds).
Its interval adds, in quadrature, the anchor's interval and the spread of one run's fall (the standard
deviation of every rung run's fall, pooled over rungs, times the normal quantile of the level, times
sqrt(1 + 1/runs); for the mean over seeds, divided by sqrt(runs)). The law's own end forecast (with its
``late_drop`` gate) is kept in the point's ``end_law``, so the verdict can score both; the end point's
``params``, ``sigma_log`` and fit ``gates`` stay the end law's. Why: in the third to eighth real ladders the
registered 75% points landed within 0.9% of every 10-tokens-per-parameter target, while the end law implied
a fall past the decay larger than any rung's and ended 1.9-9.2% low (docs/benchmarks/scaling-ladder.md).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from operators.scaling.gates import rung_falls
from operators.scaling.inputs import LadderInputError

END_RULES = ("law", "pre_decay_anchor")
LAW_KEYS = (
    "point",
    "low",
    "high",
    "low_mean",
    "high_mean",
    "trainer_flops_axis",
    "loo",
    "loo_spread",
    "loo_spread_rel",
)


@dataclasses.dataclass(frozen=True)
class Falls:
    """The rungs' falls from the anchor to the end: per rung (mean over seeds), pooled, and their spread."""

    means: dict[str, float]
    mean: float
    sd: float
    runs: int


def _falls(anchor: Mapping[str, Any], end: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> Falls:
    falls = rung_falls(runs, anchor["fraction"], end["fraction"])
    every = [f for v in falls.values() for f in v]
    if len(falls) < 2 or len(every) < 3:
        keys = (f"{anchor['fraction']:g}", f"{end['fraction']:g}")
        lacking = sorted(
            {
                f"{r['rung']} seed {r.get('seed', '?')}"
                for r in runs
                if r["lr_multiple"] == 1.0 and not all(k in r["values"] for k in keys)
            }
        )
        raise LadderInputError(
            f"prediction: the pre_decay_anchor rule needs the falls from {anchor['label']} to the end of at "
            f"least two rungs and three runs; {len(every)} run(s) have both points (rungs {sorted(falls)}), "
            f"these lack one: {', '.join(lacking) or 'none'}. Evaluate every rung at both fractions, or use "
            "end_rule='law'"
        )
    means = {rung: sum(v) / len(v) for rung, v in falls.items()}
    return Falls(
        means=means, mean=sum(means.values()) / len(means), sd=statistics.stdev(every), runs=len(every)
    )


def _loo(anchor: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], falls: Falls) -> list[dict[str, Any]]:
    """The leave-one-rung-out forecasts: each drops its rung from the anchor's law and from the mean fall."""
    by_compute = {
        anchor["fraction"] * float(r["compute_6nd"]): r["rung"] for r in runs if r["rung"] in falls.means
    }
    loo = []
    for row in anchor.get("loo") or []:
        left = next(
            (rung for c, rung in by_compute.items() if math.isclose(c, row["left_out"], rel_tol=1e-6)), None
        )
        if left is None:
            raise ValueError(
                f"prediction: the anchor's leave-one-rung-out row at compute {row['left_out']:.4g} matches "
                f"no rung with a fall (rungs at {sorted(by_compute)}): the fit and its runs disagree"
            )
        rest = [m for rung, m in falls.means.items() if rung != left]
        loo.append(
            {
                "left_out": row["left_out"],
                "rung": left,
                "prediction": row["prediction"] - sum(rest) / len(rest),
            }
        )
    return loo


def anchored_end(
    points: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], level: float
) -> dict[str, Any]:
    """The ``pre_decay_anchor`` endpoint (module docstring) with its interval, leave-one-rung-out forecasts
    and the rule's figures under ``rule``."""
    if len(points) < 2:
        raise ValueError("prediction: the pre_decay_anchor rule needs an evaluation point before the end")
    anchor, end = points[-2], points[-1]
    falls = _falls(anchor, end, runs)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    one_run = z * falls.sd * math.sqrt(1 + 1 / falls.runs)
    mean_of_seeds = z * falls.sd / math.sqrt(falls.runs)
    point = anchor["point"] - falls.mean
    loo = _loo(anchor, runs, falls)
    spread = (max(r["prediction"] for r in loo) - min(r["prediction"] for r in loo)) if loo else None
    return {
        "point": point,
        "low": point - math.hypot(anchor["point"] - anchor["low"], one_run),
        "high": point + math.hypot(anchor["high"] - anchor["point"], one_run),
        "low_mean": point - math.hypot(anchor["point"] - anchor["low_mean"], mean_of_seeds),
        "high_mean": point + math.hypot(anchor["high_mean"] - anchor["point"], mean_of_seeds),
        "trainer_flops_axis": anchor["trainer_flops_axis"] - falls.mean,
        "loo": loo,
        "loo_spread": spread,
        "loo_spread_rel": None if spread is None else spread / point,
        "rule": {
            "id": "pre_decay_anchor",
            "anchor": anchor["label"],
            "formula": f"L_end = L_{anchor['label']} (the law at the target's {anchor['label']}) - mean fall",
            "fall_mean": falls.mean,
            "fall_sd": falls.sd,
            "rung_falls": falls.means,
            "runs": falls.runs,
            "interval": f"the anchor's interval and {z:.3f} x the runs' fall sd (x sqrt(1 + 1/runs) for one "
            "run, / sqrt(runs) for the mean over seeds), added in quadrature",
        },
    }


def rule_line(rule: Mapping[str, Any], end_law: Mapping[str, Any] | None) -> str:
    """The rule in words, for the prediction comment's law line."""
    line = (
        f"Endpoint rule `{rule['id']}`: the law at the target's {rule['anchor']} minus the rungs' mean "
        f"fall from {rule['anchor']} to the end, {rule['fall_mean']:.4f} (sd of one run's fall "
        f"{rule['fall_sd']:.4f}, {rule['runs']} runs)"
    )
    return line + (
        f"; the end law alone says {end_law['point']:.4f}" if end_law and "point" in end_law else ""
    )
