"""The ``fit`` step: every rung's curve -> one law per evaluation fraction -> ``fit.json``.

For each fraction f of training (25/50/75/100%), the values of all rungs and seeds at f are fitted with
:func:`operators.scaling.fit.fit_offset` against ``6·N·D_f`` (N non-embedding active parameters, D_f the
tokens seen by f); the same points are also fitted against the trainer's FLOPs (``flops_per_token·D_f``) and
recorded, so a gap between the two forecasts is visible as model uncertainty (research note §3.1).

Refusals (a :class:`LadderInputError` naming the rungs): a rung and seed without a ``curve.json`` (its
train or eval step failed, or never ran), non-finite values, fewer than three distinct budgets, losses that
do not decrease with compute.

Gates recorded (not enforced, so a person decides; :mod:`.gates`): the largest residual in units of the
seeds' spread, the top-rung backtest, and the learning-rate check when the ladder has one (the rule's
learning rate within ``lr_check_tolerance`` of the best multiple tried).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import numpy as np

from moe_trainer.jsonio import write_json_atomic
from openlab_records import read_json
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fit import FitSettings, fit_offset
from operators.scaling.gates import LR_CHECK_TOLERANCE, fit_gates, rung_lr_check
from operators.scaling.inputs import LadderInputError

FIT_FILE = "fit.json"


@dataclasses.dataclass(frozen=True)
class RungRun:
    """One run of the ladder as the fit step sees it: which rung, which seed, where its curve is."""

    rung: str
    seed: int
    curve: str
    """The eval step's output path (curve.json inside)."""
    train: str = ""
    """The train step's output path (its .marin/step.json holds the step hash)."""
    lr_multiple: float = 1.0
    """1.0 for ladder runs; other values are the learning-rate check."""


@dataclasses.dataclass(frozen=True)
class FitConfig:
    output_path: str
    """Where fit.json is written."""
    runs: tuple[RungRun, ...]
    """Every rung x seed (and the learning-rate check runs)."""
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    """Fractions of training at which each rung was evaluated."""
    fixed_e: float | None = None
    """Fix the irreducible loss E instead of fitting it (recorded as an assumption)."""
    huber_delta: float = 1e-3
    """Huber threshold on log L."""
    bootstrap: int = 1000
    """Parametric bootstrap replicates."""
    rng_seed: int = 0
    """Seed of the bootstrap."""
    level: float = 0.9
    """Interval level."""
    lr_check_tolerance: float = LR_CHECK_TOLERANCE
    """Relative loss gap the rule's learning rate may have to the best multiple tried."""


def _step_hash(train_path: str) -> str | None:
    """The identity hash of the step that trained a rung, from its ``.marin/step.json``; None without one
    (no train path, no such file, a file that is not JSON or names no hash)."""
    if not train_path:
        return None
    try:
        info = read_json(f"{train_path.rstrip('/')}/.marin/step.json")  # None when there is no such file
    except ValueError:  # RecordFormatError: not JSON
        return None
    if not isinstance(info, dict) or not info.get("hash"):
        return None
    return str(info["hash"])


def load_runs(runs: tuple[RungRun, ...]) -> list[dict[str, Any]]:
    """Each run's curve (with its file's sha256); refuses missing or non-finite ones, naming them all."""
    loaded, missing, broken = [], [], []
    for run in runs:
        path = f"{run.curve.rstrip('/')}/{CURVE_FILE}"
        try:
            raw = read_bytes(path)
        except FileNotFoundError:
            missing.append(f"{run.rung} seed {run.seed} (no {path})")
            continue
        curve = json.loads(raw)
        bad = [p["step"] for p in curve["points"] if not math.isfinite(float(p["value"]))]
        if bad:
            broken.append(f"{run.rung} seed {run.seed} (non-finite {curve['metric']} at steps {bad})")
        loaded.append(
            {
                "run": run,
                "curve": curve,
                "sha256": hashlib.sha256(raw).hexdigest(),
                "step_hash": _step_hash(run.train),
            }
        )
    if missing or broken:
        parts = ([f"missing rungs: {'; '.join(missing)}"] if missing else []) + (
            [f"diverged rungs: {'; '.join(broken)}"] if broken else []
        )
        raise LadderInputError(
            "the ladder cannot be fitted, so it refuses to predict: "
            + " · ".join(parts)
            + ". Re-run the failed train/eval steps (marin run ... --force-run-failed) or "
            "remove those rungs from the ladder"
        )
    return loaded


def read_bytes(path: str) -> bytes:
    """A file's bytes through fsspec (FileNotFoundError when absent)."""
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        raise FileNotFoundError(path)
    with fs.open(p, "rb") as f:
        data: bytes = f.read()
    return data


def _points_at(loaded: list[dict[str, Any]], fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c6, ct, value = [], [], []
    for item in loaded:
        point = min(item["curve"]["points"], key=lambda p: abs(p["fraction"] - fraction))
        if abs(point["fraction"] - fraction) > 1e-9:
            run = item["run"]
            raise LadderInputError(
                f"rung {run.rung} seed {run.seed} has no evaluation at {fraction:.0%} of "
                f"its training (fractions: {[p['fraction'] for p in item['curve']['points']]})"
            )
        c6.append(point["compute_6nd"])
        ct.append(point["compute_trainer"])
        value.append(point["value"])
    return np.asarray(c6), np.asarray(ct), np.asarray(value)


def _lr_check_rows(loaded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per learning-rate check run: its end value and the rule's run of the same rung and seed."""
    rows = []
    for item in loaded:
        run = item["run"]
        if run.lr_multiple == 1.0:
            continue
        base_name = run.rung.rsplit("-lrx", 1)[0]
        base = [
            i
            for i in loaded
            if i["run"].rung == base_name and i["run"].seed == run.seed and i["run"].lr_multiple == 1.0
        ]
        rows.append(
            {
                "rung": base_name,
                "seed": run.seed,
                "multiple": run.lr_multiple,
                "value": item["curve"]["points"][-1]["value"],
                "rule_value": base[0]["curve"]["points"][-1]["value"] if base else None,
            }
        )
    return rows


def fit_ladder(config: FitConfig) -> dict[str, Any]:
    """Fit one law per fraction; write and return fit.json's content (see the module docstring)."""
    loaded = load_runs(config.runs)
    ladder = [i for i in loaded if i["run"].lr_multiple == 1.0]
    settings = FitSettings(
        fixed_e=config.fixed_e,
        huber_delta=config.huber_delta,
        bootstrap=config.bootstrap,
        rng_seed=config.rng_seed,
        level=config.level,
    )
    fractions: list[dict[str, Any]] = []
    for fraction in config.fractions:
        c6, ct, value = _points_at(ladder, fraction)
        fit = fit_offset(c6, value, settings)
        alt = fit_offset(ct, value, dataclasses.replace(settings, bootstrap=200))
        fractions.append(
            {
                "fraction": fraction,
                "x": "6*N*D",
                "fit": fit.to_json(full=True),
                "fit_trainer_flops": alt.to_json(full=True),
                "gates": fit_gates(fit, c6, value),
            }
        )
    record = {
        "fractions": fractions,
        "lr_check": rung_lr_check(_lr_check_rows(loaded), config.lr_check_tolerance),
        "runs": [
            {
                "rung": i["run"].rung,
                "seed": i["run"].seed,
                "lr_multiple": i["run"].lr_multiple,
                "curve_path": i["run"].curve,
                "curve_sha256": i["sha256"],
                "step_hash": i["step_hash"],
                "n_params": i["curve"]["n_params"],
                "values": {f"{p['fraction']:g}": p["value"] for p in i["curve"]["points"]},
                "compute_6nd": i["curve"]["points"][-1]["compute_6nd"],
            }
            for i in loaded
        ],
        "metric": ladder[0]["curve"]["metric"],
    }
    write_json_atomic(f"{config.output_path.rstrip('/')}/{FIT_FILE}", record)
    return {"fractions": [{"fraction": f["fraction"], "params": f["fit"]["params"]} for f in fractions]}
