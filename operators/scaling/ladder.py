"""The plan of a scaling ladder as plain data: rungs x seeds, the learning-rate check, and the target.

``plan_ladder`` turns compute budgets (6·N·D, or parameter counts) into rungs with
:mod:`operators.scaling.rules`, and refuses plans that cannot make a forecast worth having:

- fewer than three distinct rungs (two budgets that land on the same shape count once, and the message
  says which);
- a target that is not beyond the top rung (``min_extrapolation``, default 1: anything above it; the
  research note recommends 10x, at most about 30x);
- no seeds, or repeated seeds.

The learning-rate check (``lr_multiples``, e.g. (0.5, 2.0)) adds runs of the smallest and the largest rung
at those multiples of the rule's learning rate (on the first ``lr_check_seeds`` seeds, default one); the fit
step reports whether the rule's own learning rate is within ``lr_check_tolerance`` of the best of them (the
research note: about 0.3%), comparing means over those seeds when there are several.

``target_lr_multiples`` adds runs of the target itself at those multiples (its seed, after the forecast is
frozen and posted: they do not feed the fit), and a step that says whether the rule's rate was within the
tolerance of the best of them at the target's end (:mod:`.lrcheck`), the assumption a check at the rungs
cannot test: on 2026-12-03 the rule sat on a flat optimum at both rungs and was 0.9% off at a target 10x
beyond them.

experiments/common/scaling_ladder.py turns a plan into steps; nothing here knows about steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from operators.scaling.rules import EVAL_FRACTIONS, LadderRules, RungSpec, rung_for_compute, rung_for_params


@dataclasses.dataclass(frozen=True)
class LadderPlan:
    """Rungs (smallest first), seeds, the learning-rate check runs and the target."""

    rungs: tuple[RungSpec, ...]
    seeds: tuple[int, ...]
    target: RungSpec
    target_seed: int
    lr_check: tuple[RungSpec, ...]
    fractions: tuple[float, ...]
    rules: LadderRules
    lr_check_seeds: int = 1
    """How many of ``seeds`` (the first ones) the learning-rate check runs on."""
    target_lr_multiples: tuple[float, ...] = ()
    """Multiples of the rule's learning rate the target is also trained at, after the forecast (never
    fitted; :mod:`.lrcheck` compares their ends with the target's)."""
    more_targets: tuple[RungSpec, ...] = ()
    """Further targets forecast by the same fit (each its own frozen record, run and verdict), smallest
    first; ``target`` is the first."""

    @property
    def targets(self) -> tuple[RungSpec, ...]:
        """Every target the ladder forecasts, the first (``target``) first."""
        return (self.target, *self.more_targets)

    def ladder_compute(self) -> float:
        """What the ladder's own runs cost in trainer FLOPs: every rung x seed and the check's runs."""
        rungs = sum(r.compute_trainer() for r in self.rungs) * len(self.seeds)
        return rungs + sum(r.compute_trainer() for r in self.lr_check) * self.lr_check_seeds

    def compute_share(self, target: RungSpec) -> float:
        """The ladder's compute over ``target``'s (Marin's ladder costs about 1% of the run it forecasts)."""
        return self.ladder_compute() / target.compute_trainer()

    @property
    def target_lr_check(self) -> tuple[tuple[float, RungSpec], ...]:
        """(multiple, the target at that multiple of the rule's learning rate) per check run."""
        return tuple((m, self.target.with_lr_multiple(m)) for m in self.target_lr_multiples)

    @property
    def extrapolation(self) -> float:
        """Target compute / top rung compute (6·N·D)."""
        return self.target.compute_6nd() / self.rungs[-1].compute_6nd()

    def summary(self) -> list[dict[str, Any]]:
        """One row per rung and the target: shape, N, D, compute, batch, steps, learning rate."""
        rows = []
        for role, rung in [*(("rung", r) for r in self.rungs), *(("target", t) for t in self.targets)]:
            rows.append(
                {
                    "role": role,
                    "name": rung.name,
                    "n_params": rung.n_params,
                    "tokens": rung.tokens,
                    "compute_6nd": rung.compute_6nd(),
                    "compute_trainer": rung.compute_trainer(),
                    "batch_size": rung.batch_size,
                    "num_steps": rung.num_steps,
                    "lr": rung.lr,
                }
            )
        return rows


def _check_arguments(
    budgets: Sequence[float],
    sizes: Sequence[float],
    seeds: Sequence[int],
    fractions: Sequence[float],
    lr_check_seeds: int,
    multiples: Mapping[str, Sequence[float]],
) -> None:
    """The checks of :func:`plan_ladder`'s arguments that need no rung (each error names the argument)."""
    if bool(budgets) == bool(sizes):
        raise ValueError(
            "plan_ladder: give either budgets= (6·N·D FLOPs per rung) or sizes= (non-embedding "
            "parameters per rung), not both or neither"
        )
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"plan_ladder: seeds={list(seeds)} must be a non-empty list of distinct seeds")
    if sorted(fractions) != list(fractions) or not fractions or fractions[-1] != 1.0 or fractions[0] <= 0:
        raise ValueError(
            f"plan_ladder: fractions={list(fractions)} must increase within (0, 1] and end at 1.0"
        )
    for label, values in multiples.items():
        names = {f"{m:g}" for m in values}  # as the runs' names write them
        if any(not m > 0 or f"{m:g}" == "1" for m in values) or len(names) != len(values):
            raise ValueError(
                f"plan_ladder: {label}={list(values)} must be distinct, positive and not 1.0 (the rule)"
            )
    if not 1 <= lr_check_seeds <= len(seeds):
        raise ValueError(
            f"plan_ladder: lr_check_seeds={lr_check_seeds} must be between 1 and the number of seeds "
            f"({len(seeds)})"
        )


def _distinct_rungs(wanted: Sequence[RungSpec]) -> list[RungSpec]:
    """The rungs with budgets that round to the same shape merged (at least 3, or an error naming them)."""
    rungs: list[RungSpec] = []
    merged: list[str] = []
    for rung in wanted:
        if rungs and rungs[-1].name == rung.name:
            merged.append(rung.name)
            continue
        rungs.append(rung)
    if len(rungs) < 3:
        raise ValueError(
            f"plan_ladder: only {len(rungs)} distinct rungs ({', '.join(r.name for r in rungs)}"
            f"{'; budgets merged into ' + ', '.join(merged) if merged else ''}); a law needs at "
            "least 3: spread the budgets further apart"
        )
    return rungs


def _targets(
    budgets: float | Sequence[float],
    base: Mapping[str, Any],
    rules: LadderRules,
    top: RungSpec,
    min_extrapolation: float,
) -> list[RungSpec]:
    """The target rungs, smallest first: each beyond ``min_extrapolation`` x the top rung, all distinct."""
    wanted = sorted([float(budgets)] if isinstance(budgets, int | float) else [float(b) for b in budgets])
    if not wanted:
        raise ValueError("plan_ladder: target=[] names no target budget; give one or more 6·N·D budgets")
    targets = [rung_for_compute(c, base, rules) for c in wanted]
    for t in targets:
        ratio = t.compute_6nd() / top.compute_6nd()
        if ratio <= min_extrapolation:
            raise ValueError(
                f"plan_ladder: the target {t.name} ({t.compute_6nd():.3g} FLOPs) is "
                f"only {ratio:.2f}x the top rung {top.name} ({top.compute_6nd():.3g}); "
                f"it must be more than {min_extrapolation:g}x (10x is the research note's advice)"
            )
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(
            f"plan_ladder: the target budgets {wanted} give the shapes {names}; two land on one shape: "
            "spread the budgets further apart"
        )
    return targets


def plan_ladder(
    base_model: Mapping[str, Any],
    *,
    seeds: Sequence[int],
    target: float | Sequence[float],
    budgets: Sequence[float] = (),
    sizes: Sequence[float] = (),
    rules: LadderRules | None = None,
    target_seed: int | None = None,
    lr_multiples: Sequence[float] = (),
    lr_check_seeds: int = 1,
    fractions: Sequence[float] = EVAL_FRACTIONS,
    min_extrapolation: float = 1.0,
    target_lr_multiples: Sequence[float] = (),
) -> LadderPlan:
    """A ladder from compute ``budgets`` (6·N·D) or parameter counts ``sizes``, and a ``target`` budget
    (or several: each is forecast from the same fit, frozen and scored on its own)."""
    rules = rules or LadderRules()
    multiples = {"lr_multiples": lr_multiples, "target_lr_multiples": target_lr_multiples}
    _check_arguments(budgets, sizes, seeds, fractions, lr_check_seeds, multiples)
    if budgets:
        wanted = [rung_for_compute(c, base_model, rules) for c in sorted(budgets)]
    else:
        wanted = [rung_for_params(n, base_model, rules) for n in sorted(sizes)]
    rungs = _distinct_rungs(wanted)
    targets = _targets(target, base_model, rules, rungs[-1], min_extrapolation)
    check = tuple(r.with_lr_multiple(m) for r in (rungs[0], rungs[-1]) for m in lr_multiples)
    return LadderPlan(
        rungs=tuple(rungs),
        seeds=tuple(seeds),
        target=targets[0],
        more_targets=tuple(targets[1:]),
        target_seed=seeds[0] if target_seed is None else target_seed,
        lr_check=check,
        fractions=tuple(fractions),
        rules=rules,
        lr_check_seeds=lr_check_seeds,
        target_lr_multiples=tuple(float(m) for m in target_lr_multiples),
    )
