"""The ladder's rules, plan, fit step, records and the forecast's guards (no training: hand-written files)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marin.tracking.predictions import note_body
from moe_trainer.hparams import DelphiV2Rule
from moe_trainer.jsonio import write_json_atomic
from openlab_records import (
    POSTED_FILE,
    PREDICTION_FILE,
    Note,
    Prediction,
    RecordTamperedError,
    Verdict,
    read_json,
    read_sealed,
    record_hash,
    seal,
    write_sealed,
)
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fitstep import FIT_FILE, FitConfig, RungRun, fit_ladder, load_runs
from operators.scaling.inputs import LadderInputError
from operators.scaling.ladder import plan_ladder
from operators.scaling.lrcheck import TargetLrCheckConfig, check_target_lr
from operators.scaling.prediction import TargetSpec, predict_target
from operators.scaling.rules import (
    RECIPE_V1,
    RECIPE_V2,
    LadderRules,
    layers_for,
    rung_for_compute,
    rung_for_params,
    trainer_overrides,
)
from operators.scaling.target import TargetTrainConfig, train_target
from operators.scaling.verdict import VerdictConfig, score_prediction
from operators.train import TrainConfig

DENSE = {"vocab_size": 257, "n_experts": 0}


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


def _curve(path: Path, n: int, values: list[float], tokens_per_step: int = 1000, steps: int = 100) -> str:
    points = [
        {
            "step": int(f * steps),
            "fraction": f,
            "tokens": int(f * steps) * tokens_per_step,
            "compute_6nd": 6.0 * n * int(f * steps) * tokens_per_step,
            "compute_trainer": 9.0 * n * int(f * steps) * tokens_per_step,
            "value": v,
        }
        for f, v in zip((0.25, 0.5, 0.75, 1.0), values, strict=True)
    ]
    write_json_atomic(str(path / CURVE_FILE), {"metric": "micro.bpb", "points": points, "n_params": n})
    return str(path)


def _law(c: float) -> float:
    return 1.0 + 40.0 * c**-0.15


@pytest.fixture
def ladder_runs(tmp_path: Path) -> list[RungRun]:
    rng = np.random.default_rng(3)
    runs = []
    for n in (2e3, 5e3, 1.2e4, 3e4, 7e4):
        for seed in (0, 1, 2):
            tokens = 20 * n
            values = [
                _law(6 * n * tokens * f) * math.exp(0.004 * rng.standard_normal())
                for f in (0.25, 0.5, 0.75, 1)
            ]
            out = tmp_path / f"eval-{int(n)}-{seed}"
            runs.append(
                RungRun(rung=f"n{int(n)}", seed=seed, curve=_curve(out, int(n), values, int(tokens / 100)))
            )
    return runs


def test_fit_step_refuses_to_predict_naming_the_missing_rungs(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    runs = (*ladder_runs, RungRun(rung="n90000", seed=1, curve=str(tmp_path / "never-ran")))
    with pytest.raises(
        LadderInputError, match=r"refuses to predict: missing rungs: n90000 seed 1 \(no .*never-ran"
    ):
        fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=runs, bootstrap=50))
    assert not (tmp_path / "fit" / FIT_FILE).exists()


def test_fit_step_reports_diverged_rungs(tmp_path: Path, ladder_runs: list[RungRun]) -> None:
    bad = RungRun(rung="n5", seed=0, curve=_curve(tmp_path / "nan", 5, [3.0, 2.9, float("nan"), 2.8]))
    with pytest.raises(
        LadderInputError, match=r"diverged rungs: n5 seed 0 \(non-finite micro.bpb at steps \[75\]\)"
    ):
        fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=(*ladder_runs, bad), bootstrap=50))


def test_fit_step_refuses_fewer_than_three_budgets(tmp_path: Path, ladder_runs: list[RungRun]) -> None:
    two = tuple(r for r in ladder_runs if r.rung in ("n2000", "n5000"))
    with pytest.raises(LadderInputError, match="only 2 distinct budgets"):
        fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=two, bootstrap=50))


def test_fit_step_records_each_runs_step_hash_where_the_train_step_left_one(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    (tmp_path / "t-ok/.marin").mkdir(parents=True)
    (tmp_path / "t-ok/.marin/step.json").write_text(json.dumps({"hash": "ab" * 32}))
    (tmp_path / "t-cut/.marin").mkdir(parents=True)
    (tmp_path / "t-cut/.marin/step.json").write_text('{"hash": "ab')  # cut short: not JSON
    trains = ["t-ok", "t-cut", "t-never-ran", ""]
    runs = [
        dataclasses.replace(r, train=str(tmp_path / t) if t else "")
        for r, t in zip(ladder_runs[:4], trains, strict=True)
    ]
    assert [i["step_hash"] for i in load_runs(tuple(runs))] == ["ab" * 32, None, None, None]


def _target() -> TargetSpec:
    n = 2.5e5
    return TargetSpec(
        name="big",
        config_hash="c" * 64,
        n_params=int(n),
        tokens_per_step=int(20 * n / 100),
        num_steps=100,
        flops_per_token=9.0 * n,
        eval_steps=(25, 50, 75, 100),
    )


def test_prediction_record_is_sealed_and_tampering_is_detected(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=100))
    predict_target(_prediction_config(tmp_path))
    path = tmp_path / "prediction" / PREDICTION_FILE
    record = read_sealed(str(path))
    assert record["target"]["config_hash"] == "c" * 64 and len(record["points"]) == 4
    end = record["points"][-1]
    truth = _law(6 * 2.5e5 * 20 * 2.5e5)
    assert end["low"] <= truth <= end["high"] and abs(end["point"] / truth - 1) < 0.02
    assert len(record["inputs"]) == 15 and all(r["curve_sha256"] for r in record["inputs"])
    edited = json.loads(path.read_text())
    edited["points"][-1]["point"] = truth  # "improving" the forecast after the fact
    path.write_text(json.dumps(edited))
    with pytest.raises(RecordTamperedError, match="was edited after it was written"):
        read_sealed(str(path))
    with pytest.raises(RecordTamperedError):
        score_prediction(
            VerdictConfig(
                output_path=str(tmp_path / "verdict"),
                prediction=str(tmp_path / "prediction"),
                target_curve=str(tmp_path / "nowhere"),
            )
        )


def _prediction_config(tmp_path: Path):  # type: ignore[no-untyped-def]
    from operators.scaling.prediction import PredictionConfig

    return PredictionConfig(
        output_path=str(tmp_path / "prediction"),
        fit=str(tmp_path / "fit"),
        target=_target(),
        experiment="test",
        issue="local/experiments#15",
    )


def test_target_refuses_config_drift_and_waits_for_the_post(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    predict_target(_prediction_config(tmp_path))
    train = TrainConfig(output_path=str(tmp_path / "target"), train_cache=str(tmp_path / "no-cache"))
    with pytest.raises(ValueError, match="the config changed after the forecast"):
        train_target(
            TargetTrainConfig(
                train=train, prediction=str(tmp_path / "prediction"), target_config_hash="d" * 64
            )
        )
    with pytest.raises(TimeoutError, match="was not posted to its issue within 1 s"):
        train_target(
            TargetTrainConfig(
                train=train,
                prediction=str(tmp_path / "prediction"),
                target_config_hash="c" * 64,
                post_timeout_s=1.0,
            )
        )
    assert not (tmp_path / "target" / "metrics.jsonl").exists()  # nothing trained


def test_verdict_scores_each_point_against_the_interval(tmp_path: Path, ladder_runs: list[RungRun]) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=100))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    actual = [p["point"] * 1.001 for p in record["points"][:3]] + [record["points"][-1]["high"] * 1.05]
    t = _target()
    _curve(tmp_path / "target-eval", t.n_params, actual, t.tokens_per_step)
    verdict = score_prediction(
        VerdictConfig(
            output_path=str(tmp_path / "verdict"),
            prediction=str(tmp_path / "prediction"),
            target_curve=str(tmp_path / "target-eval"),
        )
    )
    assert verdict["prediction_sha256"] == record["record_sha256"]
    assert [p["inside"] for p in verdict["points"]] == [True, True, True, False]
    assert verdict["points"][0]["error_pct"] == pytest.approx(100 * (1 / 1.001 - 1))
    assert verdict["hits"] == 3 and read_sealed(str(tmp_path / "verdict" / "verdict.json")) == verdict
    assert not (tmp_path / "prediction" / POSTED_FILE).exists()


def test_the_targets_learning_rate_check_says_whether_the_rule_held(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    t = _target()
    rule = _curve(tmp_path / "target-eval", t.n_params, [3.0, 2.6, 2.3, 2.000], t.tokens_per_step)
    half = _curve(tmp_path / "half", t.n_params, [3.1, 2.6, 2.2, 1.982], t.tokens_per_step)
    double = _curve(tmp_path / "double", t.n_params, [2.9, 2.7, 2.4, 2.040], t.tokens_per_step)
    diverged = _curve(tmp_path / "diverged", t.n_params, [2.9, 2.7, 2.4, math.nan], t.tokens_per_step)

    def check(runs: tuple[tuple[float, str], ...], out: str, target: str = rule) -> dict[str, Any]:
        return check_target_lr(
            TargetLrCheckConfig(
                output_path=str(tmp_path / out),
                prediction=str(tmp_path / "prediction"),
                target_curve=target,
                runs=runs,
            )
        )

    note = check(((0.5, half), (2.0, double)), "c1")
    assert note["prediction_sha256"] == record["record_sha256"]
    assert note["values"] == {"0.5": 1.982, "1": 2.0, "2": 2.04}
    assert note["best_multiple"] == 0.5 and note["rule_gap"] == pytest.approx(2.0 / 1.982 - 1)
    assert note["held"] is False and "MISTUNED" in note["text"] and "0.91% above" in note["text"]
    assert read_sealed(str(tmp_path / "c1" / "note.json")) == note
    body = note_body(Note.from_json(note))
    assert body.startswith(f"<!-- marin-note:{note['record_sha256']} -->") and note["text"] in body
    assert record["record_sha256"] in body
    held = check(((2.0, double), (4.0, diverged)), "c2")  # a diverged run is listed, never the best
    assert held["values"] == {"1": 2.0, "2": 2.04, "4": None}
    assert held["best_multiple"] == 1.0 and held["rule_gap"] == 0.0 and held["held"] is True
    assert "x4 diverged" in held["text"] and "the rule held" in held["text"]
    lost = check(((0.5, half),), "c3", target=diverged)  # the rule's own run diverged: it did not hold
    assert lost["rule_gap"] is None and lost["held"] is False and "did not hold" in lost["text"]
    (tmp_path / "no-end").mkdir()
    write_json_atomic(str(tmp_path / "no-end" / CURVE_FILE), {"points": [{"fraction": 0.5, "value": 2.0}]})
    with pytest.raises(ValueError, match="no-end/curve.json has no evaluation at the end of its run"):
        check(((0.5, str(tmp_path / "no-end")),), "c4")


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


def test_seal_hashes_the_canonical_json_without_the_hash() -> None:
    sealed = seal({"b": 1, "a": [1.5, "x"]})
    assert sealed["record_sha256"] == record_hash({"a": [1.5, "x"], "b": 1})
    import hashlib

    assert sealed["record_sha256"] == hashlib.sha256(b'{"a":[1.5,"x"],"b":1}').hexdigest()


def test_write_record_round_trips(tmp_path: Path) -> None:
    written = write_sealed(str(tmp_path / "r.json"), {"x": 1})
    assert read_sealed(str(tmp_path / "r.json")) == written


def test_learning_rate_check_on_several_seeds_compares_means(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    plan = plan_ladder(
        DENSE,
        budgets=[5e9, 5e10, 5e11],
        seeds=[0, 1, 2],
        target=5e12,
        lr_multiples=(0.5, 2.0),
        lr_check_seeds=2,
    )
    assert plan.lr_check_seeds == 2
    with pytest.raises(ValueError, match=r"lr_check_seeds=4 must be between 1 and the number of seeds \(3\)"):
        plan_ladder(DENSE, budgets=[5e9, 5e10, 5e11], seeds=[0, 1, 2], target=5e12, lr_check_seeds=4)
    rule = {r.seed: r for r in ladder_runs if r.rung == "n2000"}
    rule_end = {
        s: json.loads((Path(r.curve) / CURVE_FILE).read_text())["points"][-1]["value"]
        for s, r in rule.items()
    }
    # x0.5 beats the rule by 1% on seed 0 but loses by 3% on seed 1; x2 loses on both.
    factors = {(0.5, 0): 0.99, (0.5, 1): 1.03, (2.0, 0): 1.02, (2.0, 1): 1.02}
    check = tuple(
        RungRun(
            rung=f"n2000-lrx{m:g}",
            seed=s,
            lr_multiple=m,
            curve=_curve(tmp_path / f"lr-{m}-{s}", 2000, [rule_end[s] * f] * 4),
        )
        for (m, s), f in factors.items()
    )
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=(*ladder_runs, *check), bootstrap=50))
    verdict = json.loads((tmp_path / "fit" / FIT_FILE).read_text())["lr_check"]["by_rung"]["n2000"]
    assert verdict["seeds"] == 2 and verdict["held"] and verdict["best_multiple"] == 1.0
    assert verdict["rule_gap"] == 0.0 and verdict["means"]["0.5"] > verdict["rule_mean"]
    assert verdict["mean_se"] > 0
    # The same check on seed 0 alone would have picked x0.5, 1% better than the rule: a failed check.
    one = tuple(r for r in check if r.seed == 0)
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit1"), runs=(*ladder_runs, *one), bootstrap=50))
    single = json.loads((tmp_path / "fit1" / FIT_FILE).read_text())["lr_check"]["by_rung"]["n2000"]
    assert not single["held"] and single["best_multiple"] == 0.5
    assert single["rule_gap"] == pytest.approx(1 / 0.99 - 1) and "mean_se" not in single


def test_prediction_records_and_posts_the_gates_that_flagged(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    from marin.tracking.predictions import prediction_body
    from operators.scaling.gates import ladder_warnings

    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    end = record["points"][-1]
    assert end["loo_spread_rel"] == pytest.approx(end["loo_spread"] / end["point"])
    assert end["loo_spread_rel"] < 0.05
    assert record["warnings"] == [] and record["loo_spread_limit"] == 0.05
    assert "Gates (recorded, not enforced): none flagged" in prediction_body(Prediction.from_json(record))
    law = "Law: `L = E + A * C^(-alpha)` in C = 6 * N * D; E fitted"
    assert law in prediction_body(Prediction.from_json(record))
    loose = [*record["points"][:-1], {**end, "loo_spread_rel": 0.2}]
    lr_check = {
        "by_rung": {
            "d24-L3": {"held": False, "rule_gap": 0.003, "seeds": 3, "mean_se": 0.015},
            "d40-L3": {"held": False, "rule_gap": 0.019, "seeds": 1},
        }
    }
    warnings = ladder_warnings(loose, lr_check, 0.05)
    assert warnings == [
        "100%: leaving one rung out moves the prediction over 20.0% of the point (limit 5%): the law is not "
        "pinned down by the rungs",
        "learning-rate check at d24-L3: the rule is 0.3% worse than the best multiple tried (3 seeds; the "
        "rule's mean has a standard error of 1.5%, so a gap under about 2.1% is the seeds' noise)",
        "learning-rate check at d40-L3: the rule is 1.9% worse than the best multiple tried (1 seed)",
    ]
    body = prediction_body(Prediction.from_json({**record, "warnings": warnings}))
    assert "Gates (recorded, not enforced): 100%: leaving one rung out" in body
    assert "Gates: not recorded (an older record)" in prediction_body(
        Prediction.from_json({k: v for k, v in record.items() if k != "warnings"})
    )


def test_prediction_comment_states_a_fixed_e(tmp_path: Path, ladder_runs: list[RungRun]) -> None:
    from marin.tracking.predictions import prediction_body

    runs = tuple(ladder_runs)
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=runs, bootstrap=50, fixed_e=0.5))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    assert record["fitter"]["fixed_e"] == 0.5 and record["fitter"]["fixed_e_assumed"]
    assert "E fixed at 0.5 (an assumption, not fitted)" in prediction_body(Prediction.from_json(record))


def _late_points(prev: float, end: float) -> list[dict[str, Any]]:
    return [
        {"label": "75%", "fraction": 0.75, "point": prev, "gates": {}},
        {"label": "100%", "fraction": 1.0, "point": end, "gates": {}},
    ]


def _late_runs() -> list[dict[str, Any]]:
    # two rungs, two seeds each; the rule's runs fall by 0.20 (small) and 0.30 (big) on average from 75% to
    # the end; a learning-rate check run that fell by 0.9 must not count
    rows = [("small", 3.2, 3.0), ("small", 3.4, 3.2), ("big", 2.8, 2.45), ("big", 2.9, 2.65)]
    runs = [{"rung": r, "lr_multiple": 1.0, "values": {"0.75": a, "1": b}} for r, a, b in rows]
    return [*runs, {"rung": "big-lrx2", "lr_multiple": 2.0, "values": {"0.75": 3.0, "1": 2.1}}]


def test_late_drop_gate_flags_a_forecast_that_falls_more_than_every_rung() -> None:
    from operators.scaling.gates import ladder_warnings, late_drop_gate

    gate = late_drop_gate(_late_points(2.0, 1.65), _late_runs())
    assert gate is not None and gate["flag"] and gate["rung_max"] == "big"
    assert gate["implied"] == pytest.approx(0.35)
    assert gate["rungs"] == pytest.approx({"small": 0.2, "big": 0.3})
    points = _late_points(2.0, 1.65)
    points[-1]["gates"] = {"late_drop": gate}
    assert ladder_warnings(points, None, 0.05) == [
        "100%: the forecast has the target falling by 0.350 from 75% to the end, more than any rung fell "
        "there (at most 0.300, big): the end law extrapolates a late gain no rung showed"
    ]
    calm = late_drop_gate(_late_points(2.0, 1.75), _late_runs())
    assert calm is not None and not calm["flag"]
    assert late_drop_gate(_late_points(2.0, 1.75)[1:], _late_runs()) is None
    # a run without the earlier point is left out; with none left there is nothing to compare
    partial = [*_late_runs(), {"rung": "huge", "lr_multiple": 1.0, "values": {"1": 1.0}}]
    some = late_drop_gate(_late_points(2.0, 1.65), partial)
    assert some is not None and set(some["rungs"]) == {"small", "big"}
    only_ends = [{**r, "values": {"1": r["values"]["1"]}} for r in _late_runs()]
    assert late_drop_gate(_late_points(2.0, 1.65), only_ends) is None


def test_prediction_records_the_late_drop_gate(tmp_path: Path, ladder_runs: list[RungRun]) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    prev, end = record["points"][-2], record["points"][-1]
    late = end["gates"]["late_drop"]
    assert late["from"] == prev["label"] and late["implied"] == pytest.approx(prev["point"] - end["point"])
    assert set(late["rungs"]) == {r.rung for r in ladder_runs}
    smallest = [r for r in record["inputs"] if r["rung"] == "n2000"]
    fall = sum(r["values"]["0.75"] - r["values"]["1"] for r in smallest) / len(smallest)
    assert late["rungs"]["n2000"] == pytest.approx(fall)
    # on one offset power law the fall over the last quarter shrinks as compute grows: nothing to flag
    assert not late["flag"] and late["implied"] < min(late["rungs"].values())
    assert not any("falling by" in w for w in record["warnings"])


def _anchored_config(tmp_path: Path):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(_prediction_config(tmp_path), end_rule="pre_decay_anchor")


def test_pre_decay_anchor_forecasts_the_end_from_the_point_before_it(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    from marin.tracking.predictions import prediction_body, verdict_body

    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=100))
    predict_target(_prediction_config(tmp_path))
    by_law = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    (tmp_path / "prediction" / PREDICTION_FILE).unlink()
    predict_target(_anchored_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    anchor, end = record["points"][-2], record["points"][-1]
    assert anchor == by_law["points"][-2]  # only the endpoint changes
    # the rule by hand: each rung's mean fall over its seeds, then the mean over rungs
    falls: dict[str, list[float]] = {}
    for r in record["inputs"]:
        falls.setdefault(r["rung"], []).append(r["values"]["0.75"] - r["values"]["1"])
    mean_fall = float(np.mean([np.mean(v) for v in falls.values()]))
    every = [f for v in falls.values() for f in v]
    assert end["point"] == pytest.approx(anchor["point"] - mean_fall)
    rule = record["end_rule"]
    assert rule["id"] == "pre_decay_anchor" and rule["anchor"] == "75%" and rule["runs"] == 15
    assert rule["fall_mean"] == pytest.approx(mean_fall) and rule["fall_sd"] == pytest.approx(
        np.std(every, ddof=1)
    )
    half = 1.6448536 * np.std(every, ddof=1) * math.sqrt(1 + 1 / 15)
    assert end["high"] - end["point"] == pytest.approx(math.hypot(anchor["high"] - anchor["point"], half))
    assert end["point"] - end["low"] == pytest.approx(math.hypot(anchor["point"] - anchor["low"], half))
    assert end["low"] < end["low_mean"] < end["point"] < end["high_mean"] < end["high"]
    # the end law's own forecast is kept, identical to the plain record's
    assert end["end_law"]["point"] == by_law["points"][-1]["point"]
    assert end["end_law"]["late_drop"] == by_law["points"][-1]["gates"]["late_drop"]
    assert record["form"]["end_rule"] == "pre_decay_anchor" and by_law["end_rule"] is None
    # leaving a rung out drops it from the anchor's law and from the mean fall
    assert {r["rung"] for r in end["loo"]} == set(falls)
    left = next(r for r in end["loo"] if r["rung"] == "n70000")
    anchor_loo = next(r for r in anchor["loo"] if r["left_out"] == left["left_out"])
    rest = [np.mean(v) for k, v in falls.items() if k != "n70000"]
    assert left["prediction"] == pytest.approx(anchor_loo["prediction"] - np.mean(rest))
    body = prediction_body(Prediction.from_json(record))
    assert "Endpoint rule `pre_decay_anchor`: the law at the target's 75% minus the rungs' mean fall" in body
    assert f"the end law alone says {end['end_law']['point']:.4f}" in body
    # the verdict scores the registered endpoint and, beside it, the end law's
    t = _target()
    actual = [p["point"] for p in record["points"][:3]] + [end["point"] * 1.01]
    _curve(tmp_path / "target-eval", t.n_params, actual, t.tokens_per_step)
    verdict = score_prediction(
        VerdictConfig(
            output_path=str(tmp_path / "verdict"),
            prediction=str(tmp_path / "prediction"),
            target_curve=str(tmp_path / "target-eval"),
        )
    )
    scored = verdict["endpoint"]
    assert scored["error_pct"] == pytest.approx(100 * (1 / 1.01 - 1))
    assert scored["end_law"]["error_pct"] == pytest.approx(100 * (end["end_law"]["point"] / actual[-1] - 1))
    law = end["end_law"]
    assert scored["end_law"]["inside"] == (law["low"] <= actual[-1] <= law["high"])
    assert "The end law alone (not the registered endpoint) said" in verdict_body(Verdict.from_json(verdict))


def test_pre_decay_anchor_refuses_rungs_without_the_anchor_and_unknown_rules(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    from operators.scaling.end_rule import anchored_end
    from operators.scaling.prediction import PredictionConfig

    with pytest.raises(ValueError, match="end_rule='anchored' is not one of law, pre_decay_anchor"):
        PredictionConfig(output_path="x", fit="y", target=_target(), experiment="t", end_rule="anchored")
    points = _late_points(2.0, 1.65)
    for p in points:
        p.update(
            low=p["point"] - 0.1,
            high=p["point"] + 0.1,
            low_mean=p["point"] - 0.05,
            high_mean=p["point"] + 0.05,
            trainer_flops_axis=p["point"],
        )
    only_ends = [{**r, "compute_6nd": 1e12, "values": {"1": r["values"]["1"]}} for r in _late_runs()]
    with pytest.raises(LadderInputError, match="needs the falls from 75% to the end of at least two rungs"):
        anchored_end(points, only_ends, 0.9)
    # one rung with falls is not enough either; the message names the runs that lack a point
    one_rung = [{**r, "compute_6nd": 1e12, "seed": i} for i, r in enumerate(_late_runs())]
    one_rung = [r if r["rung"] != "small" else {**r, "values": {"1": r["values"]["1"]}} for r in one_rung]
    with pytest.raises(LadderInputError, match=r"these lack one: small seed 0, small seed 1\."):
        anchored_end(points, one_rung, 0.9)
    with pytest.raises(ValueError, match="needs an evaluation point before the end"):
        anchored_end(points[1:], _late_runs(), 0.9)
    # with the falls there: 2.0 minus the mean of the rungs' means (0.2 and 0.3); the check run ignored
    runs = [{**r, "compute_6nd": 1e12} for r in _late_runs()]
    got = anchored_end(points, runs, 0.9)
    assert got["point"] == pytest.approx(1.75) and got["rule"]["rung_falls"] == pytest.approx(
        {"small": 0.2, "big": 0.3}
    )


def test_prediction_records_the_recipe_and_the_ladders_compute_share(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    from marin.tracking.predictions import prediction_body

    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    facts = {"recipe": "delphi-v2", "rungs_recipe": ["delphi-v2"], "compute_trainer": 2.0e12,
             "target_compute_trainer": 1.0e14, "compute_share": 0.02, "targets": ["big", "bigger", "biggest"]}
    predict_target(dataclasses.replace(_prediction_config(tmp_path), ladder=facts))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    assert record["ladder"] == facts
    line = ("Recipe: delphi-v2. The ladder's runs cost 2e+12 FLOPs, 2.0% of this target's 1e+14 (one of 3 "
            "targets forecast by this ladder).")
    assert line in record["summary"] and line in prediction_body(Prediction.from_json(record))
    bare_config = dataclasses.replace(_prediction_config(tmp_path), output_path=str(tmp_path / "bare"))
    predict_target(bare_config)  # a ladder that states nothing records nothing
    bare = read_sealed(str(tmp_path / "bare" / PREDICTION_FILE))
    assert "ladder" not in bare and not any(s.startswith("Recipe:") for s in bare["summary"])
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app
    from marin.tracking.predictions import list_predictions

    rows = {r["path"].rsplit("/", 2)[-2]: r for r in list_predictions(str(tmp_path))["predictions"]}
    assert (rows["prediction"]["compute_share"], rows["prediction"]["recipe"]) == (0.02, "delphi-v2")
    assert rows["bare"]["compute_share"] is None
    page = TestClient(create_app(str(tmp_path))).get("/predictions").text  # the dashboard's Predictions page
    assert "<td>2.0% of the target (delphi-v2)</td>" in page


def test_prediction_records_its_interval_rules_model_error_and_the_gates_that_fired(
    tmp_path: Path, ladder_runs: list[RungRun]
) -> None:
    fit_ladder(FitConfig(output_path=str(tmp_path / "fit"), runs=tuple(ladder_runs), bootstrap=50))
    predict_target(_prediction_config(tmp_path))
    record = read_sealed(str(tmp_path / "prediction" / PREDICTION_FILE))
    typed = Prediction.from_json(record)
    assert record["interval_rules"] == typed.interval_rules == "issue-34/2" and typed.rules_line() is None
    assert record["gates_flagged"] == list(typed.gates_flagged)
    assert typed.flagged == bool(record["warnings"]) == bool(record["gates_flagged"])
    end = record["points"][-1]
    # the target is past the ladder
    assert end["interval_rules"] == "issue-34/2" and end["model_error_log"] > 0
    fit = read_json(str(tmp_path / "fit" / "fit.json"))["fractions"][-1]["fit"]
    assert fit["model_error"]["tau_per_decade"] > 0 and fit["sigma_prior"] == {"sigma": 0.005, "dof": 2.0}
