"""Fixing E from a family's earlier runs: the irreducible loss a new ladder of the family holds fixed.

A ladder's rungs alone cannot identify E when they lie on a straight line in log-log (exp15's first six
ladders put a free E at its bound, 0). Marin's habit, and exp15's method since its seventh design: fit the
offset power law ``L = E + A·C^(-alpha)`` (:func:`operators.scaling.fit.fit_offset`, Huber on log L)
through the family's rung runs at the rule's learning rate *and* the ends of the targets it has already
scored, and fix the new ladder's E at that fit's E (rounded to three decimals where a design registers it).

    from operators.scaling.calibrate import CalibrateE, FamilyTarget, calibrate_e, read_family
    family = read_family(CalibrateE(rungs="runs/v9-rungs.json",
                                    targets=(FamilyTarget("runs/v5-rungs.json", "runs/v5.json"), ...)))
    calibrate_e(family).params["E"]

Records read: a rungs record (``fit_runs``: ``compute_6nd``, ``lr_multiple``, ``values["1"]`` the end;
``target``: ``name``, ``n_params``, ``num_steps``, ``tokens_per_step``) and a verdict record (``real``: one
entry per scored target, ``target`` its name, ``points`` with the ``"100%"`` point's ``actual``), as the
scaling ladder's record scripts write them into docs/benchmarks/runs/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from openlab_records import read_json
from operators.scaling.fit import FitSettings, ScalingFit, fit_offset
from operators.scaling.inputs import LadderInputError

CALIBRATION_BOOTSTRAP = 20
"""The fewest replicates the fitter takes: a calibration uses the point fit only (its E)."""


@dataclasses.dataclass(frozen=True)
class FamilyTarget:
    """A target the family has scored: the rungs record that names it (its size and budget) and the verdict
    record holding its actual end."""

    rungs: str
    verdict: str


@dataclasses.dataclass(frozen=True)
class CalibrateE:
    """Which records hold the family's rungs (every run at the rule's learning rate) and scored targets."""

    rungs: str
    targets: tuple[FamilyTarget, ...]
    huber_delta: float = 1e-3


@dataclasses.dataclass(frozen=True)
class Family:
    """The points a calibration fits: the rung runs' ends and the scored targets' (compute 6·N·D, end)."""

    rung_compute: tuple[float, ...]
    rung_loss: tuple[float, ...]
    targets: tuple[tuple[float, float], ...]
    huber_delta: float = 1e-3


def _read(path: str) -> dict[str, Any]:
    """The record at ``path`` (any fsspec store); a missing one is refused, naming it."""
    data: dict[str, Any] | None = read_json(path)
    if data is None:
        raise FileNotFoundError(
            f"{path}: no such record; name a rungs or verdict record the scaling ladder's record scripts "
            "wrote (docs/benchmarks/runs/)"
        )
    return data


def target_compute(target: dict[str, Any]) -> float:
    """6·N·D of a recorded target (``n_params``, ``num_steps``, ``tokens_per_step``)."""
    return 6.0 * float(target["n_params"]) * float(target["num_steps"]) * float(target["tokens_per_step"])


def rule_ends(rungs_record: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(compute 6·N·D, end) of every rung run of a rungs record at the rule's learning rate."""
    runs = [r for r in rungs_record["fit_runs"] if r["lr_multiple"] == 1.0]
    return [float(r["compute_6nd"]) for r in runs], [float(r["values"]["1"]) for r in runs]


def target_end(verdict_record: dict[str, Any], name: str, where: str) -> float:
    """The actual end (the ``"100%"`` point) of target ``name`` in a verdict record."""
    for entry in verdict_record["real"]:
        if entry.get("target") == name:
            return float(next(p["actual"] for p in entry["points"] if p["label"] == "100%"))
    names = [e.get("target") for e in verdict_record["real"]]
    raise LadderInputError(f"{where} has no verdict for target {name!r} (it scored {names}): name its record")


def read_family(config: CalibrateE) -> Family:
    """The family's points from the records ``config`` names."""
    compute, loss = rule_ends(_read(config.rungs))
    targets = []
    for t in config.targets:
        target = _read(t.rungs)["target"]
        targets.append((target_compute(target), target_end(_read(t.verdict), target["name"], t.verdict)))
    return Family(tuple(compute), tuple(loss), tuple(targets), config.huber_delta)


def calibrate_e(family: Family) -> ScalingFit:
    """The offset law through the rungs and the scored targets' ends; its ``params["E"]`` is the E to fix."""
    if not family.targets:
        raise LadderInputError("calibrate_e needs at least one scored target: the rungs alone do not pin E")
    compute: Sequence[float] = [*family.rung_compute, *(c for c, _ in family.targets)]
    loss: Sequence[float] = [*family.rung_loss, *(v for _, v in family.targets)]
    settings = FitSettings(huber_delta=family.huber_delta, bootstrap=CALIBRATION_BOOTSTRAP)
    return fit_offset(compute, loss, settings, leave_one_out=False)


__all__ = [
    "CalibrateE",
    "Family",
    "FamilyTarget",
    "calibrate_e",
    "read_family",
    "rule_ends",
    "target_compute",
    "target_end",
]
