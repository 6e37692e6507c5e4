"""exp15's rungs trained under variants of the ladder's rules (batch, tokens per parameter, decay, rate).

Each variant is ``[n_params, tokens_per_param, batch_tokens, seed, lr_multiple]`` with an optional sixth
entry, the decay fraction (default: the rules', 0.2); the rung is the one the rules pick for ``n_params``,
trained on exp15's corpus and scored on its held-out set at 25/50/75/100% of its run. A diagnostic for
designing a ladder (which variant moves the rungs off the steep part of the curve, or changes the late
gain), never for a target: training the target before its forecast is frozen would spoil the forecast.

    PROBE='[[46352,10,128,0,1],[46352,10,512,0,1,0.4]]' \\
      scripts/netns .venv/bin/python -m experiments.exp15.analysis.variants \\
        --prefix ladder-out/probe --backend local
    .venv/bin/python -m experiments.exp15.analysis.variants --show ladder-out/probe   # every probe's curve
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import experiments.exp15_scaling_ladder as ex
from experiments.common.scaling_ladder import curve_config, rung_train_config
from marin import Step, executor_main
from operators.scaling.curve import CURVE_FILE, evaluate_curve
from operators.scaling.rules import rung_for_params
from operators.train import train


def _steps(variants: list[list[float]]) -> list[Step]:
    steps = []
    for n, tpp, batch, seed, multiple, *rest in variants:
        decay = rest[0] if rest else ex.rules.decay_fraction
        rules = dataclasses.replace(
            ex.rules, tokens_per_param=tpp, batch_tokens=int(batch), decay_fraction=decay
        )
        base = rung_for_params(n, ex.BASE_MODEL, rules)
        rung = dataclasses.replace(base, lr=base.lr * multiple)
        tag = f"{rung.name}-t{tpp:g}-b{int(batch)}-s{int(seed)}-x{multiple:g}" + (
            f"-dec{decay:g}" if rest else ""
        )
        config = rung_train_config(ex.base_train, rung, int(seed), rung.eval_steps(ex.plan.fractions))
        t = Step(name=f"probe/train/{tag}", fn=train, config=config)
        steps.append(
            Step(
                name=f"probe/eval/{tag}",
                fn=evaluate_curve,
                config=curve_config(t, rung, ex.plan, ex.tokenized_bytes, "micro.bpb", 64),
            )
        )
    return steps


def show(prefix: str) -> dict[str, Any]:
    out = {}
    for curve in sorted(Path(prefix, "probe", "eval").glob(f"*/{CURVE_FILE}")):
        points = json.loads(curve.read_text())["points"]
        out[curve.parent.name.rsplit("-", 1)[0]] = {f"{p['fraction']:g}": p["value"] for p in points}
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--show"]:
        print(json.dumps(show(sys.argv[2]), indent=1))
    else:
        if "PROBE" not in os.environ:
            raise SystemExit("set PROBE to the variants to train, e.g. PROBE='[[46352,10,128,0,1]]' "
                             "([n_params, tokens_per_param, batch_tokens, seed, lr_multiple(, decay)], see "
                             "the module docstring), or pass --show PREFIX")
        executor_main(
            steps=_steps(json.loads(os.environ["PROBE"])), description="exp15 rungs under variant rules"
        )
