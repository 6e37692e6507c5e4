"""The managed status comment: its hidden marker and its Markdown body.

One comment per experiment (and prefix) on the linked issue, found again by the marker on its first line and
edited in place by every later run of the same experiment, so a restarted executor (which starts a new run)
updates the comment people already follow instead of adding one. The body shows the current run: a step
table (state, duration, attempts, output path, W&B link, key metrics), the failed steps with the first lines
of their error and their log path, the interruptions, the active health alerts (marin/tracking/
alerts_section.py), a dashboard link, and one line per earlier run from the manifest.

GitHub limits a comment to 65,536 characters: past ``MAX_TABLE_ROWS`` steps the table keeps the steps that
are not SUCCESS first and counts the rest, and the whole body is cut to ``MAX_BODY_CHARS``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from marin.status.publisher import RunView, StepView
from marin.tracking.alerts_section import alerts_section
from marin.tracking.notebook import notebook_section
from marin.tracking.outputs import StepOutputs
from marin.tracking.predictions import tracking_section
from marin.tracking.redact import redact

MARKER_TEMPLATE = "<!-- marin-status:{experiment_id}:{prefix8} -->"
MAX_TABLE_ROWS = 150
MAX_FAILED_SHOWN = 10
ERROR_LINES = 8
MAX_BODY_CHARS = 60_000
STATE_ICONS = {"SUCCESS": "✅", "FAILED": "❌", "RUNNING": "🔄", "WAITING": "⏳", "DEP_FAILED": "⛔",
               "PREEMPTED": "⚠️"}
RUN_LABELS = {"RUNNING": "marin:running", "SUCCESS": "marin:succeeded", "FAILED": "marin:failed"}


def marker(experiment_id: str, prefix: str) -> str:
    """The hidden first line that identifies the comment of ``experiment_id`` under ``prefix``."""
    prefix8 = hashlib.sha256(prefix.rstrip("/").encode()).hexdigest()[:8]
    return MARKER_TEMPLATE.format(experiment_id=experiment_id, prefix8=prefix8)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "—"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def _elapsed(started: float | None, ended: float | None, now: float) -> float | None:
    if started is None:
        return None
    return (ended if ended is not None else now) - started


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell rendered as code."""
    cleaned = " ".join(text.split()).replace("`", "'").replace("|", "\\|")
    return f"`{cleaned}`" if cleaned else ""


def fence(text: str) -> str:
    """A fenced code block that the text cannot close early (the fence is longer than any backtick run)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{text}\n{ticks}"


def metrics_cell(outputs: StepOutputs) -> str:
    parts = []
    if outputs.final_loss is not None:
        at = f" @ {outputs.loss_step}" if outputs.loss_step is not None else ""
        parts.append(f"loss {outputs.final_loss:.4f}{at}")
    if outputs.bpb:
        shown = sorted(outputs.bpb.items())[:6]
        more = f" +{len(outputs.bpb) - 6}" if len(outputs.bpb) > 6 else ""
        parts.append("bpb " + ", ".join(f"{cell(k)[1:-1]} {v:.3f}" for k, v in shown) + more)
    if outputs.macro_bpb is not None:
        parts.append(f"macro bpb {outputs.macro_bpb:.3f}")
    parts.extend(outputs.problems)
    return " · ".join(parts) or ""


def wandb_cell(outputs: StepOutputs) -> str:
    if outputs.wandb_url:
        return f"[run]({outputs.wandb_url})"
    return cell(outputs.wandb_label) if outputs.wandb_label else ""


def table_steps(steps: Sequence[StepView]) -> tuple[list[StepView], Counter[str]]:
    """The steps shown as rows (in DAG order; the steps that are not SUCCESS first in line for a row) and
    the states of those left out."""
    if len(steps) <= MAX_TABLE_ROWS:
        return list(steps), Counter()
    ranked = sorted(range(len(steps)), key=lambda i: (steps[i].status == "SUCCESS", i))
    keep = sorted(ranked[:MAX_TABLE_ROWS])
    kept = set(keep)
    return [steps[i] for i in keep], Counter(s.status for i, s in enumerate(steps) if i not in kept)


def _failed_section(steps: Sequence[StepView], outputs: Callable[[StepView], Any]) -> list[str]:
    """The "Failed steps" section: each failed step's error (its first ERROR_LINES), where it was raised."""
    failed = [s for s in steps if s.status == "FAILED"]
    if not failed:
        return []
    lines = ["", f"#### Failed steps ({len(failed)})"]
    for step in failed[:MAX_FAILED_SHOWN]:
        error = (step.error_summary or "no error recorded").strip().splitlines()[:ERROR_LINES]
        where = outputs(step).failed_at
        lines += ["",
                  f"**{cell(step.name)}** (attempt {step.attempt}) — log {cell(step.log_path or '—')}",
                  fence("\n".join(error + ([f"raised at {where}"] if where else [])))]
    if len(failed) > MAX_FAILED_SHOWN:
        lines.append(f"… and {len(failed) - MAX_FAILED_SHOWN} more failed steps (see the dashboard)")
    return lines


def _interruptions_section(shown: Sequence[StepView], outputs: Callable[[StepView], Any]) -> list[str]:
    """The "Interruptions" section: each interrupted step's ledger lines (the newest ERROR_LINES)."""
    interrupted = [(step, outputs(step).interruptions) for step in shown]
    interrupted = [(step, found) for step, found in interrupted if found]
    if not interrupted:
        return []
    lines = ["", f"#### Interruptions ({sum(len(found) for _, found in interrupted)})"]
    for step, found in interrupted[:MAX_FAILED_SHOWN]:
        lines += ["", f"**{cell(step.name)}**", fence("\n".join(found[-ERROR_LINES:]))]
    return lines


def render(run: RunView, *, issue_ref: str, outputs: Callable[[StepView], StepOutputs],
           manifest: Mapping[str, Any] | None = None, dashboard_url: str | None = None,
           now: float | None = None, verdicts: Mapping[str, Any] | None = None) -> str:
    """The comment body for ``run``; ``outputs`` reads a shown step's results; ``manifest`` (the experiment
    manifest, when written) gives the git commit, the user, the earlier runs and the hypothesis;
    ``verdicts`` (the experiment's verdicts.json) the verdict. The result is redacted."""
    manifest = manifest or {}
    history = [r for r in manifest.get("runs") or [] if isinstance(r, dict)]
    now = time.time() if now is None else now
    steps = list(run.steps)
    counts = Counter(s.status for s in steps)
    icon = STATE_ICONS.get(run.status, "•")
    lines = [marker(run.experiment_id, run.prefix),
             f"### {icon} Experiment `{cell(run.experiment_id)[1:-1]}` — {run.status}", ""]
    links = [f"run `{cell(run.run_id)[1:-1]}`", f"started {_when(run.started)}",
             f"{'took' if run.ended else 'running for'} {duration(_elapsed(run.started, run.ended, now))}"]
    if manifest.get("user"):
        links.append(f"by {cell(str(manifest['user']))}")
    if manifest.get("git_commit"):
        links.append(f"commit {cell(str(manifest['git_commit'])[:12])}")
    if dashboard_url:
        links.append(f"[dashboard]({dashboard_url})")
    lines.append(" · ".join(links))
    summary = " · ".join(f"{STATE_ICONS.get(k, '')} {n} {k}" for k, n in sorted(counts.items()))
    lines.append(f"{len(steps)} steps: {summary} · script {cell(run.script)} · prefix {cell(run.prefix)} · "
                 f"issue {issue_ref}")
    if run.description.strip():
        lines += ["", "> " + "\n> ".join(run.description.strip().splitlines()[:5])]
    lines += notebook_section(manifest, verdicts)  # hypothesis, criterion, verdict (tracking/notebook.py)
    shown, hidden = table_steps(steps)
    lines += ["", "| Step | State | Duration | Attempts | Output | W&B | Key metrics |",
              "|---|---|---|---|---|---|---|"]
    for step in shown:
        out = outputs(step)
        # the waiting text names resources the user chose: shown as code, so it can never mention or link
        state = cell(step.status)[1:-1]
        if step.waiting and step.status == "WAITING":
            state += f": {cell(step.waiting)}"
        lines.append(f"| {cell(step.name)} | {STATE_ICONS.get(step.status, '')} {state} | "
                     f"{duration(_elapsed(step.started, step.ended, now))} | {step.attempt} | "
                     f"{cell(step.output_path)} | {wandb_cell(out)} | {metrics_cell(out)} |")
    if hidden:
        states = ", ".join(f"{n} {k}" for k, n in sorted(hidden.items()))
        lines.append(f"| … {sum(hidden.values())} more steps ({states}): see the dashboard | | | | | | |")
    lines += _failed_section(steps, outputs)
    lines += _interruptions_section(shown, outputs)
    lines += alerts_section(shown, outputs, now)  # active health alerts, resolved ones counted
    lines += tracking_section(steps)  # "on track / off track" of steps scored against a prediction
    earlier = [r for r in history if r.get("run_id") != run.run_id][-5:]
    if earlier:
        lines += ["", "Earlier runs: " + " · ".join(
            f"`{cell(str(r.get('run_id', '?')))[1:-1]}` {r.get('status', '?')} {_when(r.get('started'))}"
            for r in reversed(earlier))]
    lines += ["", f"<sub>Managed by marin: this comment is edited in place on status changes. "
                  f"Updated {_when(now)}.</sub>"]
    body = redact("\n".join(lines))
    if len(body) > MAX_BODY_CHARS:
        body = body[:MAX_BODY_CHARS] + "\n\n… (truncated; see the dashboard)"
    return body

