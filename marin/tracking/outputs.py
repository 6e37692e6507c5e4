"""Key results of a step, read from the files its function wrote (see docs/formats.md, "Trainer outputs").

Only what a status comment shows: the W&B run (``wandb.json``), the last training loss (the tail of
``metrics.jsonl``, never the whole file), per-domain bits per byte (``eval.json``), the interruption ledger
and the health alerts (``alerts.jsonl``, ``watch.json``). Missing files are
normal (most steps are not trainers); unreadable ones are reported in ``problems`` and shown as such.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import fsspec

from marin.status.alerts import Alert, read_alerts
from marin.status.interruptions import ledger_lines

TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class StepOutputs:
    wandb_url: str | None = None
    wandb_label: str | None = None
    """Shown when there is no URL (offline runs): ``offline <run id>``."""
    final_loss: float | None = None
    loss_step: int | None = None
    bpb: dict[str, float] = field(default_factory=dict)
    macro_bpb: float | None = None
    failed_at: str | None = None
    """For a FAILED step: the innermost frame of the traceback in its status.json (``File ..., line N, in f``
    and the source line), i.e. where the error was raised."""
    problems: tuple[str, ...] = ()
    interruptions: tuple[str, ...] = ()
    """The step's interruption ledger, one line per interruption (marin/status/interruptions.py)."""
    alerts: tuple[Alert, ...] = ()
    """The step's health alerts and risk points (``alerts.jsonl``, marin/status/alerts.py), as they fired."""
    watch: dict[str, Any] | None = None
    """Its watcher's heartbeat (``watch.json``), for "the watcher is blind"."""


def _read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "rb") as handle:
        return json.loads(handle.read())


def _last_loss(fs: fsspec.AbstractFileSystem, path: str) -> tuple[float, int | None] | None:
    size = fs.size(path)
    with fs.open(path, "rb") as handle:
        start = max(0, size - TAIL_BYTES)
        handle.seek(start)
        lines = handle.read().decode("utf-8", errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first line of the tail may start mid-record
    for i, line in enumerate(reversed(lines)):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == 0:
                continue  # the trainer may be writing the last line right now
            raise
        loss = row.get("loss") if isinstance(row, dict) else None
        if isinstance(loss, int | float) and math.isfinite(loss) and "eval" not in row:
            step = row.get("step")
            return float(loss), step if isinstance(step, int) else None
    return None


def innermost_frame(traceback_text: str) -> str | None:
    """The last ``File "...", line N, in f`` line of a formatted traceback, with its source line."""
    lines = traceback_text.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith('File "'):
            source = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
            return lines[i].strip() + (f"\n    {source}" if source else "")
    return None


def _read_alerts(output_path: str, values: dict[str, Any], problems: list[str]) -> None:
    try:
        alerts, watch = read_alerts(output_path)
    except (OSError, ValueError) as exc:
        problems.append(f"alerts.jsonl unreadable ({type(exc).__name__})")
        return
    values["alerts"], values["watch"] = tuple(alerts), watch


def read_step_outputs(output_path: str, failed: bool = False) -> StepOutputs:
    """What the status comment shows for the step whose output lives at ``output_path`` (``failed``: also
    where its error was raised, from ``.marin/status.json``)."""
    fs, root = fsspec.core.url_to_fs(output_path)
    root = root.rstrip("/")
    values: dict[str, Any] = {}
    problems: list[str] = []
    try:
        wandb = _read_json(fs, f"{root}/wandb.json")
        values["wandb_url"] = wandb.get("url") or None
        if values["wandb_url"] is None and wandb.get("run_id"):
            values["wandb_label"] = f"{wandb.get('mode', 'offline')} {wandb['run_id']}"
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError) as exc:
        problems.append(f"wandb.json unreadable ({type(exc).__name__})")
    try:
        found = _last_loss(fs, f"{root}/metrics.jsonl")
        if found is not None:
            values["final_loss"], values["loss_step"] = found
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        problems.append(f"metrics.jsonl unreadable ({type(exc).__name__})")
    try:
        evaluation = _read_json(fs, f"{root}/eval.json")
        domains = evaluation.get("domains") or {}
        values["bpb"] = {name: float(d["bpb"]) for name, d in sorted(domains.items())
                         if isinstance(d, dict) and isinstance(d.get("bpb"), int | float)}
        macro = (evaluation.get("macro") or {}).get("bpb")
        values["macro_bpb"] = float(macro) if isinstance(macro, int | float) else None
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError) as exc:
        problems.append(f"eval.json unreadable ({type(exc).__name__})")
    try:
        ledger = _read_json(fs, f"{root}/.marin/interruptions.json")
        values["interruptions"] = tuple(ledger_lines(ledger if isinstance(ledger, dict) else {}))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
        problems.append(f".marin/interruptions.json unreadable ({type(exc).__name__})")
    _read_alerts(output_path, values, problems)
    if failed:
        try:
            status = _read_json(fs, f"{root}/.marin/status.json")
            traceback_text = ((status.get("error") or {}).get("traceback")) or ""
            values["failed_at"] = innermost_frame(traceback_text) if isinstance(traceback_text, str) else None
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            problems.append(f".marin/status.json unreadable ({type(exc).__name__})")
    return StepOutputs(**values, problems=tuple(problems))
