"""Compute-equivalent speedup (issue 34, item 5): an ablation that is the baseline law shifted along
compute by a known factor is scored at that factor, inside its interval; no change scores about 1x with 1
inside; a change for the worse scores below 1; the step reads two ladders' fit.json files; a loss the
baseline never reaches is refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from operators.scaling.fit import FitSettings, ScalingFit, fit_offset
from operators.scaling.fitstep import FitConfig, RungRun, fit_ladder
from operators.scaling.speedup import SPEEDUP_FILE, SpeedupConfig, compute_multiplier, score_speedup
from tests.fakes.scaling_ladder import curve as _curve

SIZES = (2e3, 5e3, 1.2e4, 3e4, 7e4)
NOISE = 0.004


def _law(c: float) -> float:
    return 1.0 + 40.0 * c**-0.15


def _runs(factor: float, seed: int) -> list[tuple[float, float]]:
    """(6·N·D, end loss) per rung x 3 seeds of a ladder whose law is the baseline's at ``factor`` x
    compute."""
    rng = np.random.default_rng(seed)
    return [
        (6 * n * 20 * n, _law(factor * 6 * n * 20 * n) * math.exp(NOISE * rng.standard_normal()))
        for n in SIZES
        for _ in range(3)
    ]


@pytest.fixture(scope="module")
def baseline():  # type: ignore[no-untyped-def]
    c, y = zip(*_runs(1.0, 0), strict=True)
    return fit_offset(c, y, FitSettings(bootstrap=400))


@pytest.mark.parametrize("factor", [1.21, 1.0, 0.8], ids=["better", "same", "worse"])
def test_a_shift_along_compute_is_scored_at_its_factor(baseline, factor: float) -> None:  # type: ignore[no-untyped-def]
    c, y = zip(*_runs(factor, 1), strict=True)
    m = compute_multiplier(baseline, c, y)
    assert m.point == pytest.approx(factor, rel=0.06)
    assert m.low < factor < m.high and m.low < m.point < m.high
    assert m.high / m.low < 1.5  # 15 runs at 0.4% noise pin a multiplier down to tens of percent
    if factor == 1.0:
        assert m.low < 1.0 < m.high
    else:
        assert (m.low > 1.0) if factor > 1 else (m.high < 1.0)
    assert m.text == (f"this change is worth {m.point:.2f}× compute (90% interval {m.low:.2f}–{m.high:.2f}×)")
    assert [round(r[2], 12) for r in m.runs] == [
        round(baseline_c / ci, 12)
        for ci, baseline_c in zip(c, [_inverse(baseline, v) for v in y], strict=True)
    ]


def _inverse(fit, loss: float) -> float:  # type: ignore[no-untyped-def]
    p = fit.params
    return float((p["A"] / (loss - p["E"])) ** (1 / p["alpha"]))


def test_one_run_at_one_compute_is_marins_formula(baseline) -> None:  # type: ignore[no-untyped-def]
    p = baseline.params
    c = 6 * 3e4 * 20 * 3e4
    l_base, l_var = baseline.point(c), baseline.point(c) * 0.99
    m = compute_multiplier(baseline, [c], [l_var])
    assert m.point == pytest.approx(((l_base - p["E"]) / (l_var - p["E"])) ** (1 / p["alpha"]), rel=1e-9)


def test_a_loss_the_baseline_never_reaches_and_bad_input_are_refused(baseline) -> None:  # type: ignore[no-untyped-def]
    e = baseline.params["E"]
    with pytest.raises(ValueError, match=r"at or below the baseline law's E = .*no compute of the baseline"):
        compute_multiplier(baseline, [1e9], [e * 0.99])
    with pytest.raises(ValueError, match="one positive compute per ablation run and as many losses"):
        compute_multiplier(baseline, [1e9, 2e9], [2.0])


def _ladder(tmp_path: Path, name: str, factor: float, seed: int) -> str:
    runs, rng = [], np.random.default_rng(seed)
    for n in SIZES:
        for s in range(3):
            tokens = 20 * n
            values = [
                _law(factor * 6 * n * tokens * f) * math.exp(NOISE * rng.standard_normal())
                for f in (0.25, 0.5, 0.75, 1)
            ]
            out = _curve(tmp_path / name / f"eval-{int(n)}-{s}", int(n), values, int(tokens / 100))
            runs.append(RungRun(rung=f"n{int(n)}", seed=s, curve=out))
    fit_ladder(FitConfig(output_path=str(tmp_path / name / "fit"), runs=tuple(runs), bootstrap=200))
    return str(tmp_path / name / "fit")


def test_the_step_scores_an_ablation_ladder_against_the_baselines_law(tmp_path: Path) -> None:
    from openlab_records import read_json

    config = SpeedupConfig(
        output_path=str(tmp_path / "speedup"),
        baseline_fit=_ladder(tmp_path, "base", 1.0, 5),
        ablation_fit=_ladder(tmp_path, "ablation", 1.3, 6),
    )
    out = score_speedup(config)
    assert read_json(str(tmp_path / "speedup" / SPEEDUP_FILE)) == out
    base, ablation = (read_json(f"{p}/fit.json") for p in (config.baseline_fit, config.ablation_fit))
    law = ScalingFit.from_json(base["fractions"][-1]["fit"])  # the end law, the ablation's end values
    direct = compute_multiplier(
        law, [r["compute_6nd"] for r in ablation["runs"]], [r["values"]["1"] for r in ablation["runs"]]
    )
    assert {k: out[k] for k in direct.to_json()} == direct.to_json() and len(out["runs"]) == 15
    assert out["compute_multiplier"] == pytest.approx(1.3, rel=0.08) and out["low"] < out["high"]
    assert out["text"].startswith("this change is worth 1.")
    assert out["metric"] == "micro.bpb"
