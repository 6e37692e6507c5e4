"""The run's progress file: how far training got and which checkpoint it could resume from, for whoever
schedules the run (Marin's interruption ledger reads it as ``{output_path}/.marin/progress.json``; the
engine puts the path in ``MARIN_PROGRESS_FILE`` and the train operator passes it as
``TrainConfig.progress_file``; this library knows no engine)::

    {"step": 1200, "checkpoint_step": 1000, "checkpoint_time": 1764000900.0,
     "resumed_from": 1000, "first_step_time": 1764001030.0, "updated": 1764001100.0}

- ``step``: the last completed optimizer step (its metrics were read back from the device);
- ``checkpoint_step`` / ``checkpoint_time``: the newest *complete* checkpoint and the wall time of the state
  it holds (when its save began). Saves are asynchronous: a checkpoint is reported only once orbax says no
  save is in flight any more, so a step named here is one a restart really restores;
- ``resumed_from``: the checkpoint step this invocation restored (null when it started fresh or from a warm
  start); ``first_step_time``: when this invocation completed its first step; ``updated``: when the file was
  written (a reader tells this invocation's file from a previous one's by it);
- ``checkpoint_fallbacks`` (only when this invocation skipped damaged checkpoints, resume.py): one object per
  skipped checkpoint, ``{"step", "path", "error", "moved_to", "resumed_from", "resumed_time",
  "steps_redone"}``; the ledger copies them into the interruption entry it completes.

Cost: one small JSON file, written atomically (temp + rename locally, one object on a store) at start, at
the first step, when a checkpoint becomes complete, at the end, and otherwise at most every ``every_s``
seconds (default 2 s); so ``step`` may lag the truth by that much. Only process 0 of a multi-host run
writes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from moe_trainer.jsonio import read_json, write_json_atomic


class ProgressFile:
    """Writes the progress file of one invocation of ``train`` (a no-op without a path)."""

    def __init__(
        self,
        path: str | None,
        *,
        start_step: int,
        previous: dict[str, Any] | None = None,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        restored_time: float | None = None,
        fallbacks: Sequence[dict[str, Any]] = (),
    ) -> None:
        """``restored_time``: the restored checkpoint's own wall time, used when the previous file names
        another checkpoint; ``fallbacks``: the damaged checkpoints this invocation skipped (resume.py)."""
        self.path, self.every_s, self.clock = path, every_s, clock
        resumed = start_step if start_step > 0 else None
        previous = previous or {}
        # the restored checkpoint is complete; its time is known if the previous invocation reported it
        same = resumed is not None and previous.get("checkpoint_step") == resumed
        self.state: dict[str, Any] = {
            "step": start_step,
            "checkpoint_step": resumed,
            "checkpoint_time": previous.get("checkpoint_time") if same else restored_time,
            "resumed_from": resumed,
            "first_step_time": None,
        }
        if fallbacks:
            self.state["checkpoint_fallbacks"] = list(fallbacks)
        self._pending: tuple[int, float] | None = None
        self._written = 0.0
        self._write()

    def step_done(self, step: int, saving: bool) -> None:
        """Step ``step`` completed; ``saving``: whether a checkpoint save is still in flight."""
        now = self.clock()
        self.state["step"] = step
        first = self.state["first_step_time"] is None
        if first:
            self.state["first_step_time"] = now
        if self._settle(saving) or first or now - self._written >= self.every_s:
            self._write()

    def checkpoint_started(self, step: int) -> None:
        """A save of ``step`` began (the state as of now); it counts once no save is in flight. A save
        starts only after the one before it finished, so that one is complete now."""
        if self._settle(saving=False):
            self._write()
        self._pending = (step, self.clock())

    def close(self) -> None:
        """The end of the invocation (after the last save finished): the final picture."""
        self._settle(saving=False)
        self._write()

    def _settle(self, saving: bool) -> bool:
        if self._pending is None or saving:
            return False
        self.state["checkpoint_step"], self.state["checkpoint_time"] = self._pending
        self._pending = None
        return True

    def _write(self) -> None:
        if not self.path:
            return
        self._written = self.clock()
        write_json_atomic(self.path, {**self.state, "updated": self._written})


def read_progress(path: str | None) -> dict[str, Any] | None:
    """A progress file's content, or None when there is none (or no path)."""
    if not path:
        return None
    data: dict[str, Any] | None = read_json(path)
    return data
