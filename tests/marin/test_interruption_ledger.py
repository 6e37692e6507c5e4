"""The interruption ledger on a local prefix: entries opened at an interruption and completed by the next
attempt from the step's progress file, totals, and goodput per step and per experiment; and the train
operator's own progress file filling a real training step's entry (local backend, its worker killed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from marin.status import interruptions as il
from marin.storage.fs import storage_for

RUN = {"run_id": "run-1"}


def _progress(path: Path, **fields: object) -> None:
    (path / ".marin").mkdir(parents=True, exist_ok=True)
    (path / ".marin/progress.json").write_text(json.dumps(fields))


def test_an_interruption_of_a_training_step_records_the_checkpoint_the_redone_steps_and_the_time_lost(
    tmp_path: Path,
) -> None:
    out = tmp_path / "train-12345678"
    storage = storage_for(str(out))
    _progress(out, step=130, checkpoint_step=100, checkpoint_time=1000.0, resumed_from=None, updated=1040.0)
    il.record_interruption(
        storage,
        str(out),
        name="train",
        attempt=1,
        cause="node_died",
        hosts=["10.0.0.2"],
        started=900.0,
        ended=1050.0,
        message="node died",
        **RUN,
    )
    ledger = il.read_ledger(storage, str(out))
    [entry] = ledger["interruptions"]
    assert entry["cause"] == "node_died" and entry["hosts"] == ["10.0.0.2"] and entry["step_reached"] == 130
    assert entry["time_lost_s"] is None  # open until the next attempt ends
    assert il.event_fields(entry) == {
        "cause": "node_died",
        "hosts": ["10.0.0.2"],
        "step_reached": 130,
        "checkpoint_step": 100,
    }
    # the next attempt restored step 100 and completed its first step at t=1070
    _progress(
        out,
        step=150,
        checkpoint_step=100,
        checkpoint_time=1000.0,
        resumed_from=100,
        first_step_time=1070.0,
        updated=1090.0,
    )
    done = il.record_resume(storage, str(out), attempt=2, started=1060.0)
    assert done is not None and done["resumed_from"] == 100 and done["steps_redone"] == 30
    assert done["restart_gap_s"] == 20.0 and done["time_lost_s"] == 50.0 + 20.0
    assert il.record_resume(storage, str(out), attempt=3, started=2000.0) is None  # nothing open any more
    totals = il.read_ledger(storage, str(out))["totals"]
    assert totals == {"count": 1, "by_cause": {"node_died": 1}, "time_lost_s": 70.0, "steps_redone": 30}


def test_a_damaged_checkpoint_skipped_on_resume_counts_from_the_older_one(tmp_path: Path) -> None:
    """Interrupted at step 130 with checkpoint 100 (saved at t=1000); the next attempt finds checkpoint 100
    damaged and resumes from 50 (saved at t=900): 80 steps redone, the work since t=900 lost."""
    out = tmp_path / "train-12345678"
    storage = storage_for(str(out))
    _progress(out, step=130, checkpoint_step=100, checkpoint_time=1000.0, resumed_from=None, updated=1040.0)
    il.record_interruption(storage, str(out), name="train", attempt=1, cause="preempted", hosts=[],
                           started=800.0, ended=1050.0, **RUN)
    skipped = {"step": 100, "path": f"{out}/checkpoints/100", "error": "ValueError: OUT_OF_RANGE: ...",
               "moved_to": f"{out}/checkpoints/100.corrupt-20261206T070000Z", "resumed_from": 50,
               "resumed_time": 900.0, "steps_redone": 50}
    _progress(out, step=140, checkpoint_step=50, checkpoint_time=900.0, resumed_from=50,
              first_step_time=1070.0, updated=1090.0, checkpoint_fallbacks=[skipped])
    done = il.record_resume(storage, str(out), attempt=2, started=1060.0)
    assert done is not None and done["resumed_from"] == 50 and done["steps_redone"] == 80
    assert done["checkpoint_fallbacks"] == [skipped]
    assert done["time_lost_s"] == (1050.0 - 900.0) + 20.0
    [line] = il.ledger_lines(il.read_ledger(storage, str(out)))
    assert "attempt 2 from step 50, 80 steps redone (damaged checkpoint 100 skipped), 170.0 s lost" in line


def test_a_fallback_with_no_interruption_before_it_is_a_ledger_entry_of_its_own(tmp_path: Path) -> None:
    """A re-run (no interruption open) resumes from 50 because checkpoint 100 is damaged: one
    `checkpoint_fallback` entry with the 50 steps redone, the time they took at the attempt's pace, and the
    totals; a second report of the same attempt adds nothing, and an earlier attempt's progress file none."""
    out = tmp_path / "train-12345678"
    storage = storage_for(str(out))
    skipped = {"step": 100, "path": f"{out}/checkpoints/100", "error": "ValueError: OUT_OF_RANGE: ...",
               "moved_to": f"{out}/checkpoints/100.corrupt-20261206T070000Z", "resumed_from": 50,
               "resumed_time": 900.0, "steps_redone": 50}
    _progress(out, step=150, checkpoint_step=150, checkpoint_time=1090.0, resumed_from=50,
              first_step_time=1010.0, updated=1100.0, checkpoint_fallbacks=[skipped])
    assert il.record_fallbacks(storage, str(out), name="train", attempt=3, run_id="run-1",
                              started=1101.0) is None
    entry = il.record_fallbacks(storage, str(out), name="train", attempt=3, run_id="run-1", started=1000.0)
    assert entry is not None
    assert (entry["cause"], entry["attempt"], entry["resumed_attempt"]) == ("checkpoint_fallback", 3, 3)
    assert (entry["step_reached"], entry["resumed_from"], entry["steps_redone"]) == (100, 50, 50)
    assert entry["time_lost_s"] == 100.0 * 50 / 100 and entry["checkpoint_fallbacks"] == [skipped]
    assert il.record_fallbacks(storage, str(out), name="train", attempt=3, run_id="run-1",
                              started=1000.0) is None
    ledger = il.read_ledger(storage, str(out))
    assert [e["cause"] for e in ledger["interruptions"]] == ["checkpoint_fallback"]
    assert ledger["totals"] == {"count": 1, "by_cause": {"checkpoint_fallback": 1}, "time_lost_s": 50.0,
                                "steps_redone": 50}
    [line] = il.ledger_lines(ledger)
    assert "attempt 3 checkpoint_fallback" in line
    assert "50 steps redone (damaged checkpoint 100 skipped)" in line


def test_a_fallback_after_an_interruption_goes_to_the_entry_it_completes_not_a_second_one(
        tmp_path: Path) -> None:
    out = tmp_path / "train-12345678"
    storage = storage_for(str(out))
    _progress(out, step=130, checkpoint_step=100, checkpoint_time=1000.0, resumed_from=None, updated=1040.0)
    il.record_interruption(storage, str(out), name="train", attempt=1, cause="preempted", hosts=[],
                           started=800.0, ended=1050.0, **RUN)
    skipped = {"step": 100, "resumed_from": 50, "resumed_time": 900.0, "steps_redone": 50}
    _progress(out, step=140, checkpoint_step=50, checkpoint_time=900.0, resumed_from=50,
              first_step_time=1070.0, updated=1090.0, checkpoint_fallbacks=[skipped])
    assert il.record_fallbacks(storage, str(out), name="train", attempt=2, run_id="run-1",
                              started=1060.0) is None
    done = il.record_resume(storage, str(out), attempt=2, started=1060.0)
    assert done is not None and done["checkpoint_fallbacks"] == [skipped]
    assert [e["cause"] for e in il.read_ledger(storage, str(out))["interruptions"]] == ["preempted"]


def test_a_step_without_progress_loses_its_whole_attempt_and_the_gap(tmp_path: Path) -> None:
    out = tmp_path / "work-12345678"
    storage = storage_for(str(out))
    il.record_interruption(
        storage,
        str(out),
        name="work",
        attempt=1,
        cause="preempted",
        hosts=[],
        started=100.0,
        ended=160.0,
        **RUN,
    )
    done = il.record_resume(storage, str(out), attempt=2, started=165.0)
    assert done is not None and done["resumed_from"] is None and done["steps_redone"] is None
    assert done["time_lost_s"] == 60.0 + 5.0


def test_goodput_is_productive_time_over_wall_time_per_step_and_per_experiment(tmp_path: Path) -> None:
    storage = storage_for(str(tmp_path))
    a = str(tmp_path / "a")
    il.record_interruption(
        storage, a, name="a", attempt=1, cause="preempted", hosts=[], started=0.0, ended=30.0, **RUN
    )
    il.record_resume(storage, a, attempt=2, started=40.0)  # lost: 30 s of work + 10 s gap
    ledger = il.read_ledger(storage, a)
    status_a = {"status": "SUCCESS", "attempt": 2, "created": 0.0, "ended": 100.0}
    status_b = {"status": "SUCCESS", "attempt": 1, "created": 10.0, "ended": 60.0}
    assert il.was_interrupted(status_a) and not il.was_interrupted(status_b)
    assert il.was_interrupted({"status": "PREEMPTED", "attempt": 1})
    spans = [il.step_wall_and_lost(status_a, ledger), il.step_wall_and_lost(status_b, None)]
    assert spans == [(100.0, 40.0), (50.0, 0.0)]
    assert il.experiment_goodput(spans) == {"wall_s": 150.0, "time_lost_s": 40.0, "goodput": 110.0 / 150.0}
    assert il.step_wall_and_lost({"status": "DEP_FAILED", "created": 0.0, "ended": 5.0}, None) == (0.0, 0.0)
    assert il.experiment_goodput([])["goodput"] == 1.0
    assert il.ledger_lines(ledger) == [
        "interrupted 1970-01-01 00:00:30 UTC: attempt 1 preempted, attempt 2 from scratch, 40.0 s lost"
    ]


# The run happens in a fresh interpreter, as a user's run does, and so its worker is forked. (A fork of a
# process whose JAX runtime is already started, pytest's after the in-process trainer tests, deadlocked in the
# child's first JAX call; the local backend now spawns in such a process: tests/marin/test_start_method.py.)
RUN_KILLED_TRAIN = """
import json, sys
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.train_fns import KilledTrainConfig, train_killed_once, write_toy_cache
prefix, work = sys.argv[1], sys.argv[2]
step = Step(name="ledger/train", fn=train_killed_once, config=KilledTrainConfig(
    output_path=this_output_path(), train_cache=write_toy_cache(work + "/cache"),
    counter_file=work + "/attempts"))
result = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                        script="tests/experiment_under_test.py")
print(json.dumps({"status": result.status_of("ledger/train"), "out": result.output_path("ledger/train")}))
"""


@pytest.mark.slow
def test_a_real_training_step_killed_after_a_checkpoint_fills_its_ledger_entry(tmp_path: Path) -> None:
    """The train operator reports progress to $MARIN_PROGRESS_FILE: an attempt killed after its first
    complete checkpoint gets the checkpoint, and its successor the resume point, the steps redone and the
    time lost (from the trainer's own timestamps)."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN_KILLED_TRAIN, str(tmp_path / "prefix"), str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "SUCCESS"
    out = Path(result["out"])
    [entry] = json.loads((out / ".marin/interruptions.json").read_text())["interruptions"]
    assert entry["cause"] == "preempted" and entry["resumed_attempt"] == 2
    checkpoint = entry["checkpoint_step"]
    assert checkpoint is not None and checkpoint % 5 == 0 and entry["step_reached"] > checkpoint
    assert entry["resumed_from"] == checkpoint  # attempt 2 restored the checkpoint attempt 1 completed
    assert entry["steps_redone"] == entry["step_reached"] - checkpoint <= 5
    assert entry["attempt_started"] < entry["checkpoint_time"] < entry["when"]
    assert entry["restart_gap_s"] > 0 and entry["time_lost_s"] == pytest.approx(
        entry["when"] - entry["checkpoint_time"] + entry["restart_gap_s"]
    )
    progress = json.loads((out / ".marin/progress.json").read_text())
    assert (progress["step"], progress["checkpoint_step"], progress["resumed_from"]) == (12, 12, checkpoint)
    assert (tmp_path / "attempts").read_text().split() == ["1", "2"]


def test_a_fallback_in_an_attempt_that_is_itself_interrupted_is_in_the_ledger_exactly_once(
        tmp_path: Path) -> None:
    """A re-run (attempt 3, no interruption open) skips damaged checkpoint 100 for 50, then its driver dies:
    its worker never writes the fallback entry, so the interruption's record writes it, before the attempt's
    own entry. A second report of the same interruption, or the worker's late report, adds no second one;
    the next attempt completes the interruption entry without copying the fallbacks again."""
    out = tmp_path / "train-12345678"
    storage = storage_for(str(out))
    skipped = {"step": 100, "resumed_from": 50, "resumed_time": 900.0, "steps_redone": 50}
    _progress(out, step=150, checkpoint_step=150, checkpoint_time=1090.0, resumed_from=50,
              first_step_time=1010.0, updated=1100.0, checkpoint_fallbacks=[skipped])
    entry = il.record_interruption(storage, str(out), name="train", attempt=3, cause="driver_lost", hosts=[],
                                   started=1000.0, ended=1110.0, message="driver lost", **RUN)
    assert entry["cause"] == "driver_lost" and "checkpoint_fallbacks" not in entry
    fallback, lost = il.read_ledger(storage, str(out))["interruptions"]
    assert (fallback["cause"], fallback["attempt"]) == ("checkpoint_fallback", 3)
    assert fallback["steps_redone"] == 50
    assert fallback["checkpoint_fallbacks"] == [skipped] and fallback["time_lost_s"] == 100.0 * 50 / 100
    assert lost == entry
    assert il.record_fallbacks(storage, str(out), name="train", attempt=3, run_id="run-1",
                              started=1000.0) is None
    # the next attempt: no fallback of its own (its progress file says so); completes the driver_lost entry
    _progress(out, step=170, checkpoint_step=150, checkpoint_time=1090.0, resumed_from=150,
              first_step_time=1130.0, updated=1140.0)
    done = il.record_resume(storage, str(out), attempt=4, started=1120.0)
    assert done is not None and done["attempt"] == 3 and "checkpoint_fallbacks" not in done
    ledger = il.read_ledger(storage, str(out))
    assert [e["cause"] for e in ledger["interruptions"]] == ["checkpoint_fallback", "driver_lost"]
    assert ledger["totals"]["steps_redone"] == 50 + 0
    # an earlier attempt's progress file (written before this attempt started) adds nothing
    il.record_interruption(storage, str(out), name="train", attempt=5, cause="preempted", hosts=[],
                           started=2000.0, ended=2010.0, **RUN)
    assert [e["cause"] for e in il.read_ledger(storage, str(out))["interruptions"]] == [
        "checkpoint_fallback", "driver_lost", "preempted"]
