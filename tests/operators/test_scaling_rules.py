"""The ladder's rules and plan: shapes, batches, learning rates and recipes by the documented formulas,
the refusals of a plan that cannot forecast, and the learning-rate checks' runs in the plan (no training)."""

from __future__ import annotations

import pytest

from moe_trainer.hparams import DelphiV2Rule
from operators.scaling.ladder import plan_ladder
from operators.scaling.rules import (
    RECIPE_V1,
    RECIPE_V2,
    LadderRules,
    layers_for,
    rung_for_compute,
    rung_for_params,
    trainer_overrides,
)
from tests.fakes.scaling_ladder import DENSE


def test_rules_give_shapes_batches_and_learning_rates_by_the_documented_formulas() -> None:
    rules = LadderRules(recipe=RECIPE_V1)  # the older recipe's formula (the default is delphi-v2, below)
    rungs = [rung_for_compute(c, DENSE, rules) for c in (5e9, 5e10, 5e11, 5e12)]
    assert [r.n_params for r in rungs] == sorted(r.n_params for r in rungs)
    for r in rungs:
        assert r.num_steps % 4 == 0 and r.batch_tokens & (r.batch_tokens - 1) == 0  # power of two
        assert r.batch_tokens >= rules.min_batch_tokens
        assert r.tokens / r.n_params == pytest.approx(rules.tokens_per_param, rel=0.15)
        width = r.model["d_model"]
        assert abs(r.model["n_layers"] - layers_for(width)) <= 1 and r.model["d_ff"] == 4 * width
        expected = 0.004 * (r.batch_tokens / 2048) ** 0.5 * (1.2e6 / r.tokens) ** 0.3 * (64 / width) ** 0.5
        assert r.lr == pytest.approx(expected)
        assert r.warmup_steps == round(0.1 * r.num_steps)
        assert r.compute_6nd() == 6 * r.n_params * r.tokens
        assert r.compute_trainer() > r.compute_6nd()  # head and attention on top of 6N
    assert trainer_overrides(rungs[0])["schedule.kind"] == "wsd"


def test_a_fixed_batch_holds_for_every_rung_and_the_target() -> None:
    rules = LadderRules(tokens_per_param=10.0, batch_tokens=512, recipe=RECIPE_V1)
    plan = plan_ladder(DENSE, sizes=[7.8e3, 1.86e4, 4.64e4], seeds=[0], target=3.6e12, rules=rules)
    assert {r.batch_tokens for r in (*plan.rungs, plan.target)} == {512}
    for r in (*plan.rungs, plan.target):  # the batch term of the learning-rate rule is the same constant
        width = r.model["d_model"]
        expected = 0.004 * (512 / 2048) ** 0.5 * (1.2e6 / r.tokens) ** 0.3 * (64 / width) ** 0.5
        assert r.lr == pytest.approx(expected)
    with pytest.raises(ValueError, match="batch_tokens=500 must be a positive multiple of seq_len=128"):
        LadderRules(batch_tokens=500)


def test_the_default_recipe_is_delphi_v2_through_the_one_rule() -> None:
    rules = LadderRules()
    assert rules.recipe == RECIPE_V2
    rungs = [rung_for_compute(c, DENSE, rules) for c in (5e9, 5e10, 5e11)]
    for r in rungs:  # DelphiV2Rule's own numbers at the rung's batch and run length: one implementation
        hp = DelphiV2Rule().at(r.batch_size, r.seq_len, r.tokens)
        assert r.lr == hp.lr and r.optimizer["adam_lr"] == hp.adam_lr and r.optimizer["beta2"] == hp.beta2
        b, t = r.batch_tokens, r.tokens
        assert r.lr == pytest.approx(0.0063 * (b / 262144) ** 0.5 * (2.5e9 / t) ** 0.3)  # falls with T
        o = trainer_overrides(r)
        assert o["optimizer.name"] == "adamh" and o["optimizer.hyperball_lr"] == r.lr
        assert o["optimizer.lr"] == hp.adam_lr and o["health.max_grad_norm"] == 0.1
        assert "optimizer.weight_decay" not in o  # AdamH keeps each matrix's norm: no weight decay
    same_batch = LadderRules(batch_tokens=512)
    short, long = (rung_for_compute(c, DENSE, same_batch) for c in (5e9, 5e11))
    assert long.lr < short.lr  # the token-horizon term: a longer run gets a smaller rate
    doubled = long.with_lr_multiple(2.0)
    assert (doubled.lr_multiple, doubled.lr) == (2.0, 2 * long.lr)
    assert doubled.optimizer["adam_lr"] == 2 * long.optimizer["adam_lr"]
    v1 = rung_for_compute(5e9, DENSE, LadderRules(recipe=RECIPE_V1))
    assert trainer_overrides(v1) == {  # exactly what every ladder before the recipes wrote
        "optimizer.lr": v1.lr, "schedule.kind": "wsd", "schedule.warmup_steps": v1.warmup_steps,
        "schedule.decay_fraction": 0.2, "schedule.min_lr_ratio": 0.0}
    with pytest.raises(ValueError, match="recipe='v3' is not one of delphi-v2, adamw-v1"):
        LadderRules(recipe="v3")


def test_moe_rungs_keep_the_base_experts_and_count_active_parameters() -> None:
    moe = {**DENSE, "n_experts": 4, "top_k": 2, "n_shared_experts": 1}
    rung = rung_for_params(4e4, moe, LadderRules())
    assert rung.model["n_experts"] == 4 and rung.model["expert_d_ff"] == 2 * rung.model["d_model"]
    assert rung.n_total > rung.n_params  # inactive experts and the embedding are not in N


def test_plan_refuses_too_few_rungs_and_a_target_inside_the_ladder() -> None:
    with pytest.raises(
        ValueError, match=r"only 1 distinct rungs \(d16-L2; budgets merged into d16-L2, d16-L2\)"
    ):
        plan_ladder(DENSE, budgets=[1e8, 2e8, 3e8], seeds=[0], target=1e12)
    with pytest.raises(ValueError, match="must be more than 10x"):
        plan_ladder(DENSE, budgets=[5e9, 5e10, 5e11], seeds=[0], target=1e12, min_extrapolation=10)
    plan = plan_ladder(DENSE, budgets=[5e9, 5e10, 5e11], seeds=[0, 1], target=5e12, lr_multiples=(0.5, 2.0))
    assert plan.extrapolation > 10 and [r.name for r in plan.lr_check][0].endswith("-lrx0.5")


def test_plan_adds_the_targets_learning_rate_runs_and_refuses_bad_multiples() -> None:
    plan = plan_ladder(
        DENSE, budgets=[5e9, 5e10, 5e11], seeds=[0, 1], target=5e12, target_lr_multiples=(0.5, 2)
    )
    target, runs = plan.target, plan.target_lr_check
    assert [m for m, _ in runs] == [0.5, 2.0]
    assert [r.name for _, r in runs] == [f"{target.name}-lrx0.5", f"{target.name}-lrx2"]
    assert [r.lr / target.lr for _, r in runs] == pytest.approx([0.5, 2.0])
    assert all(r.model == target.model and r.num_steps == target.num_steps for _, r in runs)
    for bad in ((1.0,), (0.5, 0.5), (-2.0,), (0.5, 0.5000001)):  # the last two would share a run's name
        with pytest.raises(ValueError, match="target_lr_multiples=.*distinct, positive and not 1.0"):
            plan_ladder(DENSE, budgets=[5e9, 5e10, 5e11], seeds=[0], target=5e12, target_lr_multiples=bad)
