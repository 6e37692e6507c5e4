"""Hand-written ladder files for the scaling operator tests (no training): rung curves on a known law with
0.4% noise, and a target and prediction config to forecast it. Written through the real writer
(``write_json_atomic``, ``curve.json``'s fields), so they cannot drift from the format."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from moe_trainer.jsonio import write_json_atomic
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fitstep import RungRun
from operators.scaling.prediction import PredictionConfig, TargetSpec

DENSE = {"vocab_size": 257, "n_experts": 0}


def curve(path: Path, n: int, values: list[float], tokens_per_step: int = 1000, steps: int = 100) -> str:
    """A curve.json under ``path`` with ``values`` at 25/50/75/100% of ``steps``; returns ``path``."""
    points = [
        {
            "step": int(f * steps),
            "fraction": f,
            "tokens": int(f * steps) * tokens_per_step,
            "compute_6nd": 6.0 * n * int(f * steps) * tokens_per_step,
            "compute_trainer": 9.0 * n * int(f * steps) * tokens_per_step,
            "value": v,
        }
        for f, v in zip((0.25, 0.5, 0.75, 1.0), values, strict=True)
    ]
    write_json_atomic(str(path / CURVE_FILE), {"metric": "micro.bpb", "points": points, "n_params": n})
    return str(path)


def law(c: float) -> float:
    """The true law of :func:`make_ladder_runs`: ``1 + 40·C^-0.15``."""
    return 1.0 + 40.0 * c**-0.15


def target() -> TargetSpec:
    """A target of 250k parameters at 20 tokens per parameter, 100 steps."""
    n = 2.5e5
    return TargetSpec(
        name="big",
        config_hash="c" * 64,
        n_params=int(n),
        tokens_per_step=int(20 * n / 100),
        num_steps=100,
        flops_per_token=9.0 * n,
        eval_steps=(25, 50, 75, 100),
    )


def prediction_config(tmp_path: Path) -> PredictionConfig:
    """The prediction step's config for :func:`target` from the fit under ``tmp_path / "fit"``."""
    return PredictionConfig(
        output_path=str(tmp_path / "prediction"),
        fit=str(tmp_path / "fit"),
        target=target(),
        experiment="test",
        issue="local/experiments#15",
    )


def make_ladder_runs(tmp_path: Path) -> list[RungRun]:
    """Five rungs (2k-70k parameters) x three seeds at 20 tokens per parameter, on :func:`law`."""
    rng = np.random.default_rng(3)
    runs = []
    for n in (2e3, 5e3, 1.2e4, 3e4, 7e4):
        for seed in (0, 1, 2):
            tokens = 20 * n
            values = [
                law(6 * n * tokens * f) * math.exp(0.004 * rng.standard_normal())
                for f in (0.25, 0.5, 0.75, 1)
            ]
            out = tmp_path / f"eval-{int(n)}-{seed}"
            runs.append(
                RungRun(rung=f"n{int(n)}", seed=seed, curve=curve(out, int(n), values, int(tokens / 100)))
            )
    return runs
