"""A comparison of runs: `compare(source, names, ...)` and its result `Comparison` (marin/compare/__init__.py
has the overview)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marin.compare.configs import StepPair, step_pairs
from marin.compare.curves import CurveSet, curve_set, metric_names
from marin.compare.runs import CompareError, Run, baseline_of, owners, resolve
from marin.compare.seeds import GroupRow, SeedGroup, group_rows, seed_groups
from marin.compare.source import Source
from marin.compare.table import Row, metric_rows, run_metrics


@dataclass(frozen=True)
class Comparison:
    prefix: str
    runs: tuple[Run, ...]
    rows: tuple[Row, ...]
    curves: tuple[CurveSet, ...]
    pairs: tuple[tuple[StepPair, ...], ...]  # per run after the first: its steps against the baseline's
    available: tuple[str, ...]  # every metric the runs log (what `metrics=` may name)
    groups: tuple[SeedGroup, ...] = ()  # the runs by configuration, seeds apart (seeds.py)
    group_rows: tuple[GroupRow, ...] = ()  # mean ± standard error across seeds per group

    @property
    def has_seed_groups(self) -> bool:
        """Some group holds more than one run: the table by seed group says something the other does not."""
        return any(len(g.members) > 1 for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "runs": [{"label": r.label, "kind": r.kind, "experiment": r.experiment,
                      "steps": [{"name": s.name, "hash": s.hash, "path": s.rel} for s in r.steps]}
                     for r in self.runs],
            "baseline": self.runs[0].label,
            "metrics": [r.to_json() for r in self.rows],
            "curves": [{"metric": c.metric, "axis": c.axis, "ema": c.ema, "downsampled": c.downsampled,
                        "missing": list(c.missing), "flops_derived": list(c.derived),
                        "series": [{"label": k.label, "points": k.points, "final": k.final,
                                    "x": list(k.xs), "y": list(k.ys)} for k in c.curves]}
                       for c in self.curves],
            "config": [{"run": self.runs[i + 1].label, "pairs": [p.to_json() for p in pairs]}
                       for i, pairs in enumerate(self.pairs)],
            "available_metrics": list(self.available),
            "seed_groups": [g.to_json() for g in self.groups],
            "group_metrics": [r.to_json() for r in self.group_rows] if self.has_seed_groups else [],
        }


def compare(source: Source, names: Sequence[str], *, metrics: Sequence[str] = ("loss",), axis: str = "step",
            ema: float | None = None, max_points: int = 400) -> Comparison:
    """Resolve `names` (the first is the baseline; one name alone is compared with its baseline experiment)
    and build the comparison. Raises CompareError for a name that means nothing or several things."""
    if not names:
        raise CompareError("name at least one run (an experiment id, step name, hash or output path)")
    owner = owners(source)
    runs = [resolve(source, n, owner) for n in names]
    if len(runs) == 1:
        only = runs[0]
        base = baseline_of(source, only.experiment, owner) if only.experiment else None
        if base is None:
            raise CompareError(f"{names[0]!r} has no baseline experiment (no criterion names one, and it "
                               "reuses no older experiment's steps); name the runs to compare: "
                               "marin compare A B")
        runs = [resolve(source, base, owner), only]
    per_run = [run_metrics(source, r) for r in runs]
    rows = metric_rows(per_run)
    groups = seed_groups(source, runs)
    curves = tuple(curve_set(source, runs, m, axis, ema=ema, max_points=max_points) for m in metrics)
    pairs = tuple(tuple(step_pairs(source, runs[0], r)) for r in runs[1:])
    return Comparison(source.prefix, tuple(runs), tuple(rows), curves, pairs,
                      tuple(metric_names(source, runs)), groups, tuple(group_rows(groups, per_run)))
