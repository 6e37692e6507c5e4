"""The console publisher: prints each step's state changes and, while a step runs, the newest line of its log.

The executor sends a step's stdout/stderr to ``{output_path}/.marin/logs/attempt-N.log`` (so nothing is lost
and the dashboard can show it). So that a long run is not silent, every run that prints (``executor_main``,
``marin run``; not with ``-q``/``--quiet``, not ``run_experiment(..., verbose=False)``) adds this publisher
unless one was passed (``executor_main(..., publishers=[ConsoleProgress(...)])``). It prints

    [  12.3s] RUNNING  tokenized/stdlib-1a2b3c4d
    [  14.0s]    tokenized/stdlib | tokenize:  50%|#####     | 3/6 [00:02<00:02, 1.1shard/s]
    [  17.9s] SUCCESS  tokenized/stdlib-1a2b3c4d (5.6 s)

A background thread polls the logs of running steps (local prefixes only: logs on object stores are uploaded
when an attempt ends) and prints a line when it changed, at most every ``interval_s`` per step. Progress bars
rewrite their line with carriage returns; only the newest state of the line is shown. A step that is SUCCESS
the first time it is seen was reused from an earlier run and is reported as skipped; when a step succeeds,
the last line of its log is shown if it was not yet (a data step's final counts). Live progress is what
the step prints: the trainer's progress bar (steps, steps/s, ETA, loss, tokens/s), the tokenizer's shard
counts; the engine reads none of it. Status words are coloured on a terminal (marin/colour.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from marin.colour import word
from marin.status.publisher import RunView, StepView

_TAIL_BYTES = 8192
_MAX_LINE = 160


def last_line(chunk: str) -> str | None:
    """The newest non-empty line of a log chunk, as a terminal would show it after carriage returns."""
    for line in reversed(chunk.replace("\r\n", "\n").split("\n")):
        shown = line.rstrip("\r").rsplit("\r", 1)[-1].strip()
        if shown:
            return shown if len(shown) <= _MAX_LINE else shown[: _MAX_LINE - 3] + "..."
    return None


class ConsoleProgress:
    """Publisher that narrates a run on a terminal (see the module docstring)."""

    name = "console-progress"

    def __init__(self, stream: TextIO | None = None, interval_s: float = 5.0, poll_s: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.interval_s, self.poll_s = interval_s, poll_s
        self._seen: dict[str, str] = {}
        self._running: dict[str, StepView] = {}
        self._shown: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.time()

    def _word(self, padded: str) -> str:
        return word(padded, self.stream, key=padded.strip())

    def _print(self, text: str) -> None:
        print(f"[{time.time() - self._t0:7.1f}s] {text}", file=self.stream, flush=True)

    def publish(self, run: RunView, final: bool) -> None:
        if not self._seen and not self._running:
            self._t0 = run.started
        with self._lock:
            for step in run.steps:
                self._transition(step)
        if final:
            self.close()
        elif self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="marin-console-progress", daemon=True)
            self._thread.start()

    def _transition(self, step: StepView) -> None:
        before = self._seen.get(step.hash)
        if before == step.status:
            return
        self._seen[step.hash] = step.status
        label = f"{step.name}-{step.hash[:8]}"
        if step.status == "RUNNING":
            self._running[step.hash] = step
            self._print(f"{self._word('RUNNING ')} {label} (attempt {step.attempt}, log: {step.log_path})")
            return
        self._running.pop(step.hash, None)
        if step.status == "WAITING":
            return
        if step.status == "SUCCESS" and before in (None, "WAITING"):
            self._print(f"{self._word('SKIPPED ')} {label} (succeeded in an earlier run)")
        elif step.status == "SUCCESS":
            self._show_tail(step, force=True)  # a quick step's last line: a data step's final counts
            took = f" ({step.ended - step.started:.1f} s)" if step.started and step.ended else ""
            self._print(f"{self._word('SUCCESS ')} {label}{took}")
        else:
            detail = f": {step.error_summary}" if step.error_summary else ""
            self._print(f"{self._word(f'{step.status:<8}')} {label}{detail}")
            if step.log_path:
                self._print(f"         log: {step.log_path}")

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                running = list(self._running.values())
            for step in running:
                self._show_tail(step)

    def _show_tail(self, step: StepView, force: bool = False) -> None:
        path = step.log_path
        if not path or "://" in path.replace("file://", "") or not os.path.exists(path):
            return
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - _TAIL_BYTES))
            line = last_line(f.read().decode("utf-8", errors="replace"))
        if line is None:
            return
        previous, when = self._shown.get(step.hash, ("", 0.0))
        now = time.time()
        if line != previous and (force or now - when >= self.interval_s):
            self._shown[step.hash] = (line, now)
            self._print(f"   {step.name} | {line}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


__all__ = ["ConsoleProgress", "last_line"]
