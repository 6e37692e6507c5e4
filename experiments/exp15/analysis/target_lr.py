"""Is the learning-rate rule mistuned at the ladder's target? exp15's target at multiples of the rule's rate.

The fifth ladder's forecast missed its target by -3.45% (too low) with every gate passing and the rule's
learning rate within 0.32% of the best multiple at the smallest and the top rung; its record states the
assumption that the rule is not mistuned at the target's size, which only the target can check. This trains
exp15's target (the same rules, corpus, seed and held-out set as the ladder's, without the forecast
dependency and the in-training evaluation, which change nothing it learns) at each multiple of the rule's
learning rate in ``LR_MULTIPLES`` (default 1, 0.5, 2: the rule's run is the control, and should reproduce
the ladder's target), and scores each on the held-out set at 25/50/75/100% of its run. For a ladder not yet
run, ``plan_ladder(target_lr_multiples=...)`` does the same inside the ladder, after the forecast, and
posts the comparison as a note on the prediction; this script is for ladders already scored without it.

    scripts/netns .venv/bin/python -m experiments.exp15.analysis.target_lr \\
        --prefix ladder-out/diag --backend local
    LR_MULTIPLES=1,1.5 ...   # other multiples

It trains the target of exp15 as it stands: since the seventh design that is d72-L5 at seed 300 (about 10
minutes a run on 2 quiet cores); the figures recorded on 2026-12-03 (runs/2026-12-03-ladder-target-lr.json)
are of the fifth design's d64-L4 at seed 100 (about 3 minutes a run), at fedb53d's exp15.
"""

from __future__ import annotations

import os

import experiments.exp15_scaling_ladder as ex
from experiments.common.scaling_ladder import curve_config, rung_train_config
from marin import Step, executor_main
from operators.scaling.curve import evaluate_curve
from operators.train import train

MULTIPLES = [float(m) for m in os.environ.get("LR_MULTIPLES", "1,0.5,2").split(",")]


def _steps() -> list[Step]:
    steps = []
    for m in MULTIPLES:
        rung = ex.plan.target if m == 1.0 else ex.plan.target.with_lr_multiple(m)
        steps_at = rung.eval_steps(ex.plan.fractions)
        config = rung_train_config(ex.base_train, rung, ex.plan.target_seed, steps_at)
        t = Step(name=f"diag/target-lr/train/{rung.name}-s{ex.plan.target_seed}", fn=train, config=config)
        steps.append(Step(name=f"diag/target-lr/eval/{rung.name}-s{ex.plan.target_seed}", fn=evaluate_curve,
                          config=curve_config(t, rung, ex.plan, ex.tokenized_bytes, "micro.bpb", 64)))
    return steps


if __name__ == "__main__":
    executor_main(steps=_steps(), description="the learning-rate rule at the ladder's target")
