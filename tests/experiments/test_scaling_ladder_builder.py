"""The ladder builder's endpoint rule reaches the prediction step's config and its identity (no training)."""

from __future__ import annotations

import pytest

from experiments.common.scaling_ladder import build_ladder
from marin import Step, output_path_of, this_output_path
from marin.graph.dag import build_graph
from operators.scaling.ladder import plan_ladder
from operators.scaling.rules import LadderRules
from operators.tokenize import TokenizeConfig, tokenize
from operators.train import TrainConfig

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
