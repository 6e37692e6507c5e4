"""`marin compare`'s terminal output: the runs, the metrics table with differences, the config differences,
and each curve's final value."""

from __future__ import annotations

from typing import TYPE_CHECKING

from marin.compare.seeds import GroupValue
from marin.compare.table import Value

if TYPE_CHECKING:
    from marin.compare.comparison import Comparison


def _value(v: Value | None) -> str:
    if v is None:
        return "—"
    return f"{v.value:.4g}" + (f" ± {v.stderr:.2g}" if v.stderr is not None else "")


def _mean(v: GroupValue | None) -> str:
    if v is None:
        return "—"
    return f"{v.mean:.4g}" + (f" ± {v.stderr:.2g}" if v.stderr is not None else "")


def _diff(d: float | None, se: float | None) -> str:
    if d is None:
        return ""
    return f"({d:+.4g}" + (f" ± {se:.2g}" if se is not None else "") + ")"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))] + [
        fmt.format(*r).rstrip() for r in body]


def _group_lines(c: Comparison) -> list[str]:
    """The table by seed group (marin/compare/seeds.py), when some group holds more than one run."""
    if not c.has_seed_groups:
        return []
    lines = ["", "by seed group (mean ± standard error across seeds; differences are group - group 1):"]
    for g, group in enumerate(c.groups, start=1):
        runs = ", ".join(f"[{i}] {seeds}" if seeds else f"[{i}]"
                         for i, seeds in zip(group.members, group.seeds, strict=True))
        lines.append(f"  group {g}: {runs}")
    head = ["metric"] + [f"group {g} (n={len(gr.members)})" for g, gr in enumerate(c.groups, start=1)]
    body = [[row.key, _mean(row.values[0])]
            + [f"{_mean(v)} {_diff(d, se)}".strip() for v, d, se in
               zip(row.values[1:], row.diffs[1:], row.diff_stderrs[1:], strict=True)]
            for row in c.group_rows]
    return lines + ["  " + t for t in _table(head, body)]


def comparison_text(c: Comparison) -> str:
    lines = [f"compare under {c.prefix} (baseline: {c.runs[0].label}; differences are run - baseline)"]
    for i, r in enumerate(c.runs):
        steps = ", ".join(s.name for s in r.steps[:6]) + (" ..." if len(r.steps) > 6 else "")
        lines.append(f"  [{i}] {r.label} ({r.kind}: {steps})")
    header = ["metric"] + [f"[{i}]" for i in range(len(c.runs))]
    body = [[row.key, _value(row.values[0])]
            + [f"{_value(v)} {_diff(d, se)}".strip() for v, d, se in
               zip(row.values[1:], row.diffs[1:], row.diff_stderrs[1:], strict=True)]
            for row in c.rows]
    lines += ["", "metrics:"] + (["  " + t for t in _table(header, body)] if body else ["  (none recorded)"])
    lines += _group_lines(c)
    for curve in c.curves:
        smooth = f", EMA {curve.ema:g}" if curve.ema else ""
        lines.append(f"\ncurve {curve.metric} by {curve.axis}{smooth}: " + "; ".join(
            f"{k.label} final {k.final:.4g} over {k.points} points" if k.final is not None else k.label
            for k in curve.curves))
        lines.extend(f"  (no curve: {m})" for m in curve.missing)
        lines.extend(f"  (FLOPs of {d} derived from its train_config.json: not logged by the run)"
                     for d in curve.derived)
    for i, pairs in enumerate(c.pairs, start=1):
        lines.append(f"\nconfig [{i}] {c.runs[i].label} vs [0] {c.runs[0].label}:")
        if not pairs:
            lines.append("  no step of it pairs with a baseline step running the same function")
        for p in pairs:
            lines.append(f"  {p.other.name} vs {p.base.name}:")
            lines.extend(f"    {ch.describe()}" for ch in p.changes)
            if not p.changes:
                lines.append("    no field differs")
    return "\n".join(lines)
