"""Where a ladder rung's seed spread comes from: the initialisation seed or the data order.

Trains one rung of exp15's design (the same rules, corpus and held-out set) seven times: initialisation
seeds 0-3 on data order 0, and data orders 1-3 on initialisation 0, and scores each on the held-out set at
25/50/75/100% of its run. Compare the sigma of log bpb of the two groups (four runs each, run 0 shared).

    scripts/netns .venv/bin/python -m experiments.exp15.analysis.seed_split \\
        --prefix ladder-out/diag --backend local
    RUNG=d40-L3 ...   # another of exp15's rungs (default d32-L3); about 2 minutes on 2 cores
"""

from __future__ import annotations

import dataclasses
import os

import experiments.exp15_scaling_ladder as ex
from experiments.common.scaling_ladder import curve_config, rung_train_config
from marin import Step, executor_main
from operators.scaling.curve import evaluate_curve
from operators.train import train

RUNG = next(r for r in ex.plan.rungs if r.name == os.environ.get("RUNG", "d32-L3"))
PAIRS = [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)]  # (initialisation seed, data order)


def _steps() -> list[Step]:
    steps = []
    for init, data in PAIRS:
        base = rung_train_config(ex.base_train, RUNG, init, RUNG.eval_steps(ex.plan.fractions))
        t = Step(name=f"diag/train/{RUNG.name}-i{init}-d{data}", fn=train,
                 config=dataclasses.replace(base, data_seed=data))
        steps.append(Step(name=f"diag/eval/{RUNG.name}-i{init}-d{data}", fn=evaluate_curve,
                          config=curve_config(t, RUNG, ex.plan, ex.tokenized_bytes, "micro.bpb", 64)))
    return steps


if __name__ == "__main__":
    executor_main(steps=_steps(), description="a rung's seed spread: initialisation vs data order")
