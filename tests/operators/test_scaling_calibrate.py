"""Fixing E from a family's runs: against an independent numpy fit, and the E the recorded ladders fixed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from operators.scaling import LadderInputError
from operators.scaling.calibrate import CalibrateE, Family, FamilyTarget, calibrate_e, read_family

RUNS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "runs"
V5, V9 = "2026-12-03-scaling-ladder-real-v5-rungs.json", "2026-12-04-scaling-ladder-real-v9-rungs.json"
FOUR_LAYER_TARGETS = (
    (V5, "2026-12-02-scaling-ladder-real-v3.json"),
    (V5, "2026-12-03-scaling-ladder-real-v5.json"),
    (V5, "2026-12-03-scaling-ladder-real-v6.json"),
    ("2026-12-04-scaling-ladder-real-v8-rungs.json", "2026-12-04-scaling-ladder-real-v8.json"),
    (V9, "2026-12-04-scaling-ladder-real-v9.json"),
)
TENTH_TARGET = ("2026-12-04-scaling-ladder-real-v10-rungs.json", "2026-12-04-scaling-ladder-real-v10.json")


def _numpy_e(compute: np.ndarray, loss: np.ndarray) -> float:
    """E by profiling: for each E on a fine grid, least squares of log(L - E) on log C; the best E refined
    by a parabola through its neighbours' residual sums (no scipy, no project code)."""
    grid = np.linspace(0.0, loss.min() * 0.999, 20001)
    x = np.log(compute)
    design = np.stack([np.ones_like(x), x], axis=1)
    ss = []
    for e in grid:
        y = np.log(loss - e)
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        ss.append(float(np.sum((np.log(e + np.exp(design @ coef)) - np.log(loss)) ** 2)))
    i = int(np.argmin(ss))
    s0, s1, s2 = ss[i - 1], ss[i], ss[i + 1]
    step = grid[1] - grid[0]
    return float(grid[i] + 0.5 * step * (s0 - s2) / (s0 - 2 * s1 + s2))


def test_calibrated_e_matches_an_independent_numpy_fit_on_a_synthetic_family() -> None:
    rng = np.random.default_rng(7)
    rung_c = np.repeat(np.logspace(11, 12, 5), 3)
    truth = lambda c: 1.2 + 900.0 * c**-0.25  # noqa: E731
    rung_l = truth(rung_c) * np.exp(2e-4 * rng.standard_normal(rung_c.size))
    target_c = np.array([1e13, 3e13])
    target_l = truth(target_c)
    family = Family(tuple(rung_c), tuple(rung_l), tuple(zip(target_c, target_l, strict=True)))
    got = calibrate_e(family).params["E"]
    want = _numpy_e(np.concatenate([rung_c, target_c]), np.concatenate([rung_l, target_l]))
    assert got == pytest.approx(want, abs=2e-3)
    assert got == pytest.approx(1.2, abs=0.03)


@pytest.mark.parametrize(
    ("targets", "fixed"),
    [(FOUR_LAYER_TARGETS, 1.174), ((*FOUR_LAYER_TARGETS, TENTH_TARGET), 1.176)],
    ids=["tenth-design", "eleventh-design"],
)
def test_the_recorded_four_layer_family_gives_the_e_the_tenth_and_eleventh_ladders_fixed(
    targets: tuple[tuple[str, str], ...], fixed: float
) -> None:
    config = CalibrateE(
        rungs=str(RUNS / V9), targets=tuple(FamilyTarget(str(RUNS / r), str(RUNS / v)) for r, v in targets)
    )
    family = read_family(config)
    assert len(family.rung_compute) == 24 and len(family.targets) == len(targets)
    assert round(calibrate_e(family).params["E"], 3) == fixed


def test_a_verdict_without_the_target_and_a_family_without_targets_are_refused(tmp_path: Path) -> None:
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"real": [{"target": "d8-L1", "points": []}]}))
    config = CalibrateE(rungs=str(RUNS / V9), targets=(FamilyTarget(str(RUNS / V9), str(verdict)),))
    missing = r"has no verdict for target 'd96-L4' \(it scored \['d8-L1'\]\)"
    with pytest.raises(LadderInputError, match=missing):
        read_family(config)
    with pytest.raises(LadderInputError, match="needs at least one scored target"):
        calibrate_e(Family((1e11, 1e12, 1e13), (3.0, 2.5, 2.2), ()))


def test_a_missing_record_is_refused_naming_it(tmp_path: Path) -> None:
    gone = str(tmp_path / "v9-rungs.json")
    with pytest.raises(FileNotFoundError, match=f"{re.escape(gone)}: no such record"):
        read_family(CalibrateE(rungs=gone, targets=()))
