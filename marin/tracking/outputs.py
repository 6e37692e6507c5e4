"""Key results of a step, read from the files its function wrote (see docs/formats.md, "Trainer outputs").

Only what a status comment shows: the W&B run (``wandb.json``), the last training loss (the tail of
``metrics.jsonl``, never the whole file), per-domain bits per byte (``eval.json``), the interruption ledger
and the health alerts (``alerts.jsonl``, ``watch.json``). Missing files are
normal (most steps are not trainers); unreadable ones are reported in ``problems`` and shown as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import fsspec

from marin import jsonio
from marin.errors import CorruptFileError
from marin.status.alerts import Alert, read_alerts
from marin.status.interruptions import ledger_lines
from marin.storage.fs import storage_on

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


def _json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    """`marin.jsonio.read_json` on the step's filesystem: None when the file is absent (normal: most steps
    are not trainers), `CorruptFileError` when it is not JSON."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return jsonio.read_json(storage_on(fs, protocol), path)


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


def _wandb(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    wandb = _json(fs, f"{root}/wandb.json")
    if wandb is None:
        return {}
    values = {"wandb_url": wandb.get("url") or None}
    if values["wandb_url"] is None and wandb.get("run_id"):
        values["wandb_label"] = f"{wandb.get('mode', 'offline')} {wandb['run_id']}"
    return values


def _loss(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    found = _last_loss(fs, f"{root}/metrics.jsonl")
    return {} if found is None else {"final_loss": found[0], "loss_step": found[1]}


def _evaluation(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    evaluation = _json(fs, f"{root}/eval.json")
    if evaluation is None:
        return {}
    domains = evaluation.get("domains") or {}
    macro = (evaluation.get("macro") or {}).get("bpb")
    return {"bpb": {name: float(d["bpb"]) for name, d in sorted(domains.items())
                    if isinstance(d, dict) and isinstance(d.get("bpb"), int | float)},
            "macro_bpb": float(macro) if isinstance(macro, int | float) else None}


def _interruptions(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    ledger = _json(fs, f"{root}/.marin/interruptions.json")
    if ledger is None:
        return {}
    return {"interruptions": tuple(ledger_lines(ledger if isinstance(ledger, dict) else {}))}


def _alerts(output_path: str) -> dict[str, Any]:
    alerts, watch = read_alerts(output_path)  # its own reader, on the output path (missing: nothing)
    return {"alerts": tuple(alerts), "watch": watch}


def _failure(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    status = _json(fs, f"{root}/.marin/status.json")
    if status is None:
        return {}
    traceback_text = ((status.get("error") or {}).get("traceback")) or ""
    return {"failed_at": innermost_frame(traceback_text) if isinstance(traceback_text, str) else None}


class _Reader(NamedTuple):
    """One file a status comment reads: its reader, what it may raise on a malformed file, and whether a
    missing file is normal (shows nothing) or, for a reader that already treats absence as empty, an error."""

    name: str
    read: Callable[[fsspec.AbstractFileSystem, str], dict[str, Any]]
    errors: tuple[type[Exception], ...]
    missing_ok: bool = True


_READERS = (
    _Reader("wandb.json", _wandb, (OSError, ValueError, AttributeError)),
    _Reader("metrics.jsonl", _loss, (OSError, ValueError)),
    _Reader("eval.json", _evaluation, (OSError, ValueError, AttributeError)),
    _Reader(".marin/interruptions.json", _interruptions,
            (OSError, ValueError, AttributeError, KeyError, TypeError)),
)
_FAILURE = _Reader(".marin/status.json", _failure, (OSError, ValueError, AttributeError))


def read_step_outputs(output_path: str, failed: bool = False) -> StepOutputs:
    """What the status comment shows for the step whose output lives at ``output_path`` (``failed``: also
    where its error was raised, from ``.marin/status.json``)."""
    fs, root = fsspec.core.url_to_fs(output_path)
    root = root.rstrip("/")
    values: dict[str, Any] = {}
    problems: list[str] = []
    # read_alerts treats a missing file as no alerts: a FileNotFoundError from it is the store's error
    alerts = _Reader("alerts.jsonl", lambda _fs, _root: _alerts(output_path), (OSError, ValueError),
                     missing_ok=False)
    for reader in (*_READERS, alerts, *([_FAILURE] if failed else [])):
        try:
            values.update(reader.read(fs, root))
        except FileNotFoundError:
            if not reader.missing_ok:
                problems.append(f"{reader.name} unreadable (FileNotFoundError)")
        except reader.errors as exc:
            # a file that is not JSON is named by its parse error (JSONDecodeError, UnicodeDecodeError)
            cause = exc.__cause__ if isinstance(exc, CorruptFileError) and exc.__cause__ is not None else exc
            problems.append(f"{reader.name} unreadable ({type(cause).__name__})")
    return StepOutputs(**values, problems=tuple(problems))
