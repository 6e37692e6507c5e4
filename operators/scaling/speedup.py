"""Ideas ranked by compute-equivalent speedup: "this change is worth 1.21x compute (90% interval 1.08-1.36x)".

Given the baseline's law ``L(C) = E + A·C^(-alpha)`` fitted on a ladder (:func:`.fit.fit_offset`, C = 6·N·D)
and an ablation's runs on the same ladder (the same rungs' shapes, data and held-out metric, one change),
the **compute multiplier** of a run is the compute the baseline would need to reach the run's loss, over
the compute the run used:

    m_i = C_base(L_i) / C_i,        C_base(L) = (A / (L - E))^(1/alpha)

which at one compute is Marin's MoE digest's ``((L_base - E) / (L_var - E))^(1/alpha)``. A change worth
1.21x is as good as training the baseline on 21% more compute. Several runs (rungs x seeds) give the
geometric mean of their multipliers, the ablation's law taken as the baseline's shifted along C.

**Interval** (``level``, 90% by default): for each of the baseline fit's bootstrap replicates (its own E, A,
alpha), the ablation's runs are redrawn with the baseline's noise (log L_i + sigma·z, sigma the fit's noise
per run) and the multiplier recomputed; the interval is the replicates' percentiles. It holds both the
baseline law's uncertainty and the ablation runs' noise. A loss at or below a replicate's E is one that
baseline never reaches: that replicate's multiplier is unbounded, and the interval's upper end says so.

:func:`compute_multiplier` is the pure function; :func:`score_speedup` is a step (``speedup.json``) reading
two ladders' ``fit.json`` files (the baseline's law, the ablation's runs), so an experiment's criterion can
decide on it (``Criterion(metric="abl/speedup:speedup.json/compute_multiplier", better="higher",
baseline=1.0)``) and ``marin catalogue --sort speedup`` can rank ideas by it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from openlab_records import read_json, write_json_atomic
from operators.scaling.fit import ScalingFit, _unpack
from operators.scaling.fitstep import FIT_FILE

SPEEDUP_FILE = "speedup.json"
UNBOUNDED = math.inf


@dataclasses.dataclass(frozen=True)
class ComputeMultiplier:
    """An ablation's effect as a multiple of the baseline's compute, with its interval."""

    point: float
    low: float
    high: float
    level: float
    runs: tuple[tuple[float, float, float], ...]
    """(compute 6·N·D, loss, multiplier) per ablation run."""

    @property
    def text(self) -> str:
        """``this change is worth 1.21x compute (90% interval 1.08-1.36x)``."""
        high = "unbounded" if math.isinf(self.high) else f"{self.high:.2f}×"
        return (
            f"this change is worth {self.point:.2f}× compute ({self.level:.0%} interval "
            f"{self.low:.2f}–{high})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "compute_multiplier": self.point,
            "low": self.low,
            "high": _finite(self.high),
            "level": self.level,
            "text": self.text,
            "runs": [{"compute_6nd": c, "loss": v, "multiplier": _finite(m)} for c, v, m in self.runs],
        }


def _finite(value: float) -> float | None:
    """JSON has no infinity: an unbounded multiplier is written as null."""
    return None if math.isinf(value) else value


def _log_multipliers(
    e: np.ndarray, log_a: np.ndarray, alpha: np.ndarray, compute: np.ndarray, loss: np.ndarray
) -> np.ndarray:
    """log m for parameter rows (B,) and runs (B, n) or (n,): log C_base(L) - log C, inf where L <= E."""
    gap = loss - e[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_c = (log_a[:, None] - np.log(np.where(gap > 0, gap, np.nan))) / alpha[:, None]
    return np.where(gap > 0, log_c - np.log(compute), np.inf)


def compute_multiplier(
    baseline: ScalingFit,
    compute: Sequence[float],
    loss: Sequence[float],
    *,
    level: float | None = None,
    rng_seed: int = 0,
) -> ComputeMultiplier:
    """The ablation runs' (``compute`` in the baseline's x-axis, ``loss``) compute multiplier over the
    ``baseline`` law, with its interval (see the module docstring)."""
    c, y = np.asarray(compute, float), np.asarray(loss, float)
    if c.shape != y.shape or c.size == 0 or not (np.all(np.isfinite(c)) and np.all(c > 0)):
        raise ValueError(
            f"compute_multiplier: give one positive compute per ablation run and as many losses "
            f"(got {c.size} computes, {y.size} losses)"
        )
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError(f"compute_multiplier: the ablation's losses {y.tolist()[:5]} must be finite and > 0")
    level = baseline.settings.level if level is None else level
    fixed_e = baseline.settings.fixed_e

    def params(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        e, k, a = _unpack(theta, fixed_e)
        return e, k + a * math.log(baseline.c_ref), a  # log A in absolute units of C

    e, log_a, alpha = params(baseline.theta[None, :])
    per_run = _log_multipliers(e, log_a, alpha, c, y)[0]
    if np.any(np.isinf(per_run)):
        below = [f"{v:.4g}" for v, m in zip(y, per_run, strict=True) if np.isinf(m)]
        raise ValueError(
            f"compute_multiplier: the ablation's losses {below[:3]} are at or below the baseline law's "
            f"E = {float(e[0]):.4g}: no compute of the baseline reaches them; fit the baseline with more "
            "rungs (or a fixed E) before ranking this change"
        )
    # a stream of its own: the fit's parametric bootstrap drew its replicates' noise from default_rng(seed)
    # in the same (B, runs) shape, and reusing it would anti-correlate the two sources of uncertainty
    rng = np.random.default_rng((rng_seed, 34))
    be, bla, ba = params(baseline.boot_theta)
    noisy = y[None, :] * np.exp(baseline.sigma * rng.standard_normal((be.size, y.size)))
    draws = _log_multipliers(be, bla, ba, c, noisy).mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail], method="linear")
    return ComputeMultiplier(
        point=float(math.exp(per_run.mean())),
        low=float(math.exp(low)),
        high=UNBOUNDED if not math.isfinite(high) else float(math.exp(high)),
        level=level,
        runs=tuple(
            (float(ci), float(yi), float(math.exp(m))) for ci, yi, m in zip(c, y, per_run, strict=True)
        ),
    )


@dataclasses.dataclass(frozen=True)
class SpeedupConfig:
    output_path: str
    """Where speedup.json is written."""
    baseline_fit: str
    """The baseline ladder's fit step output path (its law at the end of training)."""
    ablation_fit: str
    """The ablation ladder's fit step output path (its runs' end values; the law it fitted is not used)."""
    rng_seed: int = 0
    """The interval's random draws."""


def _read_fit(path: str) -> dict[str, Any]:
    record = read_json(f"{path.rstrip('/')}/{FIT_FILE}")
    if record is None:
        raise FileNotFoundError(
            f"speedup: no {path.rstrip('/')}/{FIT_FILE}: run that ladder's fit step first"
        )
    return dict(record)


def score_speedup(config: SpeedupConfig) -> dict[str, Any]:
    """The ablation's compute multiplier over the baseline's end law; writes and returns speedup.json."""
    base, ablation = _read_fit(config.baseline_fit), _read_fit(config.ablation_fit)
    if base["metric"] != ablation["metric"]:
        raise ValueError(
            f"speedup: the baseline forecasts {base['metric']!r} but the ablation measured "
            f"{ablation['metric']!r}; compare the same held-out metric"
        )
    end = [f for f in base["fractions"] if f["fraction"] == 1.0]
    if not end:
        raise ValueError(f"speedup: the baseline's fit at {config.baseline_fit} has no law at the end (1.0)")
    law = ScalingFit.from_json(end[0]["fit"])
    runs = [r for r in ablation["runs"] if r["lr_multiple"] == 1.0]
    result = compute_multiplier(
        law, [r["compute_6nd"] for r in runs], [r["values"]["1"] for r in runs], rng_seed=config.rng_seed
    )
    record = {
        **result.to_json(),
        "metric": base["metric"],
        "baseline_fit": config.baseline_fit,
        "ablation_fit": config.ablation_fit,
        "method": "C_base(L)/C per run, geometric mean; interval: the baseline's bootstrap replicates with "
        "the ablation's runs redrawn at the baseline's noise",
    }
    write_json_atomic(f"{config.output_path.rstrip('/')}/{SPEEDUP_FILE}", record)
    print(f"[speedup] {result.text}", file=sys.stderr, flush=True)
    return record
