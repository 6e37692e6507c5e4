"""Checks on a ladder's measurements before anything is fitted: what the fitter refuses, and why.

A forecast from bad inputs is worse than none, so the fitter reports (raises :class:`LadderInputError`,
a ``ValueError``) instead of fitting when

- the arrays are empty or of different lengths;
- a compute, parameter count, token count or loss is not finite, or not positive (the fit is on log L);
- fewer than ``min_budgets`` distinct budgets are present (three are the minimum for an offset power law,
  which has three parameters: E, A and alpha);
- runs of one budget differ by more than 15% (``ISOFLOP_SPREAD``): an IsoFLOP sweep, not seeds; the message
  points to ``fit_surface``;
- the losses do not decrease with compute: the mean loss of each budget (over its seeds) must be below the
  mean of every smaller budget. A ladder whose larger rung is no better than a smaller one is mistuned or
  broken; extrapolating it would only hide that.

Every message names the offending entries (index, budget, value; at most ``SHOWN`` of them, then a count)
and says what to do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

SHOWN = 3
"""A refusal names at most this many offending entries, then how many more there are."""
ISOFLOP_SPREAD = 0.15
"""Runs of one budget whose losses differ by more than this fraction are not seeds of one configuration but
different configurations (an IsoFLOP sweep: Porian et al.'s budgets span 25-36% below 2e17): the seeds of
one rung of the real CPU ladders differed by at most 7.2% at any evaluated fraction (docs/benchmarks/runs)."""


class LadderInputError(ValueError):
    """The ladder's measurements cannot be fitted; the message names the entries and the fix."""


def shown(items: list[str], sep: str = "; ") -> str:
    """At most ``SHOWN`` of ``items``, then a count of the rest (a refusal stays a few lines long)."""
    head = sep.join(items[:SHOWN])
    return head if len(items) <= SHOWN else f"{head}{sep}and {len(items) - SHOWN} more ({len(items)} in all)"


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
        entries = shown([f"[{i}]={float(arr[i])!r}" for i in bad], ", ")
        raise LadderInputError(
            f"{name} has non-finite values at {entries}: a diverged or unfinished run "
            "cannot be fitted; re-run or drop those rungs"
        )
    nonpos = [i for i, v in enumerate(arr) if v <= 0]
    if nonpos:
        entries = shown([f"[{i}]={float(arr[i])!r}" for i in nonpos], ", ")
        raise LadderInputError(f"{name} must be positive (the fit is on logarithms); got {entries}")
    return arr


def group_by_budget(compute: np.ndarray, rel_tol: float = 1e-6) -> list[np.ndarray]:
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
        present = shown([f"{compute[g[0]]:.3g} ({len(g)} runs)" for g in groups], ", ")
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
            + shown(problems)
            + ". Check those rungs' hyperparameters (learning-rate "
            "check) and data before fitting"
        )


def check_not_a_sweep(
    compute: np.ndarray, loss: np.ndarray, groups: list[np.ndarray], n: np.ndarray | None = None
) -> None:
    """Refuse an IsoFLOP sweep (several model sizes per budget) given to the offset law, which would read the
    sizes' differences as seed noise: runs of one budget with different parameter counts ``n`` (when given),
    or, without ``n``, whose losses differ by more than ``ISOFLOP_SPREAD``."""
    wide = []
    for g in groups:
        if n is not None and len(np.unique(n[g])) > 1:
            wide.append(f"budget {compute[g[0]]:.3g}: model sizes from {n[g].min():.3g} to {n[g].max():.3g}")
        elif len(g) > 1 and float(loss[g].max() / loss[g].min()) - 1 > ISOFLOP_SPREAD:
            wide.append(
                f"budget {compute[g[0]]:.3g}: {len(g)} runs from {loss[g].min():.4g} to {loss[g].max():.4g} "
                f"(+{loss[g].max() / loss[g].min() - 1:.0%})"
            )
    if wide:
        raise LadderInputError(
            f"{len(wide)} of {len(groups)} budgets hold several model sizes, or runs whose losses differ by "
            f"more than {ISOFLOP_SPREAD:.0%}, which seeds of one configuration do not: {shown(wide)}. "
            "This is an "
            "IsoFLOP sweep (several model sizes per budget): fit it with "
            "operators.scaling.fit_surface(n, d, loss, FitSettings(form='two_variable')), or give fit_offset "
            "one configuration per budget (e.g. each budget's best run). If these are seeds, one of them is "
            "off: re-run or drop it"
        )


def check_fixed_e(fixed_e: float | None, smallest_loss: float) -> None:
    """Refuse a fixed E that is not below every measured loss (None: E is fitted, nothing to check)."""
    if fixed_e is not None and fixed_e >= smallest_loss:
        raise LadderInputError(
            f"fixed_e={fixed_e} is not below the smallest loss {smallest_loss:.5g}: E is the loss "
            "no amount of compute removes, so it must be lower than every measured loss"
        )
