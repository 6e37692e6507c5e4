"""The console progress publisher: state changes, skipped steps, and the newest line of a running step's
log."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from marin.status.console import ConsoleProgress, last_line
from marin.status.publisher import RunView, StepView


def test_last_line_shows_what_a_terminal_would() -> None:
    assert last_line("loading\nstep 1/3\rstep 2/3\rstep 3/3\r") == "step 3/3"
    assert last_line("first\nsecond\n\n   \n") == "second"
    assert last_line("\r\n\r\n") is None
    assert last_line("x" * 500).endswith("...") and len(last_line("x" * 500) or "") == 160


def view(steps: list[StepView], status: str = "RUNNING") -> RunView:
    return RunView("exp-1", "run-1", "script.py", "", None, "/p", status, time.time(), None, tuple(steps))


def step(name: str, status: str, log: str | None = None, started: float | None = None,
         ended: float | None = None) -> StepView:
    return StepView(name, f"{abs(hash(name)):064x}"[:64], f"/p/{name}", status, 1 if log else 0, started,
                    ended,
                    "ValueError: boom" if status == "FAILED" else None, log, ())


def test_console_progress_narrates_a_run(tmp_path: Path) -> None:
    out = io.StringIO()
    log = tmp_path / "attempt-1.log"
    log.write_text("tokenize:  10%|#         | 1/10\r")
    progress = ConsoleProgress(stream=out, interval_s=0.0, poll_s=0.01)
    progress.publish(view([step("old", "SUCCESS"), step("work", "RUNNING", str(log))]), final=False)
    with open(log, "a") as f:
        f.write("tokenize:  90%|######### | 9/10\r")
    deadline = time.time() + 5
    while "9/10" not in out.getvalue() and time.time() < deadline:
        time.sleep(0.02)
    progress.publish(view([step("old", "SUCCESS"), step("work", "SUCCESS", str(log), 10.0, 12.5),
                           step("bad", "FAILED", str(tmp_path / "bad.log"))], "FAILED"), final=True)
    text = out.getvalue()
    assert "SKIPPED  old-" in text and "succeeded in an earlier run" in text
    assert "RUNNING  work-" in text and "work | tokenize:  90%|######### | 9/10" in text
    assert "SUCCESS  work-" in text and "(2.5 s)" in text
    assert "FAILED   bad-" in text and "ValueError: boom" in text and "bad.log" in text
    assert progress._thread is not None and not progress._thread.is_alive()


def test_a_quick_step_shows_its_last_line_when_it_succeeds(tmp_path: Path) -> None:
    """A data step that ends between two polls still shows its final counts (its log's last line)."""
    out = io.StringIO()
    log = tmp_path / "attempt-1.log"
    progress = ConsoleProgress(stream=out, interval_s=3600.0, poll_s=3600.0)
    progress.publish(view([step("documents", "WAITING", str(log))]), final=False)
    progress.publish(view([step("documents", "RUNNING", str(log))]), final=False)
    log.write_text("[ingest] /p/documents: python 812 documents, prose 96 documents\n")
    progress.publish(view([step("documents", "SUCCESS", str(log), 1.0, 2.0)], "SUCCESS"), final=True)
    text = out.getvalue()
    assert "documents | [ingest] /p/documents: python 812 documents, prose 96 documents" in text
    assert text.index("[ingest]") < text.index("SUCCESS  documents-")


def test_the_old_import_path_still_works_and_warns() -> None:
    import importlib
    import sys

    sys.modules.pop("experiments.common.progress", None)
    old = importlib.import_module("experiments.common.progress")
    with pytest.warns(DeprecationWarning, match="marin.status.console") as caught:
        moved = (old.ConsoleProgress, old.last_line)
    assert moved == (ConsoleProgress, last_line)
    # each warning points at the line that used the old name (here), which the default filters show
    assert len(caught) == 2 and {w.filename for w in caught} == {__file__}
