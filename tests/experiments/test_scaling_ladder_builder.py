"""The ladder builder's endpoint rule reaches the prediction step's config and its identity (no training)."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.common.scaling_ladder import build_ladder, ladder_facts
from marin import Step, identity_hash, output_path_of, this_output_path
from marin.graph.dag import build_graph
from operators.scaling.ladder import plan_ladder
from operators.scaling.rules import RECIPE_V1, LadderRules
from operators.tokenize import TokenizeConfig, tokenize
from operators.train import TrainConfig, train

BASE = {"vocab_size": 257, "n_experts": 0}


def _ladder(**kwargs):  # type: ignore[no-untyped-def]
    tokenized = Step(name="tokenized/x", fn=tokenize,
                     config=TokenizeConfig(input_path="/nowhere/docs", tokenizer_path="/nowhere/tok",
                                           output_path=this_output_path()))
    rules = LadderRules(tokens_per_param=2.0, min_batch_tokens=64, seq_len=32, min_width=8, head_dim=4)
    plan = plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0, 1], target=2.7e9, rules=rules)
    base = TrainConfig(output_path=this_output_path(), train_cache=output_path_of(tokenized, "train"),
                       preset="tiny", wandb_mode="disabled")
    return build_ladder("exp", plan, base_train=base, tokenized=tokenized,
                        validation={"prose": output_path_of(tokenized, "validation/prose")}, issue=None,
                        eval_max_batches=4, bootstrap=20, **kwargs)


def test_the_end_rule_reaches_the_prediction_and_its_hash() -> None:
    law, anchored = _ladder(), _ladder(end_rule="pre_decay_anchor")
    assert law.prediction.config.end_rule == "law"
    assert anchored.prediction.config.end_rule == "pre_decay_anchor"

    def hashes(ladder):  # type: ignore[no-untyped-def]
        graph = build_graph([ladder.verdict])
        steps = [*ladder.rung_trains, *ladder.rung_evals, ladder.fit, ladder.prediction, ladder.target_train]
        return {s.name: graph.node_of(s).hash for s in steps}

    a, b = hashes(law), hashes(anchored)
    # a new rule is a new record (and so a new target step, which depends on it); the rungs and the fit stay
    assert a["exp/prediction"] != b["exp/prediction"] and a["exp/target/train"] != b["exp/target/train"]
    assert a["exp/fit"] == b["exp/fit"]
    assert all(a[k] == b[k] for k in a if k.startswith(("exp/train/", "exp/eval/")))


def test_an_unknown_end_rule_is_refused_when_the_ladder_is_built() -> None:
    with pytest.raises(ValueError, match="end_rule='anchor' is not one of law, pre_decay_anchor"):
        _ladder(end_rule="anchor")


def _three_targets(**kwargs):  # type: ignore[no-untyped-def]
    tokenized = Step(name="tokenized/x", fn=tokenize,
                     config=TokenizeConfig(input_path="/nowhere/docs", tokenizer_path="/nowhere/tok",
                                           output_path=this_output_path()))
    rules = LadderRules(tokens_per_param=2.0, min_batch_tokens=64, seq_len=32, min_width=8, head_dim=4)
    plan = plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0, 1], target=[2.7e10, 2.7e9, 8.1e9],
                       rules=rules)
    base = TrainConfig(output_path=this_output_path(), train_cache=output_path_of(tokenized, "train"),
                       preset="tiny", wandb_mode="disabled")
    return build_ladder("exp", plan, base_train=base, tokenized=tokenized,
                        validation={"prose": output_path_of(tokenized, "validation/prose")}, issue="o/r#1",
                        **kwargs)


def test_several_targets_each_get_a_frozen_record_a_run_and_a_verdict() -> None:
    ladder = _three_targets(eval_max_batches=4, bootstrap=20)
    plan = ladder.plan
    assert [t.compute_6nd() for t in plan.targets] == sorted(t.compute_6nd() for t in plan.targets)
    assert len(ladder.forecasts) == 3 and ladder.steps == [f.verdict for f in ladder.forecasts]
    first, *rest = ladder.forecasts
    assert (first.prediction.name, first.train.name, first.verdict.name) == (
        "exp/prediction", "exp/target/train", "exp/verdict")
    assert [f.prediction.name for f in rest] == [f"exp/target-{f.target.name}/prediction" for f in rest]
    graph = build_graph(ladder.steps)
    for f in ladder.forecasts:
        config = f.prediction.config
        assert config.target.name == f.target.name
        # the record names the plain train step's identity hash, and that step waits for this record
        plain = Step(name=f.train.name, fn=train, config=f.train.config.train)
        assert config.target.config_hash == f.config_hash == identity_hash(plain)
        assert f.train.config.target_config_hash == f.config_hash and f.train.config.require_posted
        deps = [d.step.name for d in graph.node_of(f.train).deps]
        others = [d for d in deps if "prediction" in d and d != f.prediction.name]
        assert f.prediction.name in deps and not others
        facts = config.ladder
        assert facts["recipe"] == "delphi-v2" and facts["targets"] == [t.name for t in plan.targets]
        assert facts["compute_share"] == pytest.approx(plan.ladder_compute() / f.target.compute_trainer())
    shares = [f.prediction.config.ladder["compute_share"] for f in ladder.forecasts]
    assert shares == sorted(shares, reverse=True) and len(set(shares)) == 3
    # the rungs' cost: every rung x seed, trainer FLOPs
    assert plan.ladder_compute() == pytest.approx(sum(r.compute_trainer() for r in plan.rungs) * 2)


def test_targets_that_share_a_shape_or_sit_inside_the_ladder_are_refused_and_options_are_checked() -> None:
    rules = LadderRules(tokens_per_param=2.0, min_batch_tokens=64, seq_len=32, min_width=8, head_dim=4)
    with pytest.raises(ValueError, match="two land on one shape"):
        plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=[2.7e9, 2.71e9], rules=rules)
    with pytest.raises(ValueError, match="must be more than 1x"):
        plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=[2.7e9, 1e5], rules=rules)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['fixed_E'\]; the options are LadderSettings"):
        _three_targets(fixed_E=1.0)


def test_the_learning_rate_multiple_is_a_field_of_the_rung_not_parsed_from_its_name() -> None:
    rules = LadderRules(tokens_per_param=2.0, min_batch_tokens=64, seq_len=32, min_width=8, head_dim=4)
    plan = plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=2.7e9, rules=rules,
                       lr_multiples=(0.5, 2.0))
    tokenized = Step(name="tokenized/x", fn=tokenize,
                     config=TokenizeConfig(input_path="/nowhere/docs", tokenizer_path="/nowhere/tok",
                                           output_path=this_output_path()))
    base = TrainConfig(output_path=this_output_path(), train_cache=output_path_of(tokenized, "train"),
                       preset="tiny", wandb_mode="disabled")
    ladder = build_ladder("exp", plan, base_train=base, tokenized=tokenized, validation={}, issue=None)
    multiples = {(r.rung, r.lr_multiple) for r in ladder.fit.config.runs}
    assert {m for _, m in multiples} == {0.5, 1.0, 2.0}
    assert all(m == 1.0 for rung, m in multiples if "-lrx" not in rung)
    assert [r.lr_multiple for r in plan.lr_check] == [0.5, 2.0, 0.5, 2.0]


def test_scheduled_names_the_rungs_first_seed_major_and_changes_no_step() -> None:
    ladder = _ladder()
    scheduled = ladder.scheduled()
    evals = scheduled[: len(ladder.rung_evals)]
    seeds = [int(e.name.rpartition("-s")[2]) for e in evals]
    assert seeds == sorted(seeds) and set(seeds) == {0, 1}  # every rung's seed 0 before any seed 1
    assert [e.name for e in evals if e.name.endswith("-s0")] == [
        e.name for e in ladder.rung_evals if e.name.endswith("-s0")]  # rung order kept within a seed
    assert scheduled[len(evals):] == ladder.steps and ladder.rung_steps == evals
    # the same DAG, node for node, as the ladder's own leaves
    assert {n.hash for n in build_graph(scheduled).nodes} == {n.hash for n in build_graph(ladder.steps).nodes}


def test_the_v2_reference_is_a_stated_multiple_of_marins_and_every_record_names_it() -> None:
    marin = LadderRules(tokens_per_param=2.0, min_batch_tokens=64, seq_len=32, min_width=8, head_dim=4)
    tuned = dataclasses.replace(marin, v2_lr_multiple=128.0)
    plans = [plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=2.7e9, rules=r)
             for r in (marin, tuned)]
    for a, b in zip(plans[0].rungs, plans[1].rungs, strict=True):
        assert b.lr == pytest.approx(128 * a.lr)
        assert b.optimizer["adam_lr"] == pytest.approx(128 * a.optimizer["adam_lr"])
    assert tuned.v2_rule.max_lr == pytest.approx(128 * marin.v2.max_lr) and marin.v2_rule is marin.v2
    assert tuned.v2_reference() == {
        "rule": "DelphiV2Rule", "multiple_of_marin": 128.0, "lr_base": 128 * marin.v2.lr_base,
        "adam_lr_base": 128 * marin.v2.adam_lr_base, "max_lr": 128 * marin.v2.max_lr}
    for f in _ladder().forecasts:
        assert f.prediction.config.ladder["v2_reference"]["multiple_of_marin"] == 1.0
    with pytest.raises(ValueError, match="v2_lr_multiple=0.0 must be > 0"):
        LadderRules(v2_lr_multiple=0.0)
    # an adamw-v1 ladder's facts are what they were (its prediction hashes stay)
    v1 = dataclasses.replace(marin, recipe=RECIPE_V1)
    plan = plan_ladder(BASE, sizes=[1.5e3, 3e3, 6e3], seeds=[0], target=2.7e9, rules=v1)
    assert "v2_reference" not in ladder_facts(plan, plan.target)
