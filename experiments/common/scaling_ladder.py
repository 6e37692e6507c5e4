"""The ladder builder: a :class:`~operators.scaling.ladder.LadderPlan` -> the steps of a pre-registered
forecast.

    plan = plan_ladder(base_model, budgets=[...], seeds=[0, 1, 2], target=5e12)
    ladder = build_ladder("exp15", plan, base_train=TrainConfig(...), tokenized=tokenized, issue=ISSUE,
                          validation=..., settings=LadderSettings(fixed_e=1.176))
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

With several targets (``plan_ladder(target=[...])``) each further target gets its own
``target-{shape}/prediction``, ``target-{shape}/train``, ``target-{shape}/eval`` and
``target-{shape}/verdict`` (the first keeps the names above): one fit, one frozen record per target, each
posted before its run.

The target's config hash in the record is the identity hash of the *plain* target train step (the same
training config without the dependency on the forecast), from the engine's public
:func:`marin.identity_hash`. Each record also says which recipe trained the rungs and the target, and what
share of the target's compute the ladder cost (``ladder``: :func:`ladder_facts`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from functools import reduce
from typing import Any

from marin import Step, identity_hash, output_path_of, this_output_path
from operators.scaling.curve import CurveConfig, evaluate_curve
from operators.scaling.fitstep import FitConfig, RungRun, fit_ladder
from operators.scaling.ladder import LadderPlan
from operators.scaling.lrcheck import TargetLrCheckConfig, check_target_lr
from operators.scaling.prediction import PredictionConfig, TargetSpec, predict_target
from operators.scaling.rules import RECIPE_V2, RungSpec, trainer_overrides
from operators.scaling.target import (
    AfterForecastConfig,
    TargetTrainConfig,
    train_after_forecast,
    train_target,
)
from operators.scaling.verdict import VerdictConfig, score_prediction
from operators.train import TrainConfig, train


@dataclasses.dataclass(frozen=True)
class LadderSettings:
    """How the forecast is made and scored (everything of :func:`build_ladder` that is not a step)."""

    metric: str = "micro.bpb"
    """The held-out metric forecast (a key of the eval step's rows)."""
    eval_max_batches: int | None = 128
    """Held-out batches per evaluation (the same windows for every run)."""
    fixed_e: float | None = None
    """E fixed (an assumption stated in the record) instead of fitted."""
    bootstrap: int = 1000
    """Bootstrap replicates of the interval."""
    assumptions: tuple[str, ...] = ()
    """Stated assumptions, on every record and comment."""
    require_posted: bool | None = None
    """Each target waits for its record's issue comment (None: whenever the ladder has an issue)."""
    end_rule: str = "law"
    """How the endpoint is forecast (:class:`operators.scaling.prediction.PredictionConfig`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "assumptions", tuple(self.assumptions))


@dataclasses.dataclass(frozen=True)
class Forecast:
    """One target's steps: its frozen record, its run, its scored curve."""

    target: RungSpec
    prediction: Step
    train: Step
    eval: Step
    verdict: Step
    config_hash: str
    """The identity hash of the plain target train step, named by the record."""


@dataclasses.dataclass(frozen=True)
class Ladder:
    """The steps of one ladder; ``steps`` is what to pass to executor_main (every leaf)."""

    plan: LadderPlan
    rung_trains: tuple[Step, ...]
    rung_evals: tuple[Step, ...]
    fit: Step
    forecasts: tuple[Forecast, ...]
    """One per target, the plan's first target first."""
    lr_check: Step | None = None
    """The first target's learning-rate check (None: the plan has no target_lr_multiples)."""

    @property
    def prediction(self) -> Step:
        return self.forecasts[0].prediction

    @property
    def target_train(self) -> Step:
        return self.forecasts[0].train

    @property
    def target_eval(self) -> Step:
        return self.forecasts[0].eval

    @property
    def verdict(self) -> Step:
        return self.forecasts[0].verdict

    @property
    def verdicts(self) -> tuple[Step, ...]:
        return tuple(f.verdict for f in self.forecasts)

    @property
    def target_config_hash(self) -> str:
        return self.forecasts[0].config_hash

    @property
    def steps(self) -> list[Step]:
        return [*self.verdicts, *(() if self.lr_check is None else (self.lr_check,))]

    @property
    def rung_steps(self) -> list[Step]:
        """The rungs only (train + eval): run them first on a busy machine, the forecast later; in the
        order of :meth:`scheduled`."""
        return self.scheduled()[: len(self.rung_evals)]

    def scheduled(self) -> list[Step]:
        """``steps`` with the rungs' eval steps named first, seed-major (every rung's first seed, then every
        rung's second...): what to pass to executor_main on one machine. The executor starts ready steps in
        the order it finds them, and a rung's compiled programs do not depend on its seed, so the later
        seeds of a shape find them in JAX's persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``)
        instead of compiling the same program at the same time as the first seed (in ``rung_evals``' order,
        rung-major, two workers took both seeds of a rung at once). The same steps and hashes as ``steps``."""
        seeds = sorted({_seed_of(e.name) for e in self.rung_evals})
        evals = sorted(self.rung_evals, key=lambda e: seeds.index(_seed_of(e.name)))  # stable in rung order
        return [*evals, *self.steps]


def _seed_of(step_name: str) -> int:
    return int(step_name.rpartition("-s")[2])


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


def ladder_facts(plan: LadderPlan, target: RungSpec) -> dict[str, Any]:
    """What a record says about the ladder behind it: the recipe (and, for ``delphi-v2``, the reference its
    learning rates came from: ``v2_reference``), and its compute share of ``target``. An ``adamw-v1``
    ladder's facts are what they were before the reference was recorded (their prediction hashes stay)."""
    reference = {"v2_reference": plan.rules.v2_reference()} if target.recipe == RECIPE_V2 else {}
    return {
        **reference,
        "recipe": target.recipe,
        "rungs_recipe": sorted({r.recipe for r in plan.rungs}),
        "compute_trainer": plan.ladder_compute(),
        "target_compute_trainer": target.compute_trainer(),
        "compute_share": plan.compute_share(target),
        "targets": [t.name for t in plan.targets],
    }


@dataclasses.dataclass(frozen=True)
class _Build:
    """What every step of one ladder is built from."""

    name: str
    plan: LadderPlan
    base_train: TrainConfig
    tokenized: Step
    validation: Mapping[str, Any]
    issue: str | None
    settings: LadderSettings

    @property
    def posted(self) -> bool:
        required = self.settings.require_posted
        return (self.issue is not None) if required is None else required

    def curve(self, train_step: Step, rung: RungSpec) -> CurveConfig:
        s = self.settings
        return curve_config(train_step, rung, self.plan, self.tokenized, s.metric, s.eval_max_batches)


def _rung_run(b: _Build, rung: RungSpec, seed: int) -> tuple[Step, Step, RungRun]:
    """One rung and seed: its train step, its curve eval step, and the fit's view of the pair."""
    t = Step(
        name=f"{b.name}/train/{rung.name}-s{seed}",
        fn=train,
        description=f"rung {rung.name} seed {seed}: N={rung.n_params:,}, D={rung.tokens:,}",
        config=rung_train_config(b.base_train, rung, seed, rung.eval_steps(b.plan.fractions)),
    )
    e = Step(
        name=f"{b.name}/eval/{rung.name}-s{seed}",
        fn=evaluate_curve,
        description=f"held-out {b.settings.metric} of {rung.name} seed {seed} at "
        f"{len(b.plan.fractions)} points",
        config=b.curve(t, rung),
    )
    run = RungRun(
        rung=rung.name,
        seed=seed,
        curve=output_path_of(e),
        train=output_path_of(t),
        lr_multiple=rung.lr_multiple,
    )
    return t, e, run


def _fit(b: _Build, runs: Sequence[RungRun]) -> Step:
    return Step(
        name=f"{b.name}/fit",
        fn=fit_ladder,
        description="one law per evaluation fraction",
        config=FitConfig(
            output_path=this_output_path(),
            runs=tuple(runs),
            fractions=b.plan.fractions,
            fixed_e=b.settings.fixed_e,
            bootstrap=b.settings.bootstrap,
        ),
    )


def _target_spec(target: RungSpec, config_hash: str, b: _Build) -> TargetSpec:
    return TargetSpec(
        name=target.name,
        config_hash=config_hash,
        n_params=target.n_params,
        tokens_per_step=target.batch_tokens,
        num_steps=target.num_steps,
        flops_per_token=target.flops_per_token,
        eval_steps=target.eval_steps(b.plan.fractions),
        seed=b.plan.target_seed,
    )


def _forecast(b: _Build, fit: Step, target: RungSpec, first: bool) -> Forecast:
    """One target's prediction, train, eval and verdict steps (the first target keeps the old names)."""
    names = ("prediction", "target/train", "target/eval", "verdict")
    if not first:
        names = tuple(f"target-{target.name}/{n}" for n in ("prediction", "train", "eval", "verdict"))
    s, steps_at = b.settings, target.eval_steps(b.plan.fractions)
    train_config = rung_train_config(
        b.base_train, target, b.plan.target_seed, steps_at, dict(b.validation), s.eval_max_batches
    )
    config_hash = identity_hash(Step(name=f"{b.name}/{names[1]}", fn=train, config=train_config))
    prediction = Step(
        name=f"{b.name}/{names[0]}",
        fn=predict_target,
        description=f"the frozen, hashed forecast of {target.name}",
        config=PredictionConfig(
            output_path=this_output_path(),
            fit=output_path_of(fit),
            target=_target_spec(target, config_hash, b),
            experiment=b.name,
            issue=b.issue,
            assumptions=s.assumptions,
            end_rule=s.end_rule,
            ladder=ladder_facts(b.plan, target),
        ),
    )
    run = Step(
        name=f"{b.name}/{names[1]}",
        fn=train_target,
        description=f"the target {target.name}: N={target.n_params:,}, D={target.tokens:,}, "
        f"{target.compute_6nd() / b.plan.rungs[-1].compute_6nd():.1f}x the top rung",
        config=TargetTrainConfig(
            train=train_config,
            prediction=output_path_of(prediction),
            target_config_hash=config_hash,
            require_posted=b.posted,
        ),
    )
    curve = Step(
        name=f"{b.name}/{names[2]}",
        fn=evaluate_curve,
        description=f"the held-out curve of {target.name}",
        config=b.curve(run, target),
    )
    verdict = Step(
        name=f"{b.name}/{names[3]}",
        fn=score_prediction,
        description=f"the forecast of {target.name} scored",
        config=VerdictConfig(
            output_path=this_output_path(),
            prediction=output_path_of(prediction),
            target_curve=output_path_of(curve),
        ),
    )
    return Forecast(target, prediction, run, curve, verdict, config_hash)


def build_ladder(
    name: str,
    plan: LadderPlan,
    *,
    base_train: TrainConfig,
    tokenized: Step,
    validation: Mapping[str, Any],
    issue: str | None,
    settings: LadderSettings | None = None,
    **options: Any,
) -> Ladder:
    """Every step of the ladder (see the module docstring). ``validation`` maps domains to the held-out
    caches (``output_path_of(tokenized, "validation/python")``...) for the targets' in-training evaluation.
    ``options`` are :class:`LadderSettings` fields given one by one (``fixed_e=1.176``), on top of
    ``settings``."""
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(LadderSettings)})
    if unknown:
        raise TypeError(
            f"build_ladder: unknown option(s) {unknown}; the options are LadderSettings' fields: "
            f"{', '.join(f.name for f in dataclasses.fields(LadderSettings))}"
        )
    b = _Build(
        name,
        plan,
        base_train,
        tokenized,
        validation,
        issue,
        dataclasses.replace(settings or LadderSettings(), **options),
    )
    check_seeds = plan.seeds[: plan.lr_check_seeds]
    pairs = [(r, s) for r in plan.rungs for s in plan.seeds] + [
        (r, s) for r in plan.lr_check for s in check_seeds
    ]
    built = [_rung_run(b, rung, seed) for rung, seed in pairs]
    fit = _fit(b, [run for _, _, run in built])
    forecasts = tuple(_forecast(b, fit, t, i == 0) for i, t in enumerate(plan.targets))
    return Ladder(
        plan=plan,
        rung_trains=tuple(t for t, _, _ in built),
        rung_evals=tuple(e for _, e, _ in built),
        fit=fit,
        forecasts=forecasts,
        lr_check=_target_lr_check(b, forecasts[0]),
    )


def _target_lr_check(b: _Build, first: Forecast) -> Step | None:
    """The first target at each of the plan's other learning-rate multiples (train + eval, each train step
    waiting for the frozen, posted forecast) and the step comparing their ends; None without multiples."""
    runs = []
    for multiple, rung in b.plan.target_lr_check:
        config = rung_train_config(b.base_train, rung, b.plan.target_seed, rung.eval_steps(b.plan.fractions))
        t = Step(
            name=f"{b.name}/target/train-lrx{multiple:g}",
            fn=train_after_forecast,
            description=f"the target at x{multiple:g} the rule's learning rate (after the forecast)",
            config=AfterForecastConfig(
                train=config, prediction=output_path_of(first.prediction), require_posted=b.posted
            ),
        )
        e = Step(
            name=f"{b.name}/target/eval-lrx{multiple:g}",
            fn=evaluate_curve,
            description=f"held-out {b.settings.metric} of the target at x{multiple:g} the rule's "
            "learning rate",
            config=b.curve(t, rung),
        )
        runs.append((multiple, output_path_of(e)))
    if not runs:
        return None
    return Step(
        name=f"{b.name}/target/lr-check",
        fn=check_target_lr,
        description="was the rule's learning rate the best at the target?",
        config=TargetLrCheckConfig(
            output_path=this_output_path(),
            prediction=output_path_of(first.prediction),
            target_curve=output_path_of(first.eval),
            runs=tuple(runs),
        ),
    )
