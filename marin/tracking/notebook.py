"""The lab notebook on the issue: the hypothesis and verdict section of the status comment, and the verdict
label (`marin:worked`, `marin:did_not_work`, ...; one at a time, replacing the previous one).

The section sits between two hidden markers inside the managed status comment (marin/tracking/comment.py),
so `marin verdict` can replace it in place without re-rendering the run's table; the executor's publisher
re-renders it whole at every flush. Text from the experiment (hypothesis, notes) is neutralised for
Markdown: `<` and `>` become entities (no HTML, no comment that could end the section early), `@` mentions
are broken with a zero-width joiner, and line breaks are folded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from marin.definition.criterion import OUTCOMES
from marin.status.verdicts import deciding
from marin.tracking.base import Tracker

VERDICT_LABELS = {o: f"marin:{o}" for o in OUTCOMES}
SECTION_START, SECTION_END = "<!-- marin-notebook -->", "<!-- /marin-notebook -->"
OUTCOME_ICONS = {"worked": "✅", "did_not_work": "❌", "mixed": "🌗", "inconclusive": "❔",
                 "not_evaluated": "⏸️", "infra_failure": "🔌"}
MAX_TEXT = 1500


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """Experiment-provided text made inert in a GitHub comment (see the module docstring)."""
    s = " ".join(str(value or "").split())[:limit]
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "@\u200d")


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _criterion_line(c: Mapping[str, Any]) -> str:
    base = (c.get("baseline") or {}).get("label", "?")
    return (f"- criterion: `{text(c.get('metric'))}` {text(c.get('better'))} than `{text(base)}` by at least "
            f"{float(c.get('min_effect') or 0):g}")


def notebook_section(manifest: Mapping[str, Any] | None, verdicts: Mapping[str, Any] | None) -> list[str]:
    """The section's lines (empty when the experiment declares nothing and has no verdict)."""
    notebook = (manifest or {}).get("notebook") or {}
    current = (verdicts or {}).get("current")
    if not notebook and not current:
        return []
    lines = ["", SECTION_START, "#### Hypothesis and verdict"]
    if notebook.get("hypothesis"):
        lines.append(f"> {text(notebook['hypothesis'])}")
    lines += [_criterion_line(c) for c in notebook.get("criteria") or [] if isinstance(c, Mapping)]
    if notebook.get("tags"):
        lines.append("- tags: " + ", ".join(f"`{text(t, 40)}`" for t in notebook["tags"]))
    if notebook.get("sha256"):
        lines.append(f"- frozen {_when(notebook.get('frozen'))}, sha256 `{str(notebook['sha256'])[:12]}`")
    for amended in (manifest or {}).get("notebook_amendments") or []:
        if not isinstance(amended, Mapping):
            continue
        before = amended.get("previous") or {}
        was = "; ".join(str(c.get("metric")) + " " + str(c.get("better")) + " than " +
                        str((c.get("baseline") or {}).get("label")) + f" by at least {c.get('min_effect')}"
                        for c in before.get("criteria") or [] if isinstance(c, Mapping))
        lines.append(f"- amended {_when(amended.get('at'))} (before any verdict), was: "
                     f"{text(before.get('hypothesis'), 300)}{' — criterion: ' + text(was) if was else ''}")
    if isinstance(current, Mapping):
        outcome = str(current.get("outcome"))
        lines.append(f"\n**Verdict: {OUTCOME_ICONS.get(outcome, '')} {text(outcome)}** — by "
                     f"{text(current.get('by'), 80)}, {_when(current.get('at'))}")
        number = deciding(dict(current), (verdicts or {}).get("history") or [])
        if number:
            lines.append(f"- deciding: {text(number)}")
        if current.get("note"):
            lines.append(f"- note: {text(current['note'])}")
        earlier = [e for e in (verdicts or {}).get("history") or [] if e != current][-3:]
        if earlier:
            lines.append("- earlier: " + " · ".join(
                f"{text(e.get('outcome'))} by {text(e.get('by'), 80)} {_when(e.get('at'))}"
                for e in reversed(earlier)))
    lines.append(SECTION_END)
    return lines


def splice(body: str, section: list[str]) -> str:
    """`body` with its notebook section replaced by `section` (appended before the footer when absent)."""
    new = "\n".join(section).strip("\n")
    pattern = re.compile(re.escape(SECTION_START) + r".*?" + re.escape(SECTION_END), re.DOTALL)
    if pattern.search(body):
        return pattern.sub(lambda _: new, body, count=1)
    head, sep, footer = body.rpartition("\n<sub>Managed by marin")
    return f"{head}\n\n{new}\n{sep}{footer}" if sep else f"{body}\n\n{new}"


def set_verdict_label(tracker: Tracker, number: int, labels: set[str], outcome: str | None) -> set[str]:
    """Make `marin:{outcome}` the issue's only verdict label; returns the labels now on the issue."""
    wanted = VERDICT_LABELS.get(outcome or "")
    if wanted is None:
        return labels
    for stale in sorted(set(VERDICT_LABELS.values()) - {wanted}):
        if stale in labels:
            labels = set(tracker.remove_label(number, stale))
    if wanted not in labels:
        labels = set(tracker.add_labels(number, [wanted]))
    return labels
