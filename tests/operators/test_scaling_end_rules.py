"""The endpoint's guards and rules on hand-written curves: the late-drop gate and the pre-decay anchor."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openlab_records import (
    PREDICTION_FILE,
    Prediction,
    Verdict,
    read_sealed,
)
from operators.scaling.fitstep import FitConfig, RungRun, fit_ladder
from operators.scaling.inputs import LadderInputError
from operators.scaling.prediction import predict_target
from operators.scaling.verdict import VerdictConfig, score_prediction
from tests.fakes.scaling_ladder import curve as _curve
from tests.fakes.scaling_ladder import prediction_config as _prediction_config
from tests.fakes.scaling_ladder import target as _target


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
