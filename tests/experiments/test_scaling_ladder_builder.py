"""The ladder builder's endpoint rule reaches the prediction step's config and its identity (no training)."""

from __future__ import annotations

import pytest

from experiments.common.scaling_ladder import build_ladder
from marin import Step, identity_hash, output_path_of, this_output_path
from marin.graph.dag import build_graph
from operators.scaling.ladder import plan_ladder
from operators.scaling.rules import LadderRules
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
