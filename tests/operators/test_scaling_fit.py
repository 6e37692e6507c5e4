"""The scaling-law fitter: parameter recovery, published test vectors, interval coverage, refused inputs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from operators.scaling import FitSettings, LadderInputError, compute_optimal, fit_offset, fit_surface
from operators.scaling.bootstrap import IntervalMethod, interval
from operators.scaling.fit import FORM_SURFACE, ScalingFit
from operators.scaling.surface import surface_loss

HOFFMANN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
BESIROGLU = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}

# The research note's simulated truth (scaling-ladder.md §3.2): E = 1, alpha = 0.34, beta = 0.28, loss about
# 2.7 -> 1.6 over the ladder, 20 tokens per parameter, 5 rungs at half-decade compute spacing, target 10x.
NOTE_SURFACE = {"E": 1.0, "A": 19.3, "B": 18.5, "alpha": 0.34, "beta": 0.28}
RUNG_N = 6e3 * 10 ** (0.25 * np.arange(5))
TARGET_N = RUNG_N[-1] * math.sqrt(10.0)


def _note_truth(n: np.ndarray | float) -> np.ndarray:
    return np.asarray(
        surface_loss(NOTE_SURFACE, n, 20 * n)
        if np.ndim(n) == 0
        else [surface_loss(NOTE_SURFACE, v, 20 * v) for v in np.asarray(n)]
    )


def _compute(n: np.ndarray | float) -> np.ndarray:
    return 6.0 * np.asarray(n) * 20.0 * np.asarray(n)


@pytest.mark.parametrize(
    ("params", "compute", "n_opt", "d_opt", "l_opt"),
    [
        (HOFFMANN, 1e21, 1.82e9, 9.14e10, 2.329),
        (HOFFMANN, 1e23, 1.46e10, 1.14e12, 2.005),
        (BESIROGLU, 1e21, 2.78e9, 6.00e10, 2.306),
        (BESIROGLU, 1e23, 2.95e10, 5.66e11, 2.032),
    ],
    ids=["hoffmann-1e21", "hoffmann-1e23", "besiroglu-1e21", "besiroglu-1e23"],
)
def test_compute_optimal_matches_the_closed_form_test_vectors(
    params: dict[str, float], compute: float, n_opt: float, d_opt: float, l_opt: float
) -> None:
    got = compute_optimal(params, compute)
    assert got["N"] == pytest.approx(n_opt, rel=5e-3)
    assert got["D"] == pytest.approx(d_opt, rel=5e-3)
    assert got["L"] == pytest.approx(l_opt, abs=5e-4)
    assert 6 * got["N"] * got["D"] == pytest.approx(compute)


def test_loss_at_chinchillas_own_point() -> None:
    assert surface_loss(HOFFMANN, 70e9, 1.4e12) == pytest.approx(1.937, abs=5e-4)
    assert surface_loss(BESIROGLU, 70e9, 1.4e12) == pytest.approx(1.974, abs=5e-4)


def test_offset_law_recovers_exact_parameters_without_noise() -> None:
    compute = np.repeat(np.logspace(9, 13, 8), 2)
    fit = fit_offset(compute, 1.5 + 40.0 * compute**-0.15, FitSettings(bootstrap=50))
    assert fit.params["E"] == pytest.approx(1.5, rel=1e-6)
    assert fit.params["A"] == pytest.approx(40.0, rel=1e-5)
    assert fit.params["alpha"] == pytest.approx(0.15, rel=1e-6)


def test_offset_law_recovers_parameters_from_noisy_seeds() -> None:
    rng = np.random.default_rng(0)
    compute = np.repeat(np.logspace(9, 13, 8), 3)
    truth = 1.5 + 40.0 * compute**-0.15
    fit = fit_offset(
        compute, truth * np.exp(0.002 * rng.standard_normal(compute.size)), FitSettings(bootstrap=300)
    )
    assert fit.params["E"] == pytest.approx(1.5, rel=0.05)
    assert fit.params["alpha"] == pytest.approx(0.15, rel=0.1)
    assert fit.sigma == pytest.approx(0.002, rel=0.35)
    assert fit.sigma_source == "pooled seed spread"
    point, low, high = fit.predict(1e14)
    true_target = 1.5 + 40.0 * 1e14**-0.15
    assert low <= true_target <= high
    assert abs(point / true_target - 1) < 0.01


def test_two_variable_surface_recovers_besiroglus_parameters() -> None:
    n, d = (g.ravel() for g in np.meshgrid(np.logspace(7, 9, 5), np.logspace(9, 11, 4)))
    loss = [surface_loss(BESIROGLU, a, b) for a, b in zip(n, d, strict=True)]
    fit = fit_surface(n, d, loss, FitSettings(form=FORM_SURFACE, bootstrap=20))
    for key, value in BESIROGLU.items():
        assert fit.params[key] == pytest.approx(value, rel=1e-4), key
    point, _, _ = fit.predict(1e21)  # at the compute-optimal allocation
    assert point == pytest.approx(2.306, abs=5e-4)


def test_intervals_cover_the_truth_in_85_to_95_percent_of_a_fixed_set_of_replicates() -> None:
    rng = np.random.default_rng(20261201)
    compute = np.repeat(_compute(RUNG_N), 3)
    truth_rungs = np.repeat(_note_truth(RUNG_N), 3)
    target_c, target_true = float(_compute(TARGET_N)), float(_note_truth(TARGET_N))
    mean_hits, run_hits, errors = [], [], []
    for replicate in range(100):
        loss = truth_rungs * np.exp(0.005 * rng.standard_normal(compute.size))
        fit = fit_offset(compute, loss, FitSettings(bootstrap=200, rng_seed=replicate), leave_one_out=False)
        point, low, high = fit.predict(target_c)
        mean_hits.append(low <= target_true <= high)
        one_run = target_true * math.exp(0.005 * rng.standard_normal())
        _, low1, high1 = fit.predict(target_c, single_run=True)
        run_hits.append(low1 <= one_run <= high1)
        errors.append(abs(point / target_true - 1))
    assert 0.85 <= np.mean(mean_hits) <= 0.95
    assert 0.85 <= np.mean(run_hits) <= 0.95
    assert np.median(errors) < 0.015  # the research note's simulation: about 1% at 10x extrapolation


def test_bootstrap_t_state_round_trips_and_a_fit_without_boot_sigma_is_refused() -> None:
    rng = np.random.default_rng(3)
    compute = np.repeat(_compute(RUNG_N), 3)
    loss = np.repeat(_note_truth(RUNG_N), 3) * np.exp(0.005 * rng.standard_normal(compute.size))
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100), leave_one_out=False)
    target_c = float(_compute(TARGET_N))
    assert fit.boot_sigma is not None and fit.boot_sigma.shape == (100,)
    assert fit.to_json()["interval"].startswith("parametric bootstrap-t")
    again = ScalingFit.from_json(fit.to_json(full=True))
    assert again.predict(target_c) == pytest.approx(fit.predict(target_c))
    assert again.predict(target_c, single_run=True) == pytest.approx(fit.predict(target_c, single_run=True))
    state = fit.to_json(full=True)
    del state["state"]["boot_sigma"]  # a fit written before 2026-12-02 (the percentile interval)
    with pytest.raises(ValueError, match="no 'boot_sigma'.*re-run the fit step"):
        ScalingFit.from_json(state)
    # the one-run interval is wider than the interval of the mean over seeds, on both sides
    _, low1, high1 = fit.predict(target_c, single_run=True)
    _, low0, high0 = fit.predict(target_c)
    assert low1 < low0 < fit.point(target_c) < high0 < high1


def test_fixed_e_is_used_and_recorded() -> None:
    compute = np.repeat(_compute(RUNG_N), 2)
    loss = np.repeat(_note_truth(RUNG_N), 2)
    fit = fit_offset(compute, loss, FitSettings(fixed_e=1.0, bootstrap=50))
    assert fit.params["E"] == 1.0
    record = fit.to_json()
    assert record["fixed_e"] is True and record["settings"]["fixed_e"] == 1.0


def test_leave_one_rung_out_refits_without_each_budget() -> None:
    rng = np.random.default_rng(1)
    compute = np.repeat(_compute(RUNG_N), 3)
    loss = np.repeat(_note_truth(RUNG_N), 3) * np.exp(0.005 * rng.standard_normal(compute.size))
    fit = fit_offset(compute, loss, FitSettings(bootstrap=50))
    loo = fit.loo(float(_compute(TARGET_N)))
    assert [row["left_out"] for row in loo] == pytest.approx(list(_compute(RUNG_N)))
    point = fit.point(float(_compute(TARGET_N)))
    assert all(abs(row["prediction"] / point - 1) < 0.05 for row in loo)


def test_fewer_than_three_budgets_are_refused() -> None:
    with pytest.raises(
        LadderInputError, match=r"only 2 distinct budgets \(1e\+10 \(3 runs\), 1e\+11 \(3 runs\)\)"
    ):
        fit_offset([1e10] * 3 + [1e11] * 3, [3.0] * 3 + [2.5] * 3, FitSettings())


def test_non_finite_losses_are_reported_not_fitted() -> None:
    with pytest.raises(LadderInputError, match=r"loss has non-finite values at \[2\]=nan"):
        fit_offset([1e10, 1e11, 1e12], [3.0, 2.5, float("nan")], FitSettings())


def test_non_decreasing_losses_are_reported_not_fitted() -> None:
    with pytest.raises(
        LadderInputError, match=r"budget 1e\+12 has mean loss 2.6, not below 2.5 at the smaller budget 1e\+11"
    ):
        fit_offset([1e10, 1e11, 1e12, 1e13], [3.0, 2.5, 2.6, 2.0], FitSettings())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compute": [1e10, 1e11], "loss": [3.0, 2.5, 2.0]}, "compute has 2 values but loss has 3"),
        ({"compute": [1e10, -1.0, 1e12], "loss": [3.0, 2.5, 2.0]}, "compute must be positive"),
        (
            {"compute": [1e10, 1e11, 1e12], "loss": [3.0, 2.5, 2.0], "fixed_e": 2.0},
            "fixed_e=2.0 is not below",
        ),
        ({"compute": [1e10, 1e11, 1e12], "loss": []}, "loss is empty"),
    ],
    ids=["lengths", "negative-compute", "fixed-e-too-high", "empty"],
)
def test_bad_inputs_name_the_problem(kwargs: dict[str, Any], message: str) -> None:
    settings = FitSettings(fixed_e=kwargs.get("fixed_e"))
    with pytest.raises(LadderInputError, match=message):
        fit_offset(kwargs["compute"], kwargs["loss"], settings)


def test_each_fitter_refuses_the_other_forms_settings() -> None:
    with pytest.raises(LadderInputError, match="use operators.scaling.surface.fit_surface"):
        fit_offset([1e10, 1e11, 1e12], [3.0, 2.5, 2.0], FitSettings(form=FORM_SURFACE))
    with pytest.raises(LadderInputError, match="pass FitSettings\\(form='two_variable'"):
        fit_surface([1e7] * 5, [1e9] * 5, [3.0] * 5, FitSettings())


def test_interval_methods_keep_their_record_text_and_need_their_inputs() -> None:
    assert IntervalMethod.BOOTSTRAP_T.value.startswith("parametric bootstrap-t (pivot studentized by each")
    assert IntervalMethod.BOOTSTRAP_T_SIGMA.value == (
        "parametric bootstrap-t (studentized by each replicate's sigma)"
    )
    draws = np.linspace(1.9, 2.1, 101)
    # with no spread to studentize by (sigma 0), the percentile interval of the draws
    no_spread = interval(
        2.0, draws, 0.9, 0.0, False, IntervalMethod.BOOTSTRAP_T_SIGMA, boot_sigma=np.zeros(101)
    )
    assert no_spread == pytest.approx((2.0, *np.quantile(draws, [0.05, 0.95])))
    one_run = interval(
        2.0, draws, 0.9, 0.0, True, IntervalMethod.BOOTSTRAP_T_SIGMA, boot_sigma=np.zeros(101)
    )
    assert one_run == no_spread  # a new run adds no noise when the seeds have no spread
    with pytest.raises(ValueError, match="needs boot_sigma"):
        interval(2.0, draws, 0.9, 0.01, False, IntervalMethod.BOOTSTRAP_T_SIGMA)
    with pytest.raises(ValueError, match="needs boot_se and point_se"):
        interval(2.0, draws, 0.9, 0.01, False, IntervalMethod.BOOTSTRAP_T, boot_sigma=np.full(101, 0.01))
