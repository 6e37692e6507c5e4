"""The forecast's records on hand-written curves: the sealed prediction and its tampering, the target's
guards, the verdict, the target's learning-rate check note, and what a record states (gates, a fixed E,
the recipe and compute share, its interval rules)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from marin.tracking.predictions import note_body
from moe_trainer.jsonio import write_json_atomic
from openlab_records import (
    POSTED_FILE,
    PREDICTION_FILE,
    Note,
    Prediction,
    RecordTamperedError,
    read_json,
    read_sealed,
    record_hash,
    seal,
    write_sealed,
)
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fitstep import FitConfig, RungRun, fit_ladder
from operators.scaling.lrcheck import TargetLrCheckConfig, check_target_lr
from operators.scaling.prediction import predict_target
from operators.scaling.target import TargetTrainConfig, train_target
from operators.scaling.verdict import VerdictConfig, score_prediction
from operators.train import TrainConfig
from tests.fakes.scaling_ladder import curve as _curve
from tests.fakes.scaling_ladder import law as _law
from tests.fakes.scaling_ladder import prediction_config as _prediction_config
from tests.fakes.scaling_ladder import target as _target


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


def test_seal_hashes_the_canonical_json_without_the_hash() -> None:
    sealed = seal({"b": 1, "a": [1.5, "x"]})
    assert sealed["record_sha256"] == record_hash({"a": [1.5, "x"], "b": 1})
    import hashlib

    assert sealed["record_sha256"] == hashlib.sha256(b'{"a":[1.5,"x"],"b":1}').hexdigest()


def test_write_record_round_trips(tmp_path: Path) -> None:
    written = write_sealed(str(tmp_path / "r.json"), {"x": 1})
    assert read_sealed(str(tmp_path / "r.json")) == written


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
    assert record["interval_rules"] == typed.interval_rules == "issue-34/3" and typed.rules_line() is None
    assert record["gates_flagged"] == list(typed.gates_flagged)
    assert typed.flagged == bool(record["warnings"]) == bool(record["gates_flagged"])
    end = record["points"][-1]
    # the target is past the ladder
    assert end["interval_rules"] == "issue-34/3" and end["model_error_log"] > 0
    fit = read_json(str(tmp_path / "fit" / "fit.json"))["fractions"][-1]["fit"]
    assert fit["model_error"]["tau_per_decade"] > 0 and fit["sigma_prior"] == {"sigma": 0.005, "dof": 2.0}
