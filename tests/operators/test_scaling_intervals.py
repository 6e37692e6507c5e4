"""Honest intervals on the ladders labs run (issue 34): never a crash, never a zero-width interval, a degenerate
sub-fit flagged as such."""

from __future__ import annotations

import math

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
