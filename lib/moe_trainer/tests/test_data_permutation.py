"""The Feistel data order: exact bijection, determinism, per-epoch keys, and the statistical gates of
data-scaling-eval.md §1.4 at n ~ 1e6 (passed by Feistel and by numpy's shuffle, failed by the LCG control)."""

from __future__ import annotations

import numpy as np
import pytest

from moe_trainer.data.permutation import (
    FeistelPermutation,
    LcgPermutation,
    feistel_permutation,
    lcg_permutation,
)
from moe_trainer.data.shuffle_gates import GateReport, evaluate_order

GATE_N = 1_000_003  # the note's setup: every gate threshold is several null sigmas wide at this size

AWKWARD_N = [1, 2, 3, 4, 5, 7, 8, 16, 17, 64, 65, 97, 1023, 1024, 1025, 4099, 65536, 65537, 104729, 262147]


@pytest.mark.parametrize("n", AWKWARD_N, ids=[f"n={n}" for n in AWKWARD_N])
def test_feistel_is_a_bijection(n: int) -> None:
    for seed, epoch in [(0, 0), (12345, 3)]:
        out = feistel_permutation(n, seed, epoch)(np.arange(n))
        assert out.dtype == np.int64
        assert np.array_equal(np.sort(out), np.arange(n))


def test_feistel_random_access_matches_full_order() -> None:
    perm = feistel_permutation(100_003, seed=9)
    full = perm(np.arange(100_003))
    picks = np.array([100_002, 0, 5, 77_777, 5])
    assert np.array_equal(perm(picks), full[picks])
    assert int(perm(np.int64(31))) == full[31]
    assert perm(np.arange(12).reshape(3, 4)).shape == (3, 4)


def test_feistel_is_deterministic_per_key_and_differs_across_keys_and_epochs() -> None:
    n = 50_000
    idx = np.arange(n)
    base = feistel_permutation(n, 1, 0)(idx)
    assert np.array_equal(base, feistel_permutation(n, 1, 0)(idx))
    for other in (feistel_permutation(n, 1, 1)(idx), feistel_permutation(n, 2, 0)(idx)):
        # a different order, and not a trivially related one (almost no position agrees)
        assert np.count_nonzero(other == base) < 20
    epochs = np.stack([feistel_permutation(n, 1, e)(idx[:64]) for e in range(8)])
    assert len({row.tobytes() for row in epochs}) == 8


def test_feistel_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n must be >= 1"):
        feistel_permutation(0, 1)
    with pytest.raises(ValueError, match="rounds must be >= 4"):
        FeistelPermutation(10, 1, rounds=3)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        feistel_permutation(10, 1)(np.array([3, 10]))
    with pytest.raises(TypeError, match="integers"):
        feistel_permutation(10, 1)(np.array([0.5]))


def test_feistel_describe_records_the_order() -> None:
    d = FeistelPermutation(1000, seed=5, epoch=2).describe()
    assert d == {"type": "feistel", "mixer": "splitmix64-v1", "rounds": 6, "n": 1000, "seed": 5, "epoch": 2,
                 "domain_bits": 10}


def test_lcg_control_is_a_bijection_too() -> None:
    # the control is a valid permutation; it fails only on statistics, which is the point of the gates
    for n in (1, 2, 97, 1024):
        assert np.array_equal(np.sort(lcg_permutation(n, 3)(np.arange(n))), np.arange(n))


@pytest.fixture(scope="module")
def feistel_reports() -> list[GateReport]:
    return [evaluate_order(feistel_permutation(GATE_N, seed, epoch), GATE_N)
            for seed, epoch in [(0, 0), (1, 0), (1, 1), (2024, 5)]]


def test_feistel_passes_every_gate(feistel_reports: list[GateReport]) -> None:
    for report in feistel_reports:
        assert report.failures() == [], report


# an odd bit count (unbalanced halves, 21 bits) and a domain barely half full (cycle-walking ~1.75 passes)
@pytest.mark.parametrize("n", [1_500_007, 600_011], ids=["odd-bits", "half-full-domain"])
def test_feistel_passes_every_gate_at_other_sizes(n: int) -> None:
    report = evaluate_order(feistel_permutation(n, 3), n)
    assert report.failures() == [], report


@pytest.mark.parametrize("n", [GATE_N, 600_011], ids=["n=1e6", "n=6e5"])
def test_numpy_shuffle_passes_every_gate(n: int) -> None:
    # positive control: the thresholds accept a true uniform shuffle, so a Feistel pass is meaningful
    order = np.random.default_rng(7).permutation(n)
    report = evaluate_order(lambda i: order[i], n)
    assert report.failures() == [], report


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lcg_fails_stride_runs_dispersion_and_autocorr_gates(seed: int) -> None:
    report = evaluate_order(lcg_permutation(GATE_N, seed), GATE_N)
    assert report.modal_stride_share == 1.0  # every step has the same stride
    assert abs(report.runs_z) > 100
    assert report.dispersion < 0.9  # batches spread far more evenly than chance
    assert report.share_autocorr < -0.05
    assert {"modal_stride", "runs", "dispersion", "share_autocorr"} <= set(report.failures())


@pytest.mark.parametrize("stride", [3, GATE_N // 2 + 1], ids=["small-stride", "half-n-stride"])
def test_lcg_with_unlucky_stride_clumps_into_phases(stride: int) -> None:
    report = evaluate_order(LcgPermutation(GATE_N, 0, stride=stride), GATE_N)
    assert report.dispersion > 50  # each batch draws from one or two strata: the loss "phases"
    assert report.share_autocorr > 0.9  # and the same strata repeat batch after batch
    assert {"modal_stride", "runs", "dispersion", "share_autocorr"} <= set(report.failures())
