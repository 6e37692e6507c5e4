"""The ladder builder: a :class:`~operators.scaling.ladder.LadderPlan` -> the steps of a pre-registered
forecast.

    plan = plan_ladder(base_model, budgets=[...], seeds=[0, 1, 2], target=5e12)
    ladder = build_ladder("exp15", plan, base_train=TrainConfig(...), tokenized=tokenized, issue=ISSUE)
    executor_main(ladder.steps)

Steps (names under ``{name}/``), in DAG order:

- ``train/{rung}-s{seed}`` and ``eval/{rung}-s{seed}`` per rung and seed: the train operator with the rung's
  model, batch, learning rate and WSD schedule (:mod:`operators.scaling.rules`), keeping a checkpoint at
  each evaluation fraction; the curve eval step (:mod:`operators.scaling.curve`) scores each of them on the
  same held-out windows. The learning-rate check adds ``{rung}-lrx{m}`` runs.
- ``fit``: one law per fraction (fit.json); ``prediction``: the sealed prediction.json.
- ``target/train``: depends on ``prediction`` (the DAG guarantees the record exists first); it also waits
  for the engine to post the record to the issue, and evaluates the held-out set during training at the
  same fractions, so the issue and the dashboard show "on track / off track" as each evaluation lands.
- ``target/eval``: the same curve eval step as the rungs; ``verdict``: verdict.json, posted by the engine.
- ``target/train-lrx{m}``, ``target/eval-lrx{m}`` and ``target/lr-check`` when the plan has
  ``target_lr_multiples``: the target at other multiples of the rule's learning rate, after the forecast is
  frozen and posted (they depend on ``prediction``; the fit never reads them), and the note that says
  whether the rule's rate was the best at the target's end (:mod:`operators.scaling.lrcheck`), posted to
  the issue by the engine. A separate leaf: a failed check run never holds back the verdict.

The target's config hash in the record is the identity hash of the *plain* target train step (the same
training config without the dependency on the forecast), computed here with the engine's graph builder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import reduce
from typing import Any

from marin import Step, output_path_of, this_output_path
from marin.graph.dag import build_graph
from operators.scaling.curve import CurveConfig, evaluate_curve
from operators.scaling.fitstep import FitConfig, RungRun, fit_ladder
from operators.scaling.ladder import LadderPlan
from operators.scaling.lrcheck import TargetLrCheckConfig, check_target_lr
from operators.scaling.prediction import PredictionConfig, TargetSpec, predict_target
from operators.scaling.rules import RungSpec, trainer_overrides
from operators.scaling.target import (
    AfterForecastConfig,
    TargetTrainConfig,
    train_after_forecast,
    train_target,
)
from operators.scaling.verdict import VerdictConfig, score_prediction
from operators.train import TrainConfig, train


@dataclasses.dataclass(frozen=True)
class Ladder:
    """The steps of one ladder; ``steps`` is what to pass to executor_main (every leaf)."""

    plan: LadderPlan
    rung_trains: tuple[Step, ...]
    rung_evals: tuple[Step, ...]
    fit: Step
    prediction: Step
    target_train: Step
    target_eval: Step
    verdict: Step
    target_config_hash: str
    lr_check: Step | None = None
    """The target's learning-rate check (None: the plan has no target_lr_multiples)."""

    @property
    def steps(self) -> list[Step]:
        return [self.verdict] if self.lr_check is None else [self.verdict, self.lr_check]

    @property
    def rung_steps(self) -> list[Step]:
        """The rungs only (train + eval): run them first on a busy machine, the forecast later."""
        return list(self.rung_evals)


def rung_train_config(
    base: TrainConfig,
    rung: RungSpec,
    seed: int,
    eval_steps: Sequence[int],
    validation: Any = None,
    eval_max_batches: int | None = None,
) -> TrainConfig:
    every = reduce(math.gcd, eval_steps)
    overrides = {
        **base.overrides,
        **trainer_overrides(rung),
        "checkpoint.keep": len(eval_steps) + 1,
        "eval.batch_size": 8,
    }
    extra: dict[str, Any] = {}
    if validation is not None:
        extra = {"validation": validation, "eval_every": every, "eval_max_batches": eval_max_batches}
    return dataclasses.replace(
        base,
        output_path=this_output_path(),
        model=dict(rung.model),
        overrides=overrides,
        num_steps=rung.num_steps,
        batch_size=rung.batch_size,
        seq_len=rung.seq_len,
        seed=seed,
        data_seed=seed,
        checkpoint_every=every,
        progress_bar=False,
        **extra,
    )


def curve_config(
    train_step: Step, rung: RungSpec, plan: LadderPlan, tokenized: Step, metric: str, max_batches: int | None
) -> CurveConfig:
    return CurveConfig(
        output_path=this_output_path(),
        train=output_path_of(train_step),
        tokenized=output_path_of(tokenized),
        steps=rung.eval_steps(plan.fractions),
        num_steps=rung.num_steps,
        tokens_per_step=rung.batch_tokens,
        n_params=rung.n_params,
        flops_per_token=rung.flops_per_token,
        metric=metric,
        max_batches=max_batches,
    )


def build_ladder(
    name: str,
    plan: LadderPlan,
    *,
    base_train: TrainConfig,
    tokenized: Step,
    validation: dict[str, Any],
    issue: str | None,
    metric: str = "micro.bpb",
    eval_max_batches: int | None = 128,
    fixed_e: float | None = None,
    bootstrap: int = 1000,
    assumptions: Sequence[str] = (),
    require_posted: bool | None = None,
    end_rule: str = "law",
) -> Ladder:
    """Every step of the ladder (see the module docstring). ``validation`` maps domains to the held-out
    caches (``output_path_of(tokenized, "validation/python")``...) for the target's in-training evaluation.
    ``end_rule`` picks how the endpoint is forecast
    (:class:`operators.scaling.prediction.PredictionConfig`)."""
    trains, evals, runs = [], [], []
    check_seeds = plan.seeds[: plan.lr_check_seeds]
    pairs = [*((r, plan.seeds) for r in plan.rungs), *((r, check_seeds) for r in plan.lr_check)]
    for rung, seeds in pairs:
        multiple = 1.0 if "-lrx" not in rung.name else float(rung.name.rsplit("-lrx", 1)[1])
        for seed in seeds:
            t = Step(
                name=f"{name}/train/{rung.name}-s{seed}",
                fn=train,
                description=f"rung {rung.name} seed {seed}: N={rung.n_params:,}, D={rung.tokens:,}",
                config=rung_train_config(base_train, rung, seed, rung.eval_steps(plan.fractions)),
            )
            e = Step(
                name=f"{name}/eval/{rung.name}-s{seed}",
                fn=evaluate_curve,
                description=f"held-out {metric} of {rung.name} seed {seed} at {len(plan.fractions)} points",
                config=curve_config(t, rung, plan, tokenized, metric, eval_max_batches),
            )
            trains.append(t)
            evals.append(e)
            runs.append(
                RungRun(
                    rung=rung.name,
                    seed=seed,
                    curve=output_path_of(e),
                    train=output_path_of(t),
                    lr_multiple=multiple,
                )
            )
    fit = Step(
        name=f"{name}/fit",
        fn=fit_ladder,
        description="one law per evaluation fraction",
        config=FitConfig(
            output_path=this_output_path(),
            runs=tuple(runs),
            fractions=plan.fractions,
            fixed_e=fixed_e,
            bootstrap=bootstrap,
        ),
    )
    target = plan.target
    target_steps = target.eval_steps(plan.fractions)
    target_train_config = rung_train_config(
        base_train, target, plan.target_seed, target_steps, validation, eval_max_batches
    )
    plain = Step(name=f"{name}/target/train", fn=train, config=target_train_config)
    config_hash = build_graph([plain]).node_of(plain).hash
    spec = TargetSpec(
        name=target.name,
        config_hash=config_hash,
        n_params=target.n_params,
        tokens_per_step=target.batch_tokens,
        num_steps=target.num_steps,
        flops_per_token=target.flops_per_token,
        eval_steps=target_steps,
        seed=plan.target_seed,
    )
    prediction = Step(
        name=f"{name}/prediction",
        fn=predict_target,
        description="the frozen, hashed forecast",
        config=PredictionConfig(
            output_path=this_output_path(),
            fit=output_path_of(fit),
            target=spec,
            experiment=name,
            issue=issue,
            assumptions=tuple(assumptions),
            end_rule=end_rule,
        ),
    )
    posted = (issue is not None) if require_posted is None else require_posted
    target_train = Step(
        name=f"{name}/target/train",
        fn=train_target,
        description=f"the target {target.name}: N={target.n_params:,}, D={target.tokens:,}, "
        f"{plan.extrapolation:.1f}x the top rung",
        config=TargetTrainConfig(
            train=target_train_config,
            prediction=output_path_of(prediction),
            target_config_hash=config_hash,
            require_posted=posted,
        ),
    )
    target_eval = Step(
        name=f"{name}/target/eval",
        fn=evaluate_curve,
        description="the target's held-out curve",
        config=curve_config(target_train, target, plan, tokenized, metric, eval_max_batches),
    )
    verdict = Step(
        name=f"{name}/verdict",
        fn=score_prediction,
        description="the forecast scored",
        config=VerdictConfig(
            output_path=this_output_path(),
            prediction=output_path_of(prediction),
            target_curve=output_path_of(target_eval),
        ),
    )
    return Ladder(
        plan=plan,
        rung_trains=tuple(trains),
        rung_evals=tuple(evals),
        fit=fit,
        prediction=prediction,
        target_train=target_train,
        target_eval=target_eval,
        verdict=verdict,
        target_config_hash=config_hash,
        lr_check=_target_lr_check(
            name, plan, base_train, tokenized, prediction, target_eval, metric, eval_max_batches, posted
        ),
    )


def _target_lr_check(
    name: str,
    plan: LadderPlan,
    base_train: TrainConfig,
    tokenized: Step,
    prediction: Step,
    target_eval: Step,
    metric: str,
    eval_max_batches: int | None,
    require_posted: bool,
) -> Step | None:
    """The target at each of the plan's other learning-rate multiples (train + eval, each train step
    waiting for the frozen, posted forecast) and the step comparing their ends; None without multiples."""
    runs = []
    for multiple, rung in plan.target_lr_check:
        config = rung_train_config(base_train, rung, plan.target_seed, rung.eval_steps(plan.fractions))
        t = Step(
            name=f"{name}/target/train-lrx{multiple:g}",
            fn=train_after_forecast,
            description=f"the target at x{multiple:g} the rule's learning rate (after the forecast)",
            config=AfterForecastConfig(
                train=config, prediction=output_path_of(prediction), require_posted=require_posted
            ),
        )
        e = Step(
            name=f"{name}/target/eval-lrx{multiple:g}",
            fn=evaluate_curve,
            description=f"held-out {metric} of the target at x{multiple:g} the rule's learning rate",
            config=curve_config(t, rung, plan, tokenized, metric, eval_max_batches),
        )
        runs.append((multiple, output_path_of(e)))
    if not runs:
        return None
    return Step(
        name=f"{name}/target/lr-check",
        fn=check_target_lr,
        description="was the rule's learning rate the best at the target?",
        config=TargetLrCheckConfig(
            output_path=this_output_path(),
            prediction=output_path_of(prediction),
            target_curve=output_path_of(target_eval),
            runs=tuple(runs),
        ),
    )
