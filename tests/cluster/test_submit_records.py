"""What `marin submit` tells Ray about a run, and the submitted driver's check that it ran its plan, without a
cluster: the describe step, the job's metadata, submit ids, and `python -m marin.cluster.driver` on the local
backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marin.cluster import jobs
from marin.cluster.submit import describe, job_metadata, split_args

DEMO = Path(__file__).parent / "demo_repo"


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(DEMO, repo)
    (tmp_path / "counters").mkdir()
    monkeypatch.setenv("DEMO_COUNTER_DIR", str(tmp_path / "counters"))
    monkeypatch.setenv("MARIN_ISSUE_REPO", "lab/marin")
    monkeypatch.delenv("DEMO_GATE", raising=False)
    return repo / "exp14_submit_demo.py"


def test_the_issue_flag_reaches_the_description_and_the_jobs_metadata(demo: Path, tmp_path: Path) -> None:
    argv = [str(demo), "--issue", "owner/repo#7", "--prefix", str(tmp_path / "p"), "--lease-timeout-s", "5",
            "--no-wait"]
    ns, flags = split_args(argv)
    assert ns.no_wait and flags == ["--issue", "owner/repo#7", "--prefix", str(tmp_path / "p"),
                                    "--lease-timeout-s", "5"]
    described = describe(demo, flags)
    assert described.issue == "owner/repo#7"  # not the script's own lab/marin#14
    meta = job_metadata(described, "20261206-000000-0a1b2c3d", jobs.RUN, "exp14_submit_demo.py", flags)
    assert meta["marin_issue"] == "owner/repo#7"
    assert json.loads(meta["marin_flags"]) == flags
    assert meta["marin_prefix"] == str(tmp_path / "p") and meta["marin_submit"] == "20261206-000000-0a1b2c3d"
    assert all(isinstance(v, str) for v in meta.values())  # Ray keeps string metadata only
    assert describe(demo, ["--prefix", str(tmp_path / "p")]).issue == "lab/marin#14"  # the script's default


def test_every_submit_gets_a_submission_id_never_used_before() -> None:
    ids = {jobs.submission_id("exp-1a2b3c4d", jobs.new_submit_id(now=0.0), 1) for _ in range(2000)}
    assert len(ids) == 2000  # the same second, the same experiment: still 2000 different ids
    assert all(i.startswith("marin-exp-1a2b3c4d-19700101-000000-") and i.endswith("-1") for i in ids)


def _driver(
    script: Path, prefix: Path, job: str, experiment: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MARIN_JOB_SUBMISSION_ID": job, "MARIN_SUBMIT_EXPERIMENT": experiment,
           "MARIN_TRACKER": "local"}
    return subprocess.run(
        [sys.executable, "-m", "marin.cluster.driver", str(script), "--prefix", str(prefix), "--backend",
         "local", *flags],
        env=env, cwd=script.parent, capture_output=True, text=True, timeout=300,
    )


def test_a_driver_that_runs_its_plan_records_its_job_and_keeps_its_exit_code(
    demo: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "p"
    experiment = describe(demo, ["--prefix", str(prefix)]).experiment_id
    done = _driver(demo, prefix, "marin-x-1", experiment)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((prefix / "experiments" / f"{experiment}.json").read_text())["runs"]
    assert [(r["job"], r["status"]) for r in runs] == [("marin-x-1", "SUCCESS")]
    again = _driver(demo, prefix, "marin-x-2", experiment)  # every step skipped: the plan still ran
    assert again.returncode == 0, again.stderr[-3000:]
    dry = _driver(demo, tmp_path / "dry", "marin-x-3", experiment, "--dry-run")  # writes nothing by design
    assert dry.returncode == 0, dry.stderr[-3000:]


def test_a_driver_that_exits_before_its_plan_is_a_failure(demo: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    experiment = describe(demo, ["--prefix", str(prefix)]).experiment_id
    quitter = demo.with_name("exp14_submit_quits.py")
    main = 'if __name__ == "__main__":'
    text = demo.read_text().replace(main, f"raise SystemExit(0)\n{main}")
    quitter.write_text(text)
    done = _driver(quitter, prefix, "marin-x-1", experiment)
    assert done.returncode == jobs.NO_PLAN_EXIT
    assert "job marin-x-1 exited 0 without starting the plan of experiment" in done.stderr
    assert f"{prefix}/experiments/{experiment}.json" in done.stderr and "Fix:" in done.stderr
    assert not (prefix / "experiments").exists()
    other = _driver(demo, prefix, "marin-x-2", "exp14_submit_demo-00000000")  # ran, but another experiment
    assert other.returncode == jobs.NO_PLAN_EXIT, other.stderr[-3000:]
    assert "exp14_submit_demo-00000000" in other.stderr


def test_a_driver_whose_steps_fail_or_that_was_lost_is_never_mistaken_for_a_no_op() -> None:
    def row(status: str, code: int | None, error: str | None = None) -> jobs.JobRow:
        return jobs.JobRow("marin-e-s-1", "e", jobs.RUN, "s", 1, status, "", "", "", None, None, error, "",
                           code, {})

    assert jobs.exit_code(row("FAILED", jobs.NO_PLAN_EXIT)) == 4 and not row("FAILED", 4).driver_lost
    assert jobs.exit_code(row("FAILED", 1)) == 1 and not row("FAILED", 1).driver_lost
    assert jobs.exit_code(row("FAILED", 137)) == 3 and row("FAILED", 137).driver_lost
    assert row("FAILED", None, "JOB_SUPERVISOR_ACTOR_DIED").driver_lost
    assert jobs.exit_code(row("SUCCEEDED", 0)) == 0
