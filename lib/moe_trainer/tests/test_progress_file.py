"""The progress file's protocol with a hand-driven clock: a checkpoint counts only once its save is no longer
in flight, step updates are throttled, the first step and every completed checkpoint are written at once,
and a resumed invocation names its restore point (keeping the checkpoint's time from the file before)."""

from __future__ import annotations

import json
from pathlib import Path

from moe_trainer.progress import ProgressFile, read_progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_run_reports_steps_throttled_and_checkpoints_once_complete(tmp_path: Path) -> None:
    path, clock = str(tmp_path / ".marin/progress.json"), Clock()
    p = ProgressFile(path, start_step=0, every_s=2.0, clock=clock)
    assert read_progress(path) == {"step": 0, "checkpoint_step": None, "checkpoint_time": None,
                                   "resumed_from": None, "first_step_time": None, "updated": 1000.0}
    clock.now = 1001.0
    p.step_done(1, saving=False)
    assert read_progress(path)["first_step_time"] == 1001.0  # type: ignore[index]
    clock.now = 1001.5
    p.step_done(2, saving=False)
    assert read_progress(path)["step"] == 1  # type: ignore[index]  # throttled
    p.checkpoint_started(2)
    clock.now = 1002.0
    p.step_done(3, saving=True)  # the save is in flight: step 2 is not a restore point yet
    assert read_progress(path)["checkpoint_step"] is None  # type: ignore[index]
    clock.now = 1002.2
    p.step_done(4, saving=False)  # complete now: written at once, with the time of the saved state
    got = read_progress(path)
    assert got is not None and (got["step"], got["checkpoint_step"], got["checkpoint_time"]) == (4, 2, 1001.5)
    clock.now = 1003.0
    p.checkpoint_started(4)
    p.close()
    got = read_progress(path)
    assert got is not None and (got["step"], got["checkpoint_step"], got["updated"]) == (4, 4, 1003.0)


def test_a_resumed_run_names_its_restore_point(tmp_path: Path) -> None:
    path, clock = str(tmp_path / "progress.json"), Clock()
    before = {"step": 7, "checkpoint_step": 5, "checkpoint_time": 900.0}
    ProgressFile(path, start_step=5, previous=before, clock=clock)
    got = json.loads(Path(path).read_text())
    assert (got["resumed_from"], got["checkpoint_step"], got["checkpoint_time"]) == (5, 5, 900.0)
    ProgressFile(path, start_step=5, previous={"checkpoint_step": 3, "checkpoint_time": 1.0}, clock=clock)
    assert read_progress(path)["checkpoint_time"] is None  # type: ignore[index]  # not that checkpoint's
    ProgressFile(None, start_step=0)  # no path: nothing written, nothing raised
    assert read_progress(None) is None and read_progress(str(tmp_path / "none.json")) is None


def test_a_fallback_resume_names_the_older_checkpoint_its_time_and_the_skipped_ones(tmp_path: Path) -> None:
    """The previous file named checkpoint 8, which was damaged: the run resumed from 4, whose own time (from
    its meta) is reported, with the skipped checkpoint listed for the ledger."""
    path, clock = str(tmp_path / "progress.json"), Clock()
    skipped = {"step": 8, "path": "/r/checkpoints/8", "error": "ValueError: OUT_OF_RANGE: ...",
               "moved_to": "/r/checkpoints/8.corrupt-20261206T070000Z", "resumed_from": 4,
               "resumed_time": 950.0, "steps_redone": 4}
    ProgressFile(path, start_step=4, previous={"step": 9, "checkpoint_step": 8, "checkpoint_time": 990.0},
                 clock=clock, restored_time=950.0, fallbacks=[skipped])
    got = read_progress(path)
    assert got is not None
    assert (got["resumed_from"], got["checkpoint_step"], got["checkpoint_time"]) == (4, 4, 950.0)
    assert got["checkpoint_fallbacks"] == [skipped]
    ProgressFile(path, start_step=4, previous={"checkpoint_step": 4, "checkpoint_time": 949.0}, clock=clock,
                 restored_time=950.0)
    got = read_progress(path)
    assert got is not None and got["checkpoint_time"] == 949.0 and "checkpoint_fallbacks" not in got
