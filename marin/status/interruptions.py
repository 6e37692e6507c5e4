"""The interruption ledger: every attempt cut short by something other than the step's own code, with what it
cost, in `{output_path}/.marin/interruptions.json`; the attempt's PREEMPTED line in `events.jsonl` carries
the same cause, hosts and progress (the executor writes both).

An entry is written by the executor when an attempt ends as an interruption (`preempted`, `node_died`,
`driver_lost`; see marin/execution/causes.py) and completed when the next attempt of the step ends, whatever
its outcome: by then it is known where the step resumed and how long the restart took. What a step had
achieved comes from its **progress file**, `{output_path}/.marin/progress.json`, which a long-running step
(the trainer) may write - the engine knows no training, only this small protocol (docs/formats.md):

    {"step": 1200, "checkpoint_step": 1000, "checkpoint_time": 1764000900.0,
     "resumed_from": 1000, "first_step_time": 1764001030.0, "updated": 1764001100.0}

`step` is the last completed step, `checkpoint_step`/`checkpoint_time` the latest complete checkpoint,
`resumed_from` the checkpoint step this attempt restored (null when it started fresh) and `first_step_time`
when it completed its first step after starting. When the trainer skipped damaged checkpoints on resume it
adds `checkpoint_fallbacks` (step, path, error, moved_to, resumed_from, resumed_time, steps_redone each); the
entry it completes keeps them, and its time lost then runs from the older checkpoint actually resumed. A
fallback with no interruption before it (a re-run, `--force-run`, a retry after a failure) is an entry of its
own, cause `checkpoint_fallback`, written by the worker when the attempt ends (`record_fallbacks`), or,
when that attempt is itself interrupted (its worker never gets there), by `record_interruption` just before
the attempt's own entry: the steps redone and the time they took at the attempt's pace. So every fallback is
in the ledger as steps redone, exactly once. The path is in `MARIN_PROGRESS_FILE` while the step runs.

Time lost to one interruption = (interruption - last checkpoint, or - the attempt's start when there is
none: all its work is redone) + the restart gap (interruption -> the next attempt's first step, or its start
for a step that reports no progress).

An entry no next attempt completes (the supervisor of `marin submit --resubmit-on-driver-loss` ran out of
resubmits, or nobody ran the step again) is still counted: readers (`marin status`, goodput) count an open
entry's work lost so far (`work_lost`: the first term, no restart gap yet), and the supervisor that gives up
closes it in the records (`close_unresumed`: `time_lost_s` = that work, `not_resumed` = when, by whom, why).
A later attempt that does run completes it as usual (the restart gap then counts too).

Goodput of a step = (its wall time - time lost) / its wall time, wall time running from its first record
(`created` in status.json) to its last end; of an experiment, the same summed over its steps.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from marin import jsonio
from marin.definition.placeholders import join
from marin.errors import CorruptFileError
from marin.status import damaged
from marin.status import files as sf
from marin.storage.fs import Storage

PROGRESS_ENV = "MARIN_PROGRESS_FILE"


def ledger_path(output_path: str) -> str:
    return join(output_path, ".marin/interruptions.json")


def progress_path(output_path: str) -> str:
    return join(output_path, ".marin/progress.json")


def read_ledger(storage: Storage, output_path: str) -> dict[str, Any]:
    """The step's ledger to show (an unreadable one shows as empty: `marin status` and the dashboard name
    it separately)."""
    ledger = sf.read_record(storage, ledger_path(output_path)) or {"interruptions": []}
    if not isinstance(ledger.get("interruptions"), list):
        ledger["interruptions"] = []
    return ledger


def _ledger_to_update(storage: Storage, output_path: str) -> dict[str, Any]:
    """The ledger a writer adds to: an unreadable one is moved aside first (status/damaged.py) and the new
    ledger names it in `damaged`, so no entry is overwritten."""
    path = ledger_path(output_path)
    try:
        ledger = damaged.read_checked(storage, path) or {"interruptions": []}
    except CorruptFileError as e:
        moved = damaged.move_aside(storage, path)
        print(f"marin: warning: {e}\nmarin: it was moved to {moved}; a new ledger is started",
              file=sys.stderr, flush=True)
        return {"interruptions": [], "damaged": [{"moved_to": moved, "at": time.time()}]}
    if not isinstance(ledger.get("interruptions"), list):
        ledger["interruptions"] = []
    return ledger


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _totals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    by_cause: dict[str, int] = {}
    for e in entries:
        by_cause[e["cause"]] = by_cause.get(e["cause"], 0) + 1
    return {
        "count": len(entries),
        "by_cause": by_cause,
        "time_lost_s": sum(time_lost(e) for e in entries),
        "steps_redone": sum(e.get("steps_redone") or 0 for e in entries),
    }


def _write(storage: Storage, output_path: str, ledger: dict[str, Any]) -> None:
    ledger["totals"] = _totals(ledger["interruptions"])
    ledger["updated"] = time.time()
    jsonio.write_json(storage, ledger_path(output_path), ledger)


def record_interruption(
    storage: Storage,
    output_path: str,
    *,
    name: str,
    attempt: int,
    run_id: str,
    cause: str,
    hosts: list[str],
    started: float | None,
    ended: float,
    message: str = "",
) -> dict[str, Any]:
    """Append an open entry for an interrupted attempt; returns the entry (its fields go on the attempt's
    PREEMPTED event too, see `event_fields`)."""
    progress = sf.read_record(storage, progress_path(output_path)) or {}
    entry: dict[str, Any] = {
        "attempt": attempt,
        "run_id": run_id,
        "cause": cause,
        "hosts": list(hosts),
        "when": ended,
        "attempt_started": started,
        "step_reached": progress.get("step"),
        "checkpoint_step": progress.get("checkpoint_step"),
        "checkpoint_time": progress.get("checkpoint_time"),
        "resumed_from": None,
        "resumed_attempt": None,
        "steps_redone": None,
        "restart_gap_s": None,
        "time_lost_s": None,
        "message": message,
    }
    ledger = _ledger_to_update(storage, output_path)
    ledger.update({"name": name, "output_path": output_path})
    # the interrupted attempt had skipped damaged checkpoints (its own progress file says so): the worker
    # never got to record them (record_fallbacks), so they go in here, before its entry - exactly once
    fallback = None
    if started is not None and _own_fallbacks(progress, started):
        fallback = _fallback_entry(ledger, progress, attempt=attempt, run_id=run_id, started=started)
    ledger["interruptions"].extend([fallback, entry] if fallback is not None else [entry])
    _write(storage, output_path, ledger)
    return entry


def work_lost(entry: dict[str, Any]) -> float:
    """The work an interruption threw away, before any restart: its time since the last checkpoint, or since
    the attempt's start when there is none (an entry not resumed yet assumes it resumes from that
    checkpoint)."""
    since = _number(entry.get("checkpoint_time"))
    if since is None or entry.get("checkpoint_step") is None:
        since = _number(entry.get("attempt_started"))
    when = _number(entry.get("when"))
    return max(0.0, when - since) if when is not None and since is not None else 0.0


def time_lost(entry: dict[str, Any]) -> float:
    """An entry's time lost: as recorded once completed (or closed), else its work lost so far."""
    recorded = _number(entry.get("time_lost_s"))
    return recorded if recorded is not None else work_lost(entry)


def close_unresumed(storage: Storage, output_path: str, *, at: float, by: str,
                    why: str) -> list[dict[str, Any]]:
    """Close every entry no next attempt completed (call under the step's lease, when no attempt will
    follow: the supervisor gave up): `time_lost_s` = its work lost (`work_lost`), `not_resumed` = {at, by,
    why}. A later attempt still completes it (`record_resume`). Returns the entries closed."""
    ledger = _ledger_to_update(storage, output_path)
    closed = [e for e in ledger["interruptions"] if e.get("resumed_attempt") is None
              and e.get("not_resumed") is None]
    for e in closed:
        e["time_lost_s"] = work_lost(e)
        e["not_resumed"] = {"at": at, "by": by, "why": why}
    if closed:
        _write(storage, output_path, ledger)
    return closed


def event_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """What the attempt's PREEMPTED event carries of its ledger entry."""
    return {k: entry[k] for k in ("cause", "hosts", "step_reached", "checkpoint_step")}


def record_resume(
    storage: Storage, output_path: str, *, attempt: int, started: float | None
) -> dict[str, Any] | None:
    """Complete the open entry (if any) from the attempt after it, which has now ended: where it resumed,
    the restart gap, the steps redone and the time lost. Returns the completed entry, or None."""
    ledger = _ledger_to_update(storage, output_path)
    open_entries = [
        e for e in ledger["interruptions"] if e.get("resumed_attempt") is None and e["attempt"] < attempt
    ]
    if not open_entries:
        if ledger.get("damaged") and not ledger["interruptions"]:  # moved aside just now: say so in its place
            _write(storage, output_path, ledger)
        return None
    entry: dict[str, Any] = open_entries[-1]
    progress = sf.read_record(storage, progress_path(output_path)) or {}
    fresh = progress.get("updated") is not None and (_number(progress.get("updated")) or 0.0) > entry["when"]
    resumed_from = progress.get("resumed_from") if fresh else None
    first_step = _number(progress.get("first_step_time")) if fresh else None
    restart_at = first_step or started or time.time()
    entry["resumed_attempt"] = attempt
    entry.pop("not_resumed", None)  # closed when the supervisor gave up; resumed after all
    entry["resumed_from"] = resumed_from
    entry["restart_gap_s"] = max(0.0, restart_at - entry["when"])
    reached, resumed = entry.get("step_reached"), resumed_from if resumed_from is not None else 0
    if isinstance(reached, int) and isinstance(resumed, int):
        entry["steps_redone"] = max(0, reached - resumed)
    # damaged checkpoints the trainer skipped (progress.json): it resumed older than the entry's checkpoint
    fallbacks = progress.get("checkpoint_fallbacks") if fresh else None
    if isinstance(fallbacks, list) and fallbacks:
        entry["checkpoint_fallbacks"] = fallbacks
    checkpoint_time = _number(entry.get("checkpoint_time"))
    if entry.get("checkpoint_fallbacks"):
        checkpoint_time = _number(entry["checkpoint_fallbacks"][-1].get("resumed_time"))
    since = (
        checkpoint_time
        if resumed_from is not None and checkpoint_time is not None
        else entry["attempt_started"]
    )
    worked = entry["when"] - since if since is not None else 0.0
    entry["time_lost_s"] = max(0.0, worked) + entry["restart_gap_s"]
    _write(storage, output_path, ledger)
    return entry


CHECKPOINT_FALLBACK = "checkpoint_fallback"  # a ledger cause only: no attempt ends with it (causes.py)


def record_fallbacks(
    storage: Storage, output_path: str, *, name: str, attempt: int, run_id: str, started: float
) -> dict[str, Any] | None:
    """Damaged checkpoints this attempt skipped on resume (its progress file's `checkpoint_fallbacks`,
    written after `started`) when no interruption came before it: one `checkpoint_fallback` entry, with the
    steps redone and the time they took at this attempt's own pace. After an interruption the entry that
    `record_resume` completes carries them instead, so they are never counted twice. Returns the entry, or
    None. The worker calls it when an attempt ends (one read of the progress file; none is written); an
    attempt that is itself interrupted gets it from `record_interruption` instead."""
    progress = sf.read_record(storage, progress_path(output_path))
    if not _own_fallbacks(progress, started):
        return None
    assert progress is not None
    ledger = _ledger_to_update(storage, output_path)
    entry = _fallback_entry(ledger, progress, attempt=attempt, run_id=run_id, started=started)
    if entry is None:
        return None
    ledger.update({"name": name, "output_path": output_path})
    ledger["interruptions"].append(entry)
    _write(storage, output_path, ledger)
    return entry


def _own_fallbacks(progress: dict[str, Any] | None, started: float | None) -> bool:
    """The progress file names checkpoint fallbacks and was written by the attempt started at `started`."""
    fallbacks = (progress or {}).get("checkpoint_fallbacks")
    if not progress or not isinstance(fallbacks, list) or not fallbacks or started is None:
        return False
    updated = _number(progress.get("updated"))
    return updated is not None and updated >= started  # else an earlier attempt's file


def _fallback_entry(ledger: dict[str, Any], progress: dict[str, Any], *, attempt: int, run_id: str,
                    started: float) -> dict[str, Any] | None:
    """The `checkpoint_fallback` entry of the fallbacks in `progress` (this attempt's own), or None when the
    ledger has them already or will: an earlier entry still open (`record_resume` completes it with them),
    an entry this attempt completed with them, or this attempt's own fallback entry (a repeated report)."""
    entries = ledger["interruptions"]
    if any(e.get("resumed_attempt") is None and e["attempt"] < attempt for e in entries):
        return None  # record_resume completes that entry with these fallbacks
    if any(e.get("resumed_attempt") == attempt and e.get("checkpoint_fallbacks") and e["attempt"] < attempt
           for e in entries):
        return None  # record_resume did
    if any(e.get("attempt") == attempt and e.get("run_id") == run_id and e.get("cause") == CHECKPOINT_FALLBACK
           for e in entries):
        return None  # already recorded (a repeated report of this attempt)
    fallbacks = progress["checkpoint_fallbacks"]
    redone = sum(int(f.get("steps_redone") or 0) for f in fallbacks if isinstance(f, dict))
    return {
        "attempt": attempt, "run_id": run_id, "cause": CHECKPOINT_FALLBACK, "hosts": [], "when": started,
        "attempt_started": started, "step_reached": max(int(f.get("step") or 0) for f in fallbacks),
        "checkpoint_step": fallbacks[-1].get("resumed_from"),
        "checkpoint_time": fallbacks[-1].get("resumed_time"),
        "resumed_from": fallbacks[-1].get("resumed_from"), "resumed_attempt": attempt, "steps_redone": redone,
        "restart_gap_s": 0.0, "time_lost_s": _redone_time(progress, started, redone),
        "checkpoint_fallbacks": fallbacks,
        "message": f"damaged checkpoint {', '.join(str(f.get('step')) for f in fallbacks)} skipped on resume",
    }


def _redone_time(progress: dict[str, Any], started: float, redone: int) -> float:
    """The time `redone` steps took at the attempt's pace so far (its steps done over its time running); all
    of its time while it has not got past them."""
    step, resumed = progress.get("step"), progress.get("resumed_from") or 0
    spent = max(0.0, (_number(progress.get("updated")) or started) - started)
    done = step - resumed if isinstance(step, int) and isinstance(resumed, int) else 0
    return spent if done <= redone else spent * redone / done


def step_wall_and_lost(status: dict[str, Any] | None, ledger: dict[str, Any] | None) -> tuple[float, float]:
    """(wall time, time lost) of one step: wall from its first record (`created` in status.json) to its last
    end (`ended`, or `updated` while it runs); lost from its ledger (never more than the wall time)."""
    status = status or {}
    created, last = _number(status.get("created")), _number(status.get("ended") or status.get("updated"))
    if created is None or last is None or status.get("status") in (None, sf.DEP_FAILED):
        return 0.0, 0.0
    wall = max(0.0, last - created)
    lost = sum(time_lost(e) for e in (ledger or {}).get("interruptions", []))
    return wall, min(lost, wall)


def was_interrupted(status: dict[str, Any] | None) -> bool:
    """Whether a step may have a ledger, judged from its status.json (saves a read per step that has none)."""
    status = status or {}
    return status.get("status") == sf.PREEMPTED or int(status.get("attempt") or 0) > 1


def experiment_goodput(spans: list[tuple[float, float]]) -> dict[str, Any]:
    """Goodput over an experiment's steps, from each step's (wall, lost): (sum wall - sum lost) / sum wall;
    1.0 when nothing ran."""
    wall = sum(w for w, _ in spans)
    lost = sum(lo for _, lo in spans)
    return {"wall_s": wall, "time_lost_s": lost, "goodput": (wall - lost) / wall if wall else 1.0}


def ledger_lines(ledger: dict[str, Any]) -> list[str]:
    """The ledger as `marin status` prints it under its step: one line per interruption."""
    lines = []
    for e in ledger.get("interruptions", []):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["when"]))
        hosts = f" hosts={','.join(e['hosts'])}" if e.get("hosts") else ""
        resumed = ""
        if e.get("resumed_attempt") is not None:
            start = "from scratch" if e.get("resumed_from") is None else f"from step {e['resumed_from']}"
            redone = f", {e['steps_redone']} steps redone" if e.get("steps_redone") is not None else ""
            skipped = [str(f.get("step")) for f in e.get("checkpoint_fallbacks") or []]
            redone += f" (damaged checkpoint {', '.join(skipped)} skipped)" if skipped else ""
            resumed = (
                f", attempt {e['resumed_attempt']} {start}{redone}, {e.get('time_lost_s') or 0.0:.1f} s lost"
            )
        elif e.get("not_resumed"):
            resumed = f", not resumed ({e['not_resumed'].get('why')}), {time_lost(e):.1f} s lost"
        else:
            resumed = f", not resumed yet, {time_lost(e):.1f} s of work lost so far"
        lines.append(f"interrupted {when} UTC: attempt {e['attempt']} {e['cause']}{hosts}{resumed}")
    return lines
