"""Where a ladder rung's seed spread comes from: the initialisation seed or the data order.

Trains one rung of exp15's design (the same rules, corpus and held-out set) seven times: initialisation
seeds 0-3 on data order 0, and data orders 1-3 on initialisation 0, and scores each on the held-out set at
25/50/75/100% of its run. Compare the sigma of log bpb of the two groups (four runs each, run 0 shared).

    scripts/netns .venv/bin/python -m experiments.exp15.analysis.seed_split \\
        --prefix ladder-out/diag --backend local
    RUNG=d40-L4 ...   # another of exp15's rungs (default d32-L4); about 2 minutes on 2 cores

The rung is one of the current design's (``experiments/exp15_scaling_ladder.py``: d24-L4 .. d56-L4 for the
eleventh); a name that is not one of them stops with the list. The recorded split
(docs/benchmarks/runs/2026-12-02-ladder-seed-split.json) was of d32-L3, a rung of the third design that
the current one no longer has.
"""

from __future__ import annotations

import dataclasses
import os

import experiments.exp15_scaling_ladder as ex
from experiments.common.scaling_ladder import curve_config, rung_train_config
from marin import Step, executor_main
from operators.scaling.curve import evaluate_curve
from operators.scaling.rules import RungSpec
from operators.train import train


def _rung(name: str) -> RungSpec:
    """The current design's rung named `name`; SystemExit naming the rungs there are, for any other."""
    for rung in ex.plan.rungs:
        if rung.name == name:
            return rung
    raise SystemExit(f"RUNG={name} is not a rung of exp15's current design; its rungs are "
                     f"{', '.join(r.name for r in ex.plan.rungs)}: set RUNG to one of them")


RUNG = _rung(os.environ.get("RUNG", "d32-L4"))
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
