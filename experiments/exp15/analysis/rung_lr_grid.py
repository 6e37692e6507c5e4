"""The reduced ladder's v2 reference, re-tuned on its rungs: the rungs' learning-rate check on a grid wide
enough to bracket the best rate, and the reference chosen by a rule fixed before the grid ran.

The check is the ladder's own (``plan_ladder(lr_multiples=...)``: the smallest and the top rung, seed 0, at
multiples of the rule's rate; the same step names, configs and held-out windows as
``MARIN_LADDER_LR_CHECK=1``); only its steps run. The multiples are given as multiples of **Marin's**
reference (:class:`moe_trainer.hparams.DelphiV2Rule`'s ``lr_base``/``adam_lr_base``, the cap scaled with
them), so the grid does not move when exp15's reference does.

The rule (written before the grid ran, 2026-12-06): the reference is the grid multiple that minimises the
mean over the two rungs of log(micro.bpb at the end of training); when that multiple is the grid's largest or
smallest, the optimum is not bracketed and the script says so (``bracketed: false``) instead of choosing.

    MARIN_LADDER_SMALL=1 scripts/netns .venv/bin/python -m experiments.exp15.analysis.rung_lr_grid \\
        --prefix /tmp/grid --backend local                       # trains the grid, prints the JSON
    GRID=4,8,16,32,64,128 ...                                    # the multiples of Marin's reference

It reads exp15's reduced rules (``MARIN_LADDER_SMALL=1`` is required: the full ladder trains ``adamw-v1``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import experiments.exp15_scaling_ladder as ex
from experiments.common.scaling_ladder import build_ladder
from marin import ExecutorMainConfig, run_experiment
from openlab_records import read_json
from operators.scaling.curve import CURVE_FILE
from operators.scaling.ladder import plan_ladder
from operators.scaling.rules import LadderRules

GRID = tuple(float(m) for m in os.environ.get("GRID", "4,8,16,32,64,128").split(","))


def choose(ends: dict[float, dict[str, float]]) -> dict[str, Any]:
    """The rule: the multiple minimising the mean log end value over the rungs; bracketed or not."""
    def mean_log(values: list[float]) -> float:  # a run that diverged (non-finite end) is never the best
        return sum(math.log(v) if math.isfinite(v) else math.inf for v in values) / len(values)

    score = {m: mean_log(list(by_rung.values())) for m, by_rung in ends.items()}
    best = min(score, key=lambda m: score[m])
    shown = {f"{m:g}": (round(s, 6) if math.isfinite(s) else None) for m, s in sorted(score.items())}
    return {"mean_log_end": shown,
            "best_multiple": best, "bracketed": min(score) < best < max(score)}


def marin_rules(rules: LadderRules, multiple: float) -> LadderRules:
    """``rules`` with the v2 reference at ``multiple`` x Marin's (both rates and their cap)."""
    return dataclasses.replace(rules, v2_lr_multiple=multiple)


def _ladder() -> Any:
    low = min(GRID)
    plan = plan_ladder(ex.BASE_MODEL, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=[2.7e9],
                       rules=marin_rules(ex.rules, low),
                       lr_multiples=tuple(m / low for m in GRID if m != low))
    return build_ladder("exp15", plan, base_train=ex.base_train, tokenized=ex.tokenized_bytes, issue=None,
                        validation={}, eval_max_batches=16, bootstrap=200, fixed_e=ex.E_FIXED)


def _end(curve_dir: str) -> float:
    curve = read_json(f"{curve_dir.rstrip('/')}/{CURVE_FILE}")
    return float(next(p["value"] for p in curve["points"] if float(p["fraction"]) == 1.0))


def main(argv: list[str]) -> dict[str, Any]:
    if not ex.SMALL:
        raise SystemExit("rung_lr_grid: set MARIN_LADDER_SMALL=1 (the grid is for the reduced ladder's "
                         "rungs)")
    ladder = _ladder()
    low, ends_at = min(GRID), (ladder.plan.rungs[0].name, ladder.plan.rungs[-1].name)
    wanted = [e for e in ladder.rung_evals if any(e.name.startswith(f"exp15/eval/{r}") for r in ends_at)]
    cfg = ExecutorMainConfig(prefix=argv[argv.index("--prefix") + 1],
                             backend=argv[argv.index("--backend") + 1] if "--backend" in argv else "local")
    result = run_experiment(wanted, cfg, description="exp15: the rungs' learning-rate grid (v2 reference)",
                            verbose=False)
    if result.status != "SUCCESS":
        raise SystemExit(f"rung_lr_grid: the run ended {result.status}: {result.summary}")
    ends: dict[float, dict[str, float]] = {}
    for e in wanted:
        rung, _, tail = e.name.removeprefix("exp15/eval/").rpartition("-s")
        base, _, mult = rung.partition("-lrx")
        multiple = low * (float(mult) if mult else 1.0)
        ends.setdefault(multiple, {})[base] = _end(result.output_path(e.name))
    return {"grid_of_marin_reference": list(GRID), "metric": "micro.bpb at the end, seed 0",
            "ends": {f"{m:g}": v for m, v in sorted(ends.items())}, **choose(ends)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
