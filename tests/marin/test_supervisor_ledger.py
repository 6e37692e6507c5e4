"""An interruption no attempt follows still counts (issue 32 item 2): the supervisor of `marin submit
--resubmit-on-driver-loss` that runs out of resubmits closes the ledger entries still open with their work
lost, and `marin status` (goodput) counts an open entry's work lost even before anyone closes it.

The supervisor's loop (marin/cluster/supervisor.py) runs here against a small hand-written Jobs client whose
drivers die mid-attempt: each writes what a real driver writes before its death (its run in the manifest,
the step RUNNING under its lease, the trainer's progress file) and is then reported lost, as Ray reports
a driver killed by a signal. The records are real files on a local prefix."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from marin.cluster import jobs
from marin.cluster.supervisor import Supervisor
from marin.execution.main import _status_rows
from marin.graph.plan import Plan
from marin.status import files as sf
from marin.status import interruptions as il
from marin.status import manifest
from marin.storage import LocalStorage
from marin.storage.lease import LeaseInfo, ProcessId

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT, SUBMIT = "exp-12345678", "20261206T000000-abcd"


def _dead_process() -> ProcessId:
    """The identity of a process of this machine that has ended (a lease of it is provably lost)."""
    child = subprocess.Popen([sys.executable, "-c", "import json; from marin.storage.lease import ProcessId; "
                              "print(json.dumps(ProcessId.current().to_dict()), flush=True)"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    process = ProcessId.parse(json.loads(child.stdout.readline()))
    child.wait()
    assert process is not None
    return process


@dataclasses.dataclass
class _Job:
    """What `JobSubmissionClient.list_jobs` returns per job (the fields marin.cluster.jobs reads)."""

    submission_id: str
    metadata: dict[str, str]
    status: str = "FAILED"
    start_time: float | None = None
    end_time: float | None = None
    error_type: str | None = None
    message: str = "driver killed"
    driver_exit_code: int | None = -9  # killed by a signal: the driver was lost
    runtime_env: dict[str, Any] = dataclasses.field(default_factory=dict)


class _DyingDrivers:
    """A Jobs client whose every driver starts the step's next attempt, checkpoints once and is killed."""

    def __init__(self, prefix: str, step_path: str) -> None:
        self.prefix, self.step_path = prefix, step_path
        self.storage = LocalStorage()
        self.jobs: list[_Job] = []
        self.t = 1000.0  # the drivers' clock: attempt n runs from t to t + 100, checkpointing at t + 60

    def list_jobs(self) -> list[_Job]:
        return list(self.jobs)

    def submit_job(self, *, submission_id: str, metadata: dict[str, str], **_: Any) -> None:
        n = int(metadata["marin_driver"])
        self.run_driver(n, submission_id)
        started = self.t - 200.0  # run_driver moved the clock on
        self.jobs.append(_Job(submission_id, metadata, start_time=started * 1000,
                              end_time=(started + 100) * 1000))

    def run_driver(self, n: int, job: str) -> None:
        """Driver n: its run in the manifest, attempt n RUNNING under its lease, the trainer's progress."""
        started, executor, run_id = self.t, f"host:{n}:dead", f"run-{n}"
        process = _dead_process()
        data = json.loads(Path(manifest.manifest_path(self.prefix, EXPERIMENT)).read_text())
        data["runs"].append({"run_id": run_id, "status": "RUNNING", "executor": executor, "job": job})
        Path(manifest.manifest_path(self.prefix, EXPERIMENT)).write_text(json.dumps(data))
        previous = sf.read_status(self.storage, self.step_path) or {"created": 1000.0}
        sf.write_status(self.storage, self.step_path, name="train", hash="h" * 64, status=sf.RUNNING,
                        attempt=n, run_id=run_id, executor=executor, previous=previous, started=started,
                        now=started + 90)
        sf.append_event(self.storage, self.step_path, sf.RUNNING, attempt=n, run_id=run_id, executor=executor)
        progress = {"step": 10 * n + 8, "checkpoint_step": 10 * n + 5, "checkpoint_time": started + 60,
                    "resumed_from": 10 * (n - 1) + 5 if n > 1 else None, "first_step_time": started + 5,
                    "updated": started + 90}
        Path(self.step_path, ".marin/progress.json").write_text(json.dumps(progress))
        lease = LeaseInfo(executor, started, started + 100, 600, n, process)  # its last heartbeat: its death
        self.storage.write_text(sf.lease_path(self.step_path), lease.to_json())
        self.t += 200.0  # the next driver starts 100 s after this one died


def _prefix(tmp_path: Path) -> tuple[str, str]:
    prefix, step_path = str(tmp_path), str(tmp_path / "train-12345678")
    Path(step_path, ".marin").mkdir(parents=True)
    Path(manifest.manifest_path(prefix, EXPERIMENT)).parent.mkdir(parents=True, exist_ok=True)
    Path(manifest.manifest_path(prefix, EXPERIMENT)).write_text(json.dumps({
        "id": EXPERIMENT, "runs": [],
        "steps": [{"name": "train", "hash": "h" * 64, "output_path": step_path}]}))
    return prefix, step_path


def test_a_supervisor_out_of_resubmits_closes_the_open_interruption_with_its_work_lost(
        tmp_path: Path) -> None:
    prefix, step_path = _prefix(tmp_path)
    client = _DyingDrivers(prefix, step_path)
    meta = {"marin_experiment": EXPERIMENT, "marin_kind": jobs.RUN, "marin_submit": SUBMIT,
            "marin_prefix": prefix}
    client.submit_job(submission_id=jobs.submission_id(EXPERIMENT, SUBMIT, 1),
                      metadata={**meta, "marin_driver": "1"})  # what `marin submit` started
    spec = {"experiment": EXPERIMENT, "submit": SUBMIT, "entrypoint": "python -m marin.cluster.driver s.py",
            "metadata": meta, "options": {}, "max_resubmits": 1}
    result = Supervisor(spec, client, {}).run()
    assert (result["status"], result["resubmits"]) == ("DRIVER_LOST", 1)

    ledger = json.loads(Path(step_path, ".marin/interruptions.json").read_text())
    first, second = ledger["interruptions"]
    # attempt 1 (1000-1100, checkpoint at 1060) was resumed by attempt 2, whose first step came at 1205:
    # 40 s of work since the checkpoint + 105 s to restart
    assert (first["attempt"], first["resumed_attempt"], first["resumed_from"]) == (1, 2, 15)
    assert first["time_lost_s"] == pytest.approx(40.0 + 105.0) and "not_resumed" not in first
    # attempt 2 (1200-1300, checkpoint at 1260): no attempt follows; closed with its work lost, 40 s
    assert (second["attempt"], second["cause"], second["resumed_attempt"]) == (2, "driver_lost", None)
    assert second["time_lost_s"] == pytest.approx(40.0)
    assert second["not_resumed"]["by"] == f"marin-supervisor-{EXPERIMENT}-{SUBMIT}"
    assert second["not_resumed"]["why"] == ("the supervisor gave up after 1 resubmission(s): "
                                           "--resubmit-on-driver-loss 1 spent")
    assert ledger["totals"]["time_lost_s"] == pytest.approx(185.0)
    status = json.loads(Path(step_path, ".marin/status.json").read_text())
    assert (status["status"], status["attempt"]) == ("PREEMPTED", 2)
    assert not Path(sf.lease_path(step_path)).exists()  # released: a later run starts at once

    # `marin status`: the step's goodput counts both, and the ledger's lines say which was not resumed
    entry = dataclasses.make_dataclass("E", ["name", "hash", "output_path", "warnings", "previous"])(
        "train", "h" * 64, step_path, [], status)  # `previous`: the status the plan read
    rows, spans = _status_rows(LocalStorage(), Plan(prefix, [entry], [], 0))  # type: ignore[list-item]
    [(wall, lost)] = spans
    assert lost == pytest.approx(185.0) and wall == pytest.approx(status["ended"] - 1000.0)
    lines = il.ledger_lines({"interruptions": rows[0]["interruptions"]})
    assert lines[1].endswith("attempt 2 driver_lost, not resumed (the supervisor gave up after 1 "
                             "resubmission(s): --resubmit-on-driver-loss 1 spent), 40.0 s lost")

    # a run after all (someone runs the experiment again): its attempt completes the entry as usual
    Path(step_path, ".marin/progress.json").write_text(json.dumps(
        {"step": 30, "checkpoint_step": 25, "checkpoint_time": 1260.0, "resumed_from": 25,
         "first_step_time": 1510.0, "updated": 1550.0}))
    done = il.record_resume(LocalStorage(), step_path, attempt=3, started=1500.0)
    assert done is not None and done["resumed_attempt"] == 3 and "not_resumed" not in done
    assert done["time_lost_s"] == pytest.approx(40.0 + 210.0)  # the restart gap now counts too


def test_an_open_entry_counts_its_work_lost_before_anyone_closes_it(tmp_path: Path) -> None:
    """An executor closed a lost attempt and nothing followed yet: `marin status` and goodput count the work
    thrown away since the last checkpoint (or the whole attempt without one), never 0."""
    storage, out = LocalStorage(), str(tmp_path / "train-12345678")
    Path(out, ".marin").mkdir(parents=True)
    Path(out, ".marin/progress.json").write_text(json.dumps(
        {"step": 18, "checkpoint_step": 15, "checkpoint_time": 1060.0, "updated": 1090.0}))
    il.record_interruption(storage, out, name="train", attempt=1, run_id="r1", cause="driver_lost", hosts=[],
                           started=1000.0, ended=1100.0)
    ledger = il.read_ledger(storage, out)
    [entry] = ledger["interruptions"]
    assert entry["time_lost_s"] is None and il.time_lost(entry) == 40.0
    status = {"status": "PREEMPTED", "attempt": 1, "created": 1000.0, "ended": 1100.0}
    assert il.step_wall_and_lost(status, ledger) == (100.0, 40.0)
    assert ledger["totals"]["time_lost_s"] == 40.0
    assert il.ledger_lines(ledger) == [
        "interrupted 1970-01-01 00:18:20 UTC: attempt 1 driver_lost, not resumed yet, "
        "40.0 s of work lost so far"]
    no_checkpoint = {**entry, "checkpoint_step": None, "checkpoint_time": None}
    assert il.work_lost(no_checkpoint) == 100.0  # all of the attempt is redone
    closed = il.close_unresumed(storage, out, at=time.time(), by="me", why="nobody will run it")
    assert [e["time_lost_s"] for e in closed] == [40.0]
    assert il.close_unresumed(storage, out, at=time.time(), by="me", why="again") == []  # closed once
