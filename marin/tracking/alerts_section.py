"""The "Alerts" section of the status comment: what is wrong right now, per step.

Each firing and resolution is also a comment of its own (marin/tracking/alerts.py); the status comment is
where someone woken at 3 a.m. looks first, so it carries the current picture: one table row per *active*
alert (a rule firing without a resolution, a failed risk point, a running step whose watcher went blind)
with its step, rule, severity, since when (training step and time), its values and what it says (a silenced
firing, not posted as a comment of its own, is shown and marked); then,
per step, how many alerts resolved (by rule) and how many risk points passed. A finished step's alert still
open in its file (its attempt crashed) is shown as "open when the attempt ended".

The alerts come from the steps' ``alerts.jsonl`` and ``watch.json`` (read with the rest of a step's outputs,
marin/tracking/outputs.py, so the publisher's cache of finished steps covers them). Everything in the files
is data: it is made inert (``<``/``>`` as entities, ``@`` mentions broken, no table-breaking ``|`` or code
spans) before it reaches the comment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from marin.status.alerts import FIRED, RISK_FAILED, RISK_PASSED, Alert, blind_alert
from marin.status.publisher import StepView
from marin.tracking.notebook import text
from marin.tracking.outputs import StepOutputs

ICONS = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
MAX_ROWS = 30
MAX_SUMMARY = 200


def _cell(value: Any, limit: int = 120) -> str:
    """Text from a step's files, inert and safe inside a table cell."""
    return text(value, limit).replace("`", "'").replace("|", "\\|")


def _since(a: Alert) -> str:
    when = datetime.fromtimestamp(a.since, UTC).strftime("%Y-%m-%d %H:%M UTC") if a.since else "?"
    return f"step {a.since_step if a.since_step is not None else '?'}, {when}"


def _values(values: Mapping[str, Any]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return "[" + ", ".join(one(x) for x in v[:4]) + (", …]" if len(v) > 4 else "]")
        return str(v)
    shown = [(k, v) for k, v in values.items() if v is not None and k not in ("action", "source")][:4]
    return " · ".join(f"{_cell(k, 40)} {_cell(one(v), 60)}" for k, v in shown) or "—"


def _active(step: StepView, out: StepOutputs, now: float) -> list[Alert]:
    found = [a for a in out.alerts if a.active]
    blind = blind_alert(out.watch, running=step.status == "RUNNING", now=now)
    return found + ([blind] if blind else [])


def _row(step: StepView, a: Alert) -> str:
    what = "risk point failed" if a.outcome == RISK_FAILED else a.severity
    note = " (open when the attempt ended)" if a.outcome == FIRED and step.status != "RUNNING" else ""
    note += " (silenced: it fired again soon after resolving, so it was not posted)" if a.silenced else ""
    return (f"| `{_cell(step.name)}` | {_cell(a.rule, 80)} | {ICONS.get(a.severity, '')} {_cell(what, 30)} | "
            f"{_since(a)} | {_values(a.values)} | {_cell(a.summary, MAX_SUMMARY)}{note} |")


def _tally(step: StepView, alerts: Sequence[Alert]) -> tuple[str | None, int]:
    """(the step's line of resolved alerts by rule and passed risk points, or None; how many resolved)."""
    resolved = Counter(a.rule for a in alerts if a.outcome == FIRED and a.resolved is not None)
    passed = sum(1 for a in alerts if a.outcome == RISK_PASSED)
    if not resolved and not passed:
        return None, 0
    parts = []
    if resolved:
        rules = ", ".join(f"{_cell(rule, 80)} {n}" for rule, n in sorted(resolved.items()))
        parts.append(f"{sum(resolved.values())} resolved ({rules})")
    if passed:
        parts.append(f"{passed} risk point{'s' if passed != 1 else ''} passed")
    return f"- `{_cell(step.name)}`: " + "; ".join(parts), sum(resolved.values())


def alerts_section(steps: Sequence[StepView], outputs: Callable[[StepView], StepOutputs],
                   now: float) -> list[str]:
    """The section's lines (empty when no shown step has an alert)."""
    active: list[tuple[StepView, Alert]] = []
    tallies: list[str] = []
    resolved = 0
    for step in steps:
        out = outputs(step)
        active += [(step, a) for a in _active(step, out, now)]
        tally, n = _tally(step, out.alerts)
        tallies += [tally] if tally else []
        resolved += n
    if not active and not tallies:
        return []
    active.sort(key=lambda sa: (SEVERITY_RANK.get(sa[1].severity, 3), -(sa[1].since or 0.0)))
    lines = ["", f"#### Alerts ({len(active)} active, {resolved} resolved)"]
    if active:
        lines += ["", "| Step | Rule | Severity | Since | Values | What |", "|---|---|---|---|---|---|"]
        lines += [_row(step, a) for step, a in active[:MAX_ROWS]]
        if len(active) > MAX_ROWS:
            lines.append(f"| … {len(active) - MAX_ROWS} more active alerts: see the dashboard's `/alerts` "
                         "| | | | | |")
    else:
        lines += ["", "No alert is active."]
    return lines + (["", *tallies] if tallies else [])
