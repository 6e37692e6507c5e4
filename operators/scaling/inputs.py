"""Checks on a ladder's measurements before anything is fitted: what the fitter refuses, and why.

A forecast from bad inputs is worse than none, so the fitter reports (raises :class:`LadderInputError`,
a ``ValueError``) instead of fitting when

- the arrays are empty or of different lengths;
- a compute, parameter count, token count or loss is not finite, or not positive (the fit is on log L);
- fewer than ``min_budgets`` distinct budgets are present (three are the minimum for an offset power law,
  which has three parameters: E, A and alpha);
- the losses do not decrease with compute: the mean loss of each budget (over its seeds) must be below the
  mean of every smaller budget. A ladder whose larger rung is no better than a smaller one is mistuned or
  broken; extrapolating it would only hide that.

Every message names the offending entries (index, budget, value) and says what to do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class LadderInputError(ValueError):
    """The ladder's measurements cannot be fitted; the message names the entries and the fix."""


def as_array(name: str, values: Sequence[float] | np.ndarray, n: int | None = None) -> np.ndarray:
    """``values`` as a 1-d float array, checked finite and positive (and of length ``n`` when given)."""
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size == 0:
        raise LadderInputError(f"{name} is empty: give one value per rung and seed")
    if n is not None and arr.size != n:
        raise LadderInputError(
            f"{name} has {arr.size} values but loss has {n}: give one {name} value per "
            "loss value (the seeds of a rung repeat the rung's value)"
        )
    bad = [i for i, v in enumerate(arr) if not math.isfinite(v)]
    if bad:
        shown = ", ".join(f"[{i}]={float(arr[i])!r}" for i in bad[:8])
        raise LadderInputError(
            f"{name} has non-finite values at {shown}: a diverged or unfinished run "
            "cannot be fitted; re-run or drop those rungs"
        )
    nonpos = [i for i, v in enumerate(arr) if v <= 0]
    if nonpos:
        shown = ", ".join(f"[{i}]={float(arr[i])!r}" for i in nonpos[:8])
        raise LadderInputError(f"{name} must be positive (the fit is on logarithms); got {shown}")
    return arr


def group_by_budget(compute: np.ndarray, rel_tol: float = 1e-9) -> list[np.ndarray]:
    """Indices of the entries of each distinct budget, smallest budget first (seeds of a rung share one)."""
    order = np.argsort(compute, kind="stable")
    groups: list[list[int]] = []
    for i in order:
        if groups and abs(compute[i] - compute[groups[-1][0]]) <= rel_tol * compute[i]:
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return [np.asarray(g) for g in groups]


def check_budgets(compute: np.ndarray, min_budgets: int) -> list[np.ndarray]:
    """The budget groups, refusing fewer than ``min_budgets`` distinct budgets."""
    groups = group_by_budget(compute)
    if len(groups) < min_budgets:
        present = ", ".join(f"{compute[g[0]]:.3g} ({len(g)} runs)" for g in groups)
        raise LadderInputError(
            f"only {len(groups)} distinct budgets ({present}); at least {min_budgets} are "
            "needed to fit the law: add rungs or re-run the failed ones"
        )
    return groups


def check_decreasing(compute: np.ndarray, loss: np.ndarray, groups: list[np.ndarray]) -> None:
    """Refuse a ladder whose mean loss per budget does not decrease with compute."""
    means = [float(np.mean(loss[g])) for g in groups]
    problems = []
    for j in range(1, len(groups)):
        best_before = min(means[:j])
        if means[j] >= best_before:
            k = means.index(best_before)
            problems.append(
                f"budget {compute[groups[j][0]]:.3g} has mean loss {means[j]:.5g}, not below "
                f"{best_before:.5g} at the smaller budget {compute[groups[k][0]]:.3g}"
            )
    if problems:
        raise LadderInputError(
            "the losses do not decrease with compute, so no power law describes them: "
            + "; ".join(problems)
            + ". Check those rungs' hyperparameters (learning-rate "
            "check) and data before fitting"
        )


def check_fixed_e(fixed_e: float | None, smallest_loss: float) -> None:
    """Refuse a fixed E that is not below every measured loss (None: E is fitted, nothing to check)."""
    if fixed_e is not None and fixed_e >= smallest_loss:
        raise LadderInputError(
            f"fixed_e={fixed_e} is not below the smallest loss {smallest_loss:.5g}: E is the loss "
            "no amount of compute removes, so it must be lower than every measured loss"
        )
