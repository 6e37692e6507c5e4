"""Honest intervals on the ladders labs run (issue 34): never a crash, never a zero-width interval, a
degenerate sub-fit flagged as such."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from operators.scaling import FitSettings, fit_offset
from operators.scaling.gates import fit_gates

# Four rungs, one run each, whose three-rung sub-fit puts E on its bound (0): before issue 34 its interval
# overflowed (the pivot divided by a local standard error of nearly 0) and fit_gates crashed in
# _backtest_top_rung, so the fit step would have crashed on this ladder.
DEGENERATE_LADDERS = {
    "sub-fit-E-at-0": ([1e15, 1e16, 1e17, 1e18], [3.0, 2.9, 2.1, 2.0]),
    "sub-fit-E-at-0-b": ([1e15, 1e16, 1e17, 1e18], [3.2, 3.0, 2.4, 2.3]),
    "sub-fit-E-at-min-loss": ([1e15, 1e16, 1e17, 1e18], [3.0, 2.5, 2.49, 2.3]),
}


@pytest.mark.parametrize("name", sorted(DEGENERATE_LADDERS), ids=sorted(DEGENERATE_LADDERS))
def test_fit_gates_never_crash_and_flag_a_degenerate_sub_fit(name: str) -> None:
    compute, loss = (np.asarray(v) for v in DEGENERATE_LADDERS[name])
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100))
    gates = fit_gates(fit, compute, loss)
    back = gates["backtest_top_rung"]
    assert back["ran"] is True
    assert back["flag"] is True  # a degenerate sub-fit, or a miss: either way the gate fires
    if back.get("degenerate"):
        assert back["degenerate"] and isinstance(back["reason"], str) and back["reason"]
    for single in (False, True):
        point, low, high = fit.predict(1e19, single_run=single)
        assert all(math.isfinite(v) and v > 0 for v in (point, low, high))
        assert low < point < high


def test_a_three_rung_sub_fit_with_e_on_its_bound_predicts_finite_positive_bounds() -> None:
    sub = fit_offset([1e15, 1e16, 1e17], [3.0, 2.9, 2.1], FitSettings(bootstrap=100), leave_one_out=False)
    for single in (False, True):
        point, low, high = sub.predict(1e18, single_run=single)
        assert 0 < low < point < high < math.inf


def test_a_degenerate_sub_fit_is_a_flagged_gate_in_words() -> None:
    from operators.scaling.gates import ladder_gates

    compute, loss = (np.asarray(v) for v in DEGENERATE_LADDERS["sub-fit-E-at-0"])
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100))
    gates = fit_gates(fit, compute, loss)
    assert gates["backtest_top_rung"]["degenerate"] is True
    assert "lower bound 0" in gates["backtest_top_rung"]["reason"]
    point = {"label": "100%", "gates": gates, "loo_spread_rel": None}
    flagged = [g for g in ladder_gates([point], None, 0.05) if g.flag]
    assert [g.name for g in flagged] == ["backtest_top_rung"]
    assert "degenerate" in flagged[0].message and "lower bound 0" in flagged[0].message


def test_three_budgets_of_one_run_get_the_prior_sigma_never_a_zero_width_interval() -> None:
    # a law through three points fits them exactly: the residuals are 0 and carry no degrees of freedom
    compute = np.array([1e15, 1e16, 1e17])
    loss = 1.5 + 30.0 * compute**-0.1
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100), leave_one_out=False)
    record = fit.to_json()
    assert record["sigma_dof"] == 0 and record["sigma_estimate"] is None
    assert record["sigma_log"] == pytest.approx(0.005)
    assert record["sigma_prior"] == {"sigma": 0.005, "dof": 2.0}
    assert record["interval_rules"] == "issue-34/3"
    for single in (False, True):
        point, low, high = fit.predict(1e18, single_run=single)
        assert (high - low) / point > 0.01  # a decade past the top of three exact points


def test_the_residual_scale_is_robust_to_one_outlying_run() -> None:
    rng = np.random.default_rng(5)
    compute = np.geomspace(1e15, 1e18, 8)
    loss = (1.5 + 3000.0 * compute**-0.2) * np.exp(0.003 * rng.standard_normal(8))
    clean = fit_offset(compute, loss, FitSettings(bootstrap=50), leave_one_out=False)
    loss[2] *= 0.96  # one run 4% off the law
    dirty = fit_offset(compute, loss, FitSettings(bootstrap=50), leave_one_out=False)
    rms = math.sqrt(float(np.sum(dirty.residuals() ** 2)) / (8 - 3))
    assert dirty.sigma < 0.4 * rms  # the plain RMS is dominated by the one outlier
    assert dirty.sigma < 2.5 * clean.sigma


def test_one_duplicated_pair_does_not_set_the_noise_model() -> None:
    from operators.scaling import FORM_SURFACE, fit_surface

    rng = np.random.default_rng(2)
    n = np.array([1e6, 2e6, 4e6, 1e6, 2e6, 4e6, 8e6, 8e6, 1.6e7, 1.6e7])
    d = np.array([2e7, 2e7, 2e7, 8e7, 8e7, 8e7, 1.6e8, 3.2e8, 3.2e8, 3.2e8])
    loss = (1.8 + 400 / n**0.34 + 400 / d**0.28) * np.exp(0.01 * rng.standard_normal(n.size))
    loss[-1] = loss[-2] * (1 + 7e-5)  # one duplicated (N, D) pair that happens to agree to 7e-5
    fit = fit_surface(n, d, loss, FitSettings(form=FORM_SURFACE, bootstrap=30))
    assert fit.sigma_source.startswith("robust scale")
    assert fit.sigma > 1e-3


def test_the_model_error_term_is_measured_on_the_ladder_and_recorded_apart_from_the_noise() -> None:
    from operators.scaling.fit import ScalingFit

    rng = np.random.default_rng(11)
    compute = np.repeat(np.geomspace(1e15, 1e18, 6), 3)  # six budgets of three seeds: the seeds pin sigma
    # a law that bends away from the offset power law past 1e16 (its power term decays ever more slowly)
    bent = 1.5 + 3000.0 * compute**-0.2 * np.maximum(compute / 1e16, 1.0) ** 0.05
    loss = bent * np.exp(0.002 * rng.standard_normal(compute.size))
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100))
    record = fit.to_json(full=True)
    me = record["model_error"]
    assert record["sigma_source"] == "pooled seed spread" and record["sigma_log"] < 0.004
    assert len(me["backtests"]) == 3 + 2 + 1  # origins at 3, 4 and 5 budgets, each predicting the rest
    assert me["estimate"] > 0.01 and me["tau_per_decade"] > 0.01
    assert me["prior"] == {"tau_per_decade": 0.0025, "weight": 2.0}
    assert record["sigma_log"] != me["tau_per_decade"]  # noise and model error are recorded apart
    target = 1e19
    # distances count from the ladder's centre, the geometric mean of its budgets (10^16.5)
    assert me["c_from"] == pytest.approx(10**16.5)
    assert fit.model_error_sd(target) == pytest.approx(2.5 * me["tau_per_decade"], rel=1e-9)
    assert fit.model_error_sd(1e16) == 0.0  # below the centre
    # both intervals are wider than the noise alone makes them, and the state round-trips
    again = ScalingFit.from_json(record)
    assert again.predict(target) == pytest.approx(fit.predict(target))
    bare = ScalingFit.from_json({k: v for k, v in record.items() if k != "model_error"})
    for single in (False, True):
        _, low, high = fit.predict(target, single_run=single)
        _, low0, high0 = bare.predict(target, single_run=single)
        assert low < low0 and high > high0


def test_the_model_error_prior_can_be_swapped_without_refitting() -> None:
    from operators.scaling.model_error import TAU_PRIOR, TAU_PRIOR_WEIGHT

    rng = np.random.default_rng(11)
    compute = np.repeat(np.geomspace(1e15, 1e18, 6), 3)
    loss = (1.5 + 3000.0 * compute**-0.2) * np.exp(0.002 * rng.standard_normal(compute.size))
    me = fit_offset(compute, loss, FitSettings(bootstrap=50)).model_error
    assert me is not None and me.estimate is not None
    # six backtests (origins at 3, 4 and 5 budgets), shrunk to the prior with the prior's weight
    assert len(me.backtests) == 6 and me.to_json()["prior"]["tau_per_decade"] == TAU_PRIOR
    w, est = TAU_PRIOR_WEIGHT, me.estimate
    assert me.tau == pytest.approx(math.sqrt((w * TAU_PRIOR**2 + 6 * est**2) / (w + 6)), rel=1e-12)
    other = me.with_prior(0.02)  # the real-data calibration compares priors this way
    assert other.prior == 0.02 and other.backtests == me.backtests and other.estimate == est
    assert other.tau == pytest.approx(math.sqrt((w * 0.02**2 + 6 * est**2) / (w + 6)), rel=1e-12)
    assert other.to_json()["prior"]["tau_per_decade"] == 0.02
    assert me.with_prior(TAU_PRIOR).tau == pytest.approx(me.tau, rel=1e-12)
    # a ladder too short for any backtest gets the prior itself, never 0
    three = fit_offset([1e15, 1e16, 1e17], [3.0, 2.5, 2.2], FitSettings(bootstrap=50)).model_error
    assert three is not None and three.estimate is None and three.tau == TAU_PRIOR
    assert three.with_prior(0.01).tau == 0.01


def test_a_fit_record_without_the_new_fields_reads_as_the_old_interval_rules() -> None:
    from operators.scaling.fit import ScalingFit

    compute = np.geomspace(1e15, 1e18, 5)
    fit = fit_offset(compute, 1.5 + 3000.0 * compute**-0.2, FitSettings(bootstrap=50))
    record = fit.to_json(full=True)
    old = {
        k: v
        for k, v in record.items()
        if k not in ("model_error", "interval_rules", "sigma_dof", "sigma_estimate", "sigma_prior")
    }
    again = ScalingFit.from_json(old)
    assert again.rules == "before-issue-34" and again.model_error is None and again.noise is None
    assert again.to_json()["interval_rules"] == "before-issue-34"


def test_a_synthetic_isoflop_sweep_is_refused_by_fit_offset_with_a_pointer_to_fit_surface() -> None:
    from operators.scaling.inputs import LadderInputError

    budgets = np.geomspace(1e15, 1e18, 6)
    c, loss, sizes = [], [], []
    for budget in budgets:  # five model sizes per budget, from a quarter to four times the optimum
        for ratio in (0.25, 0.5, 1.0, 2.0, 4.0):
            n = math.sqrt(budget / 120.0) * ratio
            c.append(budget)
            sizes.append(n)
            loss.append(1.0 + 19.3 / n**0.34 + 18.5 / (budget / (6 * n)) ** 0.28)
    # this surface is flat near the optimum (under 7% across each budget, like seeds): only N tells
    with pytest.raises(LadderInputError, match=r"IsoFLOP sweep.*fit_surface") as err:
        fit_offset(c, loss, FitSettings(bootstrap=50), n=sizes)
    assert "pooled seed spread" not in str(err.value) and len(str(err.value)) < 1000


def test_seeds_spread_like_the_real_cpu_ladders_are_not_taken_for_a_sweep() -> None:
    compute = np.repeat(np.geomspace(1e15, 1e18, 5), 3)
    loss = np.repeat(1.5 + 3000.0 * np.geomspace(1e15, 1e18, 5) ** -0.2, 3) * np.tile([1.0, 1.035, 0.965], 5)
    fit = fit_offset(compute, loss, FitSettings(bootstrap=50), leave_one_out=False)  # 7.3% within a rung
    assert fit.sigma_source == "pooled seed spread"


def _clean_surface() -> Any:
    from operators.scaling import FORM_SURFACE, fit_surface

    rng = np.random.default_rng(4)
    n = np.repeat(np.geomspace(1e6, 1e8, 6), 4)
    d = n * np.tile([5.0, 10.0, 20.0, 40.0], 6)
    loss = (1.8 + 400 / n**0.34 + 400 / d**0.28) * np.exp(0.003 * rng.standard_normal(n.size))
    return fit_surface(n, d, loss, FitSettings(form=FORM_SURFACE, bootstrap=30))


def test_surface_gates_stay_quiet_on_a_clean_surface_and_fire_on_each_fault() -> None:
    import dataclasses

    from operators.scaling.gates import surface_gates

    fit = _clean_surface()
    assert fit.to_json()["model_error"]["backtests"]  # the surface has its model-error term too
    assert [g.name for g in surface_gates(fit) if g.flag] == []
    theta = fit.theta.copy()
    theta[4] = math.log(float(fit.loss.min()))  # E at the smallest loss: no room for the law's floor
    high_e = dataclasses.replace(fit, theta=theta)
    assert [g.name for g in surface_gates(high_e) if g.flag] == ["e_above_data"]
    theta = fit.theta.copy()
    theta[2] = 1e-3  # alpha on its lower bound: the law no longer falls with N
    flat = dataclasses.replace(fit, theta=theta)
    assert {g.name for g in surface_gates(flat) if g.flag} == {"law_not_decreasing", "exponent_at_bound"}
    boot = fit.boot_theta.copy()
    boot[: len(boot) // 2, 3] = 3.0  # half the replicates put beta on its upper bound
    shaky = dataclasses.replace(fit, boot_theta=boot)
    flagged = [g for g in surface_gates(shaky) if g.flag]
    assert [g.name for g in flagged] == ["bootstrap_at_bounds"] and "50%" in flagged[0].message


def test_without_seeds_the_mean_interval_carries_the_scatter_and_the_model_error_has_its_floor() -> None:
    from operators.scaling.bootstrap import MEAN_NO_SEEDS, MEAN_WITH_SEEDS
    from operators.scaling.fit import ScalingFit
    from operators.scaling.model_error import FLOOR_REASON, TAU_FLOOR_NO_SEEDS

    rng = np.random.default_rng(5)
    budgets = np.geomspace(1e15, 1e18, 6)
    law = 1.5 + 3000.0 * budgets**-0.2  # the law exactly: its backtests see no error beyond the noise
    one = fit_offset(budgets, law * np.exp(0.004 * rng.standard_normal(6)), FitSettings(bootstrap=100))
    record = one.to_json(full=True)
    me = record["model_error"]
    assert record["sigma_source"].startswith("robust scale") and record["mean_interval"] == MEAN_NO_SEEDS
    assert me["floor"] == {"tau_per_decade": TAU_FLOOR_NO_SEEDS, "why": FLOOR_REASON}
    assert me["tau_shrunk"] < TAU_FLOOR_NO_SEEDS  # the backtests alone would have said almost nothing
    assert me["tau_per_decade"] == TAU_FLOOR_NO_SEEDS
    target = 1e19  # 2.5 decades past the ladder's centre
    assert one.model_error_sd(target) == pytest.approx(2.5 * TAU_FLOOR_NO_SEEDS, rel=1e-9)
    # no seeds: the mean's interval is the one-run interval, never narrower
    assert one.predict(target) == one.predict(target, single_run=True)
    again = ScalingFit.from_json(record)
    assert again.predict(target) == pytest.approx(one.predict(target))
    # a fit.json made under issue 34's first rules keeps its own intervals: no floor, the mean's narrower
    first_me = {k: v for k, v in me.items() if k not in ("floor", "tau_shrunk")}
    first_me["tau_per_decade"] = me["tau_shrunk"]
    first = {**record, "interval_rules": "issue-34", "model_error": first_me}
    old = ScalingFit.from_json(first)
    assert old.model_error is not None and old.model_error.floor == 0.0
    _, low_m, high_m = old.predict(target)
    _, low_1, high_1 = old.predict(target, single_run=True)
    assert low_1 < low_m and high_m < high_1
    assert old.to_json()["mean_interval"] == MEAN_WITH_SEEDS
    # with seeds: no floor, and the mean's interval is narrower than one run's
    seeded = np.repeat(budgets, 3)
    loss = (1.5 + 3000.0 * seeded**-0.2) * np.exp(0.004 * rng.standard_normal(seeded.size))
    fit = fit_offset(seeded, loss, FitSettings(bootstrap=100))
    rec = fit.to_json()
    assert rec["sigma_source"] == "pooled seed spread" and rec["mean_interval"] == MEAN_WITH_SEEDS
    assert rec["model_error"]["floor"] == {"tau_per_decade": 0.0}
    assert rec["model_error"]["tau_per_decade"] == rec["model_error"]["tau_shrunk"]
    _, low_m, high_m = fit.predict(target)
    _, low_1, high_1 = fit.predict(target, single_run=True)
    assert low_1 < low_m and high_m < high_1


def test_the_surface_without_seeds_gives_the_mean_the_one_run_interval() -> None:
    from operators.scaling import FORM_SURFACE, fit_surface
    from operators.scaling.bootstrap import MEAN_NO_SEEDS
    from operators.scaling.model_error import TAU_FLOOR_NO_SEEDS

    rng = np.random.default_rng(3)
    n = np.repeat(np.geomspace(1e6, 1e8, 5), 3)
    d = n * np.tile([10.0, 20.0, 40.0], 5)
    loss = (1.8 + 400 / n**0.34 + 400 / d**0.28) * np.exp(0.01 * rng.standard_normal(n.size))
    fit = fit_surface(n, d, loss, FitSettings(form=FORM_SURFACE, bootstrap=30))
    record = fit.to_json()
    assert record["mean_interval"] == MEAN_NO_SEEDS
    assert record["model_error"]["floor"]["tau_per_decade"] == TAU_FLOOR_NO_SEEDS
    assert record["model_error"]["tau_per_decade"] >= TAU_FLOOR_NO_SEEDS
    assert fit.predict(n=1e9, d=2e10) == fit.predict(n=1e9, d=2e10, single_run=True)
