"""The fitters on real published runs (tests/data/scaling/): no crash and no degenerate interval on the
ladders labs run, inputs recognised for what they are. Coverage is a benchmark figure
(benchmarks/scaling_real.py), not asserted here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.scaling import FitSettings, LadderInputError, fit_offset
from operators.scaling.gates import fit_gates
from operators.scaling.inputs import group_by_budget
from operators.scaling.model_error import TAU_FLOOR_NO_SEEDS
from tests.data.scaling import Runs, load


def _frontier(runs: Runs) -> Runs:
    """Each budget's best run: the one-run-per-budget ladder of an IsoFLOP sweep."""
    best = [g[np.argmin(runs.loss[g])] for g in group_by_budget(runs.compute, rel_tol=1e-3)]
    return runs.subset(np.isin(np.arange(runs.loss.size), best))


def _sub_ladders(k: int) -> list[tuple[str, Runs]]:
    """Every k consecutive budgets of Porian et al.'s frontiers and of Gadre et al.'s 20-tokens-per-parameter
    ladders (one run each), the ladders the issue's crash and zero-width intervals came from."""
    out = []
    for name, subset, runs in [("porian", s, r) for s, r in load("porian2024").items()]:
        ladder = _frontier(runs)
        out += [
            (f"{name}-{subset}-{i}", ladder.subset(np.arange(i, i + k)))
            for i in range(ladder.loss.size - k + 1)
        ]
    for subset, runs in load("gadre2024").items():
        ladder = runs.subset(np.isclose(runs.d / runs.n, 20.0, rtol=1e-3))
        out += [
            (f"gadre-{subset}-{i}", ladder.subset(np.arange(i, i + k)))
            for i in range(ladder.loss.size - k + 1)
        ]
    return out


LADDERS = _sub_ladders(3)[::3] + _sub_ladders(4)[::2]


@pytest.mark.parametrize(("name", "ladder"), LADDERS, ids=[n for n, _ in LADDERS])
def test_real_sub_ladders_never_crash_and_never_give_a_degenerate_interval(name: str, ladder: Runs) -> None:
    order = np.argsort(ladder.compute)
    compute, loss = ladder.compute[order], ladder.loss[order]
    fit = fit_offset(compute, loss, FitSettings(bootstrap=100))
    gates = fit_gates(fit, compute, loss)  # reached the crash on 2 of 4 real 4-rung ladders before issue 34
    assert isinstance(gates["backtest_top_rung"]["ran"], bool)
    target = float(compute.max()) * 10
    for single in (False, True):
        point, low, high = fit.predict(target, single_run=single)
        assert all(math.isfinite(v) for v in (point, low, high)) and 0 < low < point < high
        assert (high - low) / point >= 0.01, f"{name}: a {(high - low) / point:.3%} interval at 10x"
    # one run per budget: the model error has its floor, the mean's interval is one run's (rules issue-34/3)
    assert fit.model_error is not None and fit.model_error.applied >= TAU_FLOOR_NO_SEEDS
    assert fit.predict(target) == fit.predict(target, single_run=True)


def test_the_real_sets_are_the_recorded_files() -> None:
    porian, gadre = load("porian2024"), load("gadre2024")
    assert sorted(porian) == ["owt2", "rw"] and sum(r.loss.size for r in porian.values()) == 176
    assert (
        sorted(gadre) == ["c4_original", "rpj", "rw_original"]
        and sum(r.loss.size for r in gadre.values()) == 104
    )


def test_an_isoflop_sweep_given_to_fit_offset_is_refused_with_a_pointer_to_fit_surface() -> None:
    runs = load("porian2024")["rw"]
    with pytest.raises(LadderInputError) as err:
        fit_offset(runs.compute, runs.loss, FitSettings(bootstrap=50))
    message = str(err.value)
    assert "IsoFLOP sweep" in message and "fit_surface" in message
    assert "more (" in message  # a few budgets named, then a count
    assert len(message) < 1000  # the refusal of a raw sweep was 15,000 characters before issue 34


def test_a_refusal_names_a_few_entries_and_counts_the_rest() -> None:
    compute = np.geomspace(1e15, 1e18, 40)
    loss = np.linspace(2.0, 3.0, 40)  # rising with compute at every budget
    with pytest.raises(LadderInputError) as err:
        fit_offset(compute, loss, FitSettings(bootstrap=50))
    message = str(err.value)
    assert "and 36 more (39 in all)" in message and len(message) < 800
