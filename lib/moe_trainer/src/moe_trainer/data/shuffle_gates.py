"""Statistical gates for a data order: would a permutation of *sorted* data look like a random shuffle?

The data order is judged on a synthetic sorted corpus: ``n`` items in ``K`` contiguous strata (think "sorted
by language"), read in batches of ``B`` consecutive positions of the permutation. The gates and their
thresholds come from the research note data-scaling-eval.md §1.4; each threshold sits several standard
deviations of the random-permutation null distribution away from its expected value at ``n ~ 1e6`` (the sigma
of each statistic is noted next to its computation). A real shuffle passes all of them; the LCG fails the
stride, runs, dispersion and autocorrelation gates by orders of magnitude.

This module is library code (not only test code) so a researcher can gate any other order the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# threshold table (data-scaling-eval.md §1.4)
MAX_ABS_SPEARMAN = 0.005  # null sigma = 1/sqrt(n-1) ~ 0.001 at n = 1e6: 5 sigma
MAX_MODAL_STRIDE_SHARE = 0.01  # null: the most common stride occurs a handful of times out of n
MAX_ABS_RUNS_Z = 4.0  # z is standard normal under the null
AVALANCHE_MEAN_RANGE = (0.47, 0.53)  # null mean ~0.5 (the top output bit is slightly biased when n < 2**bits)
MIN_AVALANCHE_CELL = 0.40  # null sigma per (input bit, output bit) cell = 0.5/sqrt(samples) ~ 0.008
DISPERSION_RANGE = (0.9, 1.1)  # null sigma = sqrt(2/((K-1)T)) ~ 0.006 for K=16, T=3906 batches
MAX_ABS_SHARE_AUTOCORR = 0.05  # null sigma ~ 1/sqrt(T) per stratum ~ 0.016, averaged over K strata


@dataclass(frozen=True)
class GateReport:
    """The statistics of one order and which gates it passed."""

    spearman: float
    modal_stride_share: float
    runs_z: float
    avalanche_mean: float
    avalanche_worst: float
    dispersion: float
    share_autocorr: float

    def failures(self) -> list[str]:
        """Names of the gates this order fails (empty when it passes them all)."""
        checks = {
            "spearman": abs(self.spearman) < MAX_ABS_SPEARMAN,
            "modal_stride": self.modal_stride_share < MAX_MODAL_STRIDE_SHARE,
            "runs": abs(self.runs_z) < MAX_ABS_RUNS_Z,
            "avalanche_mean": AVALANCHE_MEAN_RANGE[0] <= self.avalanche_mean <= AVALANCHE_MEAN_RANGE[1],
            "avalanche_worst": self.avalanche_worst >= MIN_AVALANCHE_CELL,
            "dispersion": DISPERSION_RANGE[0] <= self.dispersion <= DISPERSION_RANGE[1],
            "share_autocorr": abs(self.share_autocorr) < MAX_ABS_SHARE_AUTOCORR,
        }
        return [name for name, ok in checks.items() if not ok]


def spearman_position_source(order: np.ndarray, n: int, strata: int) -> float:
    """Spearman rho between the reading position and the (tied) stratum rank of the item read there."""
    stratum = order * strata // n
    sizes = np.bincount(stratum, minlength=strata).astype(np.float64)
    midrank = np.cumsum(sizes) - (sizes - 1) / 2  # tied items share the mean of their ranks
    return float(np.corrcoef(np.arange(n, dtype=np.float64), midrank[stratum])[0, 1])


def modal_stride_share(order: np.ndarray, n: int) -> float:
    """Share of consecutive steps whose stride (mod n) equals the most common stride (1.0 for an LCG)."""
    strides = np.mod(np.diff(order), n)
    _, counts = np.unique(strides, return_counts=True)
    return float(counts.max() / strides.size)


def runs_up_down_z(order: np.ndarray) -> float:
    """Wald-Wolfowitz runs-up-and-down z score: too few or too many monotone runs means structure."""
    m = order.size
    signs = np.diff(order) > 0
    runs = 1 + int(np.count_nonzero(signs[1:] != signs[:-1]))
    mean, var = (2 * m - 1) / 3, (16 * m - 29) / 90
    return (runs - mean) / math.sqrt(var)


def _flip_expectation(n: int, bits: int) -> np.ndarray:
    """P(output bit o differs) for two distinct uniform draws from [0, n): 2c(n-c)/(n(n-1)), c = #values with
    bit o set. 0.5 for every bit when n is a power of two; lower for the top bits otherwise (at n = 600k the
    top bit is set in only 13% of the values, so even a perfect shuffle flips it only 22% of the time)."""
    o = np.arange(bits)
    c: npt.NDArray[np.int64] = (n >> (o + 1)) * (1 << o) + np.maximum(0, n % (1 << (o + 1)) - (1 << o))
    return 2 * c * (n - c) / (n * max(n - 1, 1))


def avalanche(perm: Callable[[np.ndarray], np.ndarray], n: int, samples: int = 4096,
              seed: int = 0) -> tuple[float, float]:
    """(mean, worst cell) of P(output bit o flips | input bit i flipped), over a sample of index pairs.

    Each cell is rescaled by ``0.5 / E[flip of bit o]`` under a uniformly random permutation of [0, n), so an
    ideal shuffle scores 0.5 in every cell whatever n is (the research note's gates assume n just below a
    power of two, where the rescaling is ~1).
    """
    bits = max(1, math.ceil(math.log2(n)))
    rng = np.random.default_rng(seed)
    table = np.zeros((bits, bits))
    for b in range(bits):
        x = rng.integers(0, n, size=samples * 2, dtype=np.int64)
        y = x ^ (1 << b)
        keep = y < n
        x, y = x[keep][:samples], y[keep][:samples]
        diff = (perm(x) ^ perm(y)).astype(np.uint64)
        out_bits = (diff[:, None] >> np.arange(bits, dtype=np.uint64)[None, :]) & np.uint64(1)
        table[b] = out_bits.mean(axis=0)
    table *= 0.5 / _flip_expectation(n, bits)[None, :]
    return float(table.mean()), float(table.min())


def batch_strata_counts(order: np.ndarray, n: int, strata: int, batch: int) -> np.ndarray:
    """(num_batches, strata) counts of items of each stratum in each batch of consecutive positions."""
    t = order.size // batch
    stratum = order[: t * batch] * strata // n
    flat = np.repeat(np.arange(t), batch) * strata + stratum
    return np.bincount(flat, minlength=t * strata).reshape(t, strata)


def dispersion(counts: np.ndarray, n: int, strata: int) -> float:
    """Mean per-batch chi-square over its degrees of freedom: 1 for a multinomial, <1 too even, >1 clumped."""
    sizes = np.bincount(np.arange(n) * strata // n, minlength=strata)
    expected = counts.sum(axis=1, keepdims=True) * sizes[None, :] / n
    chi2 = ((counts - expected) ** 2 / expected).sum(axis=1)
    return float(chi2.mean() / (strata - 1))


def share_autocorr(counts: np.ndarray) -> float:
    """Lag-1 autocorrelation of each stratum's per-batch share, averaged over strata ("phases" show here)."""
    shares = counts / counts.sum(axis=1, keepdims=True)
    centred = shares - shares.mean(axis=0, keepdims=True)
    num = (centred[1:] * centred[:-1]).sum(axis=0)
    den = (centred**2).sum(axis=0)
    return float(np.mean(num / np.where(den > 0, den, 1.0)))


def evaluate_order(perm: Callable[[np.ndarray], np.ndarray], n: int, strata: int = 16,
                   batch: int = 256) -> GateReport:
    """All gates for the permutation ``perm`` of ``[0, n)`` (position j reads item ``perm(j)``)."""
    order = np.asarray(perm(np.arange(n, dtype=np.int64)), dtype=np.int64)
    counts = batch_strata_counts(order, n, strata, batch)
    av_mean, av_worst = avalanche(perm, n)
    return GateReport(
        spearman=spearman_position_source(order, n, strata),
        modal_stride_share=modal_stride_share(order, n),
        runs_z=runs_up_down_z(order),
        avalanche_mean=av_mean,
        avalanche_worst=av_worst,
        dispersion=dispersion(counts, n, strata),
        share_autocorr=share_autocorr(counts),
    )
