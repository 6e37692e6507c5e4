"""Seed groups: runs whose configs differ only in their seed fields are repeats of one configuration, and the
comparison reports their mean with a standard error across seeds.

Two runs are **seed variants** when every step of one that the other lacks pairs (configs.py, the rule `marin
plan` uses for renamed steps) with a step of the other, they have as many steps, and every difference of
every pair is a seed field (a config field whose last part is `seed` or ends in `_seed`: `seed`,
`data_seed`, `overrides.init_seed`) or a dependency whose own differences are (an eval step of a train step
trained with another seed). Runs with no differing field at all are the same configuration run twice under
other names, which is no new sample, and are not grouped.

Groups are formed in the order of the runs: each run joins the first group whose first run it is a seed
variant of, else starts one. For each metric a group reports the **mean** over its runs that have it and the
**standard error** of that mean, sample standard deviation / sqrt(n) (n >= 2; a group of one run keeps the
run's own standard error, where the records give one). The difference of a group from the first group
(the baseline's) is mean - mean, with standard error sqrt(se_a^2 + se_b^2) (independent seeds).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marin.compare.configs import StepPair, step_pairs
from marin.compare.runs import Run
from marin.compare.source import Source
from marin.compare.table import Value, metric_order
from marin.graph.changes import Change


def is_seed_field(field: str) -> bool:
    last = field.rsplit(".", 1)[-1]
    return last == "seed" or last.endswith("_seed")


def _seed_only(change: Change) -> bool:
    if change.is_dependency:
        because = change.because
        return change.kind == "changed" and bool(because) and all(_seed_only(c) for c in because)
    return is_seed_field(change.field)


def seed_difference(source: Source, base: Run, other: Run) -> tuple[StepPair, ...] | None:
    """The step pairs of `other` against `base` when the two are seed variants (module docstring), else
    None."""
    if len(base.steps) != len(other.steps):
        return None
    pairs = step_pairs(source, base, other)
    shared = {r.hash for r in base.steps}
    unshared = [r for r in other.steps if r.hash not in shared]
    changes = [c for p in pairs for c in p.changes]
    if not unshared or len(pairs) != len(unshared) or not changes:
        return None
    return tuple(pairs) if all(_seed_only(c) for c in changes) else None


def _seed_values(pairs: Sequence[StepPair], side: str) -> str:
    """`seed=1, data_seed=1`: the seed fields' values on one side of the pairs (old: the base run's)."""
    found: dict[str, Any] = {}

    def walk(changes: Sequence[Change]) -> None:
        for c in changes:
            if c.is_dependency:
                walk(c.because)
            else:
                found.setdefault(c.field.rsplit(".", 1)[-1], c.old if side == "old" else c.new)

    for p in pairs:
        walk(p.changes)
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items()))


@dataclass(frozen=True)
class SeedGroup:
    """Runs (by index in the comparison) that differ only in seeds; `seeds[i]` names run `members[i]`'s."""

    members: tuple[int, ...]
    seeds: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"runs": list(self.members), "seeds": list(self.seeds)}


def seed_groups(source: Source, runs: Sequence[Run]) -> tuple[SeedGroup, ...]:
    """The runs in groups (module docstring), in the order of their first runs."""
    groups: list[tuple[list[int], list[str]]] = []
    for i, run in enumerate(runs):
        for members, seeds in groups:
            pairs = seed_difference(source, runs[members[0]], run)
            if pairs is not None:
                if not seeds[0]:
                    seeds[0] = _seed_values(pairs, "old")
                members.append(i)
                seeds.append(_seed_values(pairs, "new"))
                break
        else:
            groups.append(([i], [""]))
    return tuple(SeedGroup(tuple(m), tuple(s)) for m, s in groups)


@dataclass(frozen=True)
class GroupValue:
    mean: float
    stderr: float | None
    n: int


@dataclass(frozen=True)
class GroupRow:
    """One metric across seed groups: mean ± standard error per group, and the difference from group 0."""

    key: str
    values: tuple[GroupValue | None, ...]
    diffs: tuple[float | None, ...]
    diff_stderrs: tuple[float | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.key,
                "values": [None if v is None else {"mean": v.mean, "stderr": v.stderr, "n": v.n}
                           for v in self.values],
                "diff": list(self.diffs), "diff_stderr": list(self.diff_stderrs)}


def _group_value(values: list[Value]) -> GroupValue | None:
    if not values:
        return None
    xs = [v.value for v in values]
    if len(xs) == 1:
        return GroupValue(xs[0], values[0].stderr, 1)
    return GroupValue(statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs)), len(xs))


def group_rows(groups: Sequence[SeedGroup], per_run: Sequence[dict[str, Value]]) -> list[GroupRow]:
    """Every metric any run has, per group (eval first, then multiple choice, then training)."""
    keys = sorted({k for m in per_run for k in m}, key=metric_order)
    rows = []
    for key in keys:
        values = tuple(_group_value([x for i in g.members if (x := per_run[i].get(key)) is not None])
                       for g in groups)
        base = values[0]
        diffs: list[float | None] = []
        ses: list[float | None] = []
        for v in values:
            ok = base is not None and v is not None
            diffs.append(v.mean - base.mean if ok else None)  # type: ignore[union-attr]
            both = ok and v.stderr is not None and base.stderr is not None  # type: ignore[union-attr]
            ses.append(math.hypot(v.stderr, base.stderr) if both else None)  # type: ignore[union-attr,arg-type]
        rows.append(GroupRow(key, values, tuple(diffs), tuple(ses)))
    return rows
