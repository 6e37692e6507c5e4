"""The catalogue: every experiment under a prefix with its hypothesis and verdict, counted and filtered.

One row per experiment manifest (`experiments/*.json`): its issue, hypothesis, tags, outcome (the current
verdict of `experiments/{id}/verdicts.json`; `not_evaluated` when there is none), who decided it, the
deciding number, the baseline(s) and the date (of the verdict, else of the last run). The counts on top
follow Marin's MoE digest ("80 ideas: 16 worked, 32 did not work, ..."): every outcome, failures included,
since a published negative result is what keeps the next person from paying for it again.

`marin catalogue` (marin/tracking/catalogue_cli.py) prints it as a table, JSON or Markdown; the dashboard's
`/catalogue` page shows it. **Ranked by speedup** (`--sort speedup`, `by_speedup`): an experiment whose
criterion reads a number named `compute_multiplier` (the compute-equivalent speedup of an idea,
`operators/scaling/speedup.py`: "worth 1.21x compute") carries it as `compute_multiplier`, and the ideas with
one come first, largest first, as Marin's MoE digest ranks them; the others follow, newest first (the
dashboard's `/api/catalogue?sort=speedup` too). Markdown cells are escaped so that any text pastes into a
report as one cell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from marin.definition.criterion import OUTCOMES
from marin.status.manifest import list_manifests
from marin.status.verdicts import deciding, read_verdicts
from marin.storage.base import Storage

OUTCOME_WORDS = {"worked": "worked", "did_not_work": "did not work", "mixed": "mixed",
                 "inconclusive": "inconclusive", "not_evaluated": "not evaluated",
                 "infra_failure": "infra failure"}


@dataclass(frozen=True)
class Row:
    """One experiment in the catalogue."""

    experiment: str
    issue: str | None
    script: str | None
    hypothesis: str
    tags: tuple[str, ...]
    outcome: str
    by: str | None
    deciding: str
    baseline: str
    note: str
    date: float | None
    compute_multiplier: float | None = None
    """The idea's compute-equivalent speedup, from a criterion on a ``...compute_multiplier`` number."""


def _date(manifest: dict[str, Any], current: dict[str, Any] | None) -> float | None:
    if current and isinstance(current.get("at"), int | float):
        return float(current["at"])
    runs = [r for r in manifest.get("runs") or [] if isinstance(r, dict)]
    last = runs[-1] if runs else {}
    for value in (last.get("ended"), last.get("started"), manifest.get("created")):
        if isinstance(value, int | float):
            return float(value)
    return None


def row(manifest: dict[str, Any], doc: dict[str, Any] | None) -> Row:
    """The catalogue row of one experiment from its manifest and its verdicts.json (None: no verdict)."""
    experiment = str(manifest.get("id"))
    found = manifest.get("notebook")
    notebook: dict[str, Any] = found if isinstance(found, dict) else {}
    doc = doc if isinstance(doc, dict) else {}
    current = doc.get("current") if isinstance(doc.get("current"), dict) else None
    baselines = [str((c.get("baseline") or {}).get("label")) for c in notebook.get("criteria") or []
                 if isinstance(c, dict)]
    tags = notebook.get("tags") or []
    return Row(experiment=experiment, issue=manifest.get("issue") if isinstance(manifest.get("issue"), str)
               else None, script=manifest.get("script") if isinstance(manifest.get("script"), str) else None,
               hypothesis=str(notebook.get("hypothesis") or ""),
               tags=tuple(str(t) for t in tags if isinstance(t, str)),
               outcome=str(current.get("outcome")) if current and current.get("outcome") in OUTCOMES
               else "not_evaluated",
               by=str(current.get("by")) if current else None,
               deciding=deciding(current, doc.get("history") or []) if current else "",
               baseline="; ".join(baselines), note=str((current or {}).get("note") or ""),
               date=_date(manifest, current), compute_multiplier=_multiplier(current))


def _multiplier(current: dict[str, Any] | None) -> float | None:
    """The value of the verdict's first criterion on a number named ``compute_multiplier``."""
    for c in (current or {}).get("criteria") or []:
        if isinstance(c, dict) and str(c.get("metric", "")).endswith("compute_multiplier"):
            value = c.get("value")
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def build(storage: Storage, prefix: str) -> list[Row]:
    """Every experiment under `prefix`, newest first."""
    return newest_first([row(m, read_verdicts(storage, prefix, str(m["id"])))
                         for m in list_manifests(storage, prefix) if m.get("id")])


def newest_first(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.date or 0.0, r.experiment), reverse=True)


def by_speedup(rows: Sequence[Row]) -> list[Row]:
    """Ideas with a compute multiplier first, largest first; then the others, newest first."""
    ranked = sorted((r for r in rows if r.compute_multiplier is not None),
                    key=lambda r: (-float(r.compute_multiplier or 0.0), r.experiment))
    return ranked + newest_first([r for r in rows if r.compute_multiplier is None])


def select(rows: Sequence[Row], outcomes: Sequence[str] = (), tags: Sequence[str] = ()) -> list[Row]:
    """The rows with one of `outcomes` (all when empty) carrying every tag of `tags`."""
    unknown = [o for o in outcomes if o not in OUTCOMES]
    if unknown:
        raise ValueError(f"unknown outcome(s) {', '.join(unknown)}: use {', '.join(OUTCOMES)}")
    return [r for r in rows if (not outcomes or r.outcome in outcomes) and all(t in r.tags for t in tags)]


def counts(rows: Sequence[Row]) -> dict[str, int]:
    found = Counter(r.outcome for r in rows)
    return {o: found.get(o, 0) for o in OUTCOMES}


def headline(rows: Sequence[Row]) -> str:
    """`12 ideas: 3 worked, 4 did not work, 1 mixed, ...` (outcomes with none are left out)."""
    n = counts(rows)
    parts = [f"{v} {OUTCOME_WORDS[k]}" for k, v in n.items() if v]
    word = "idea" if len(rows) == 1 else "ideas"
    return f"{len(rows)} {word}" + (": " + ", ".join(parts) if parts else "")


def day(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d") if ts else "—"


def md_cell(text: str) -> str:
    """Text as one Markdown table cell: one line, `|` escaped, HTML and mentions inert."""
    s = " ".join(str(text).split())
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("@", "@\u200d") or "—"


def markdown(rows: Sequence[Row], title: str = "Experiment catalogue") -> str:
    """The catalogue as Markdown: a heading, the counts, and one table row per experiment."""
    lines = [f"## {md_cell(title)}", "", f"**{headline(rows)}**", "",
             "| Outcome | Experiment | Issue | Hypothesis | Deciding number | Baseline | Date |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        experiment = md_cell(r.experiment).replace("`", "")
        lines.append(f"| {OUTCOME_WORDS.get(r.outcome, r.outcome)} | `{experiment}` | "
                     f"{md_cell(r.issue or '—')} | {md_cell(r.hypothesis)} | {md_cell(r.deciding)} | "
                     f"{md_cell(r.baseline)} | {day(r.date)} |")
    return "\n".join(lines) + "\n"


def table(rows: Sequence[Row]) -> str:
    lines = [headline(rows), f"{'outcome':<14} {'date':<10} {'experiment':<36} {'issue':<24} hypothesis"]
    for r in rows:
        lines.append(f"{r.outcome:<14} {day(r.date):<10} {r.experiment[:36]:<36} "
                     f"{str(r.issue or '—')[:24]:<24} {' '.join(r.hypothesis.split())[:80]}")
        if r.compute_multiplier is not None:
            lines.append(f"{'':<14} {'':<10} worth {r.compute_multiplier:.2f}× compute")
        if r.deciding:
            lines.append(f"{'':<14} {'':<10} deciding: {r.deciding[:150]}")
    return "\n".join(lines)


def to_json(rows: Sequence[Row]) -> dict[str, Any]:
    return {"headline": headline(rows), "counts": counts(rows), "experiments": [asdict(r) for r in rows]}
