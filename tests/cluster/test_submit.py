"""`marin submit` and `marin jobs` against a real Ray head with its Jobs API, on loopback.

One cluster for the module: a head with the dashboard and no CPUs (as infra/ configures it, so a driver that
asks for a CPU cannot land there) and one worker node with two CPUs (the driver and one step). The experiment
lives in a throw-away git repository next to its step module, which is installed nowhere: whatever the workers
run came from the job's working_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fakes.ray_cluster import LocalRayCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DEMO = Path(__file__).parent / "demo_repo"
SECRET = "ghp_" + "S3cr3tT0kenForTheSubmitTest0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    bin_dir = str(Path(sys.executable).parent)
    c = LocalRayCluster(
        tmp_path_factory.mktemp("submit-cluster"),
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    try:
        c.head(num_cpus=0, dashboard=True)
        c.add_node("worker", num_cpus=2)
        yield c
    finally:
        c.shutdown()


def make_repo(tmp: Path, version: str) -> Path:
    repo = tmp / "repo"
    shutil.copytree(DEMO, repo)
    (repo / "demo_steps.py").write_text(
        (repo / "demo_steps.py").read_text().replace('VERSION = "original"', f'VERSION = "{version}"')
    )
    (repo / ".gitignore").write_text("big/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def marin(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "marin", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def demo_env(tmp: Path, **extra: str) -> dict[str, str]:
    counters = tmp / "counters"
    counters.mkdir(exist_ok=True)
    return {**os.environ, "DEMO_COUNTER_DIR": str(counters), "MARIN_TRACKER": "local", **extra}


def calls(tmp: Path, step: str) -> int:
    f = tmp / "counters" / f"{step}.calls"
    return len(f.read_text().splitlines()) if f.exists() else 0


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_submit_runs_the_experiment_with_the_code_next_to_the_script(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    version = f"edited-{time.time_ns()}"
    repo = make_repo(tmp_path, version)
    prefix = tmp_path / "prefix"
    env = demo_env(tmp_path, DEMO_SECRET=SECRET)
    out = marin(
        [
            "submit",
            str(repo / "exp14_submit_demo.py"),
            "--prefix",
            str(prefix),
            "--cluster",
            cluster.dashboard_url,
            "--env",
            "DEMO_COUNTER_DIR",
            "--secret-env",
            "DEMO_SECRET",
        ],
        env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "submitted job marin-exp14_submit_demo-" in out.stdout
    assert "issue:" in out.stdout and "status files:" in out.stdout
    assert "Running entrypoint" in out.stdout  # the driver's own output, followed until the end
    steps = sorted((prefix / "demo").iterdir())
    assert [p.name.split("-")[0] for p in steps] == ["first", "last", "slow"]
    for step in steps:
        assert (step / "version.txt").read_text() == version  # the edited module, shipped as working_dir
        assert json.loads((step / ".marin" / "status.json").read_text())["status"] == "SUCCESS"
    assert (prefix / "experiments").is_dir()
    # the sealed secret reached the driver, and is nowhere Ray or the platform shows or keeps
    assert (tmp_path / "counters" / "secret-seen.txt").read_text() == hashlib.sha256(
        SECRET.encode()
    ).hexdigest()
    for path in prefix.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    for job in client.list_jobs():
        assert SECRET not in json.dumps(job.model_dump(mode="json"), default=str)
        assert SECRET not in client.get_job_logs(job.submission_id)
    assert SECRET not in out.stdout + out.stderr


def test_a_second_submission_of_a_live_experiment_attaches(cluster: LocalRayCluster, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "attach")
    prefix, gate = tmp_path / "prefix", tmp_path / "gate"
    env = demo_env(tmp_path, DEMO_GATE=str(gate))
    args = [
        "submit",
        str(repo / "exp14_submit_demo.py"),
        "--prefix",
        str(prefix),
        "--cluster",
        cluster.dashboard_url,
        "--env",
        "DEMO_COUNTER_DIR",
        "--env",
        "DEMO_GATE",
        "--no-wait",
    ]
    first = marin(args, env)
    assert first.returncode == 0, first.stderr[-3000:]
    wait_for(lambda: calls(tmp_path, "slow") == 1, 300, "the slow step to start")
    second = marin(args, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "attached to the live job" in second.stdout
    job = first.stdout.split("submitted job ")[1].split()[0]
    assert job in second.stdout
    gate.write_text("go")
    listing = marin(["jobs", "list", "--cluster", cluster.dashboard_url], env)
    assert listing.returncode == 0 and job in listing.stdout
    follow = marin(["jobs", "logs", job, "--follow", "--cluster", cluster.dashboard_url], env)
    assert follow.returncode == 0
    wait_for(lambda: calls(tmp_path, "last") == 1, 300, "the last step")
    assert (calls(tmp_path, "first"), calls(tmp_path, "slow"), calls(tmp_path, "last")) == (1, 1, 1)
    from ray.job_submission import JobSubmissionClient

    listed = JobSubmissionClient(cluster.dashboard_url).list_jobs()
    experiment = next(j.metadata["marin_experiment"] for j in listed if j.submission_id == job)
    # this test's runs: the module's other tests submit the same experiment (same id) to other prefixes
    runs = [j for j in listed if (j.metadata or {}).get("marin_experiment") == experiment
            and str(prefix) in (j.entrypoint or "") and not j.submission_id.endswith("-supervisor")]
    assert len(runs) == 1


def _driver_process(script_name: str) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "marin.cluster.driver" in cmd and any(c.endswith(script_name) for c in cmd):
            return proc
    raise LookupError(f"no driver process running {script_name}")


def test_a_killed_driver_is_replaced_and_only_the_interrupted_step_reruns(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "resubmit")
    (repo / "exp14_submit_demo.py").rename(repo / "exp14_submit_resubmit.py")
    prefix, gate = tmp_path / "prefix", tmp_path / "gate"
    env = demo_env(tmp_path, DEMO_GATE=str(gate))
    out = marin(
        [
            "submit",
            str(repo / "exp14_submit_resubmit.py"),
            "--prefix",
            str(prefix),
            "--lease-timeout-s",
            "3",
            "--cluster",
            cluster.dashboard_url,
            "--env",
            "DEMO_COUNTER_DIR",
            "--env",
            "DEMO_GATE",
            "--resubmit-on-driver-loss",
            "2",
            "--no-wait",
        ],
        env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wait_for(lambda: calls(tmp_path, "slow") == 1, 300, "the slow step to start")
    driver = _driver_process("exp14_submit_resubmit.py")
    driver.send_signal(signal.SIGKILL)
    wait_for(lambda: calls(tmp_path, "slow") == 2, 300, "the replacement driver to re-run the slow step")
    gate.write_text("go")
    wait_for(lambda: calls(tmp_path, "last") == 1, 300, "the last step")
    assert (calls(tmp_path, "first"), calls(tmp_path, "slow"), calls(tmp_path, "last")) == (1, 2, 1)
    manifest_file = next((prefix / "experiments").glob("exp14_submit_resubmit-*.json"))
    wait_for(
        lambda: json.loads(manifest_file.read_text())["runs"][-1]["status"] == "SUCCESS",
        120,
        "the replacement run to end",
    )
    manifest = json.loads(manifest_file.read_text())
    assert [i["cause"] for i in manifest["interruptions"]] == ["driver_lost"]
    assert [r["status"] for r in manifest["runs"]] == ["DRIVER_LOST", "SUCCESS"]
    # The supervisor closed the lost attempt when it detected the loss, before it resubmitted: under the
    # slow step's lease (taken over from the dead driver), PREEMPTED driver_lost with a ledger entry, all
    # before the replacement run started; the replacement's attempt 2 then completed the entry.
    [slow_dir] = prefix.glob("demo/slow-*")
    events = [json.loads(line) for line in (slow_dir / ".marin/events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("RUNNING", 1), ("LEASE_TAKEOVER", 2), ("PREEMPTED", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    takeover, preempted = events[1], events[2]
    assert preempted["executor"].startswith("marin-supervisor-exp14_submit_resubmit-")
    assert takeover["executor"] == preempted["executor"]
    assert takeover["previous_owner"] == manifest["runs"][0]["executor"] == preempted["lost_executor"]
    assert preempted["cause"] == "driver_lost" and preempted["run_id"] == manifest["runs"][0]["run_id"]
    assert preempted["ts"] < manifest["runs"][1]["started"]  # closed before the new driver's run began
    [entry] = json.loads((slow_dir / ".marin/interruptions.json").read_text())["interruptions"]
    assert (entry["cause"], entry["attempt"], entry["resumed_attempt"]) == ("driver_lost", 1, 2)
    assert f"detected by {preempted['executor']}" in entry["message"] and entry["time_lost_s"] > 0


def test_a_working_tree_over_the_limit_is_refused_before_any_upload(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "big")
    (repo / "data.bin").write_bytes(os.urandom(3 * 2**20))
    (repo / "big").mkdir()
    (repo / "big" / "ignored.bin").write_bytes(os.urandom(3 * 2**20))  # .gitignore'd: not counted
    env = demo_env(tmp_path, RAY_max_grpc_message_size=str(2 * 2**20))
    out = marin(
        ["submit", str(repo / "exp14_submit_demo.py"), "--cluster", "http://127.0.0.1:9"], env, timeout=120
    )
    assert out.returncode == 2
    assert "over Ray's package limit of 2.0 MiB; nothing was uploaded" in out.stderr
    assert "data.bin" in out.stderr and "ignored.bin" not in out.stderr


def _submitted_job(out: subprocess.CompletedProcess[str]) -> str:
    return out.stdout.split("submitted job ")[1].split()[0]


def test_a_supervised_resubmit_of_an_ended_experiment_runs_it_and_follows_only_its_own_jobs(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """Issue 32: with an ended run job of the experiment on the cluster (an earlier submit to another prefix),
    `--resubmit-on-driver-loss` took that job for its own driver, ran nothing and exited 0. A job deleted with
    `ray job delete` then had its id (and log) taken by the next submit."""
    repo = make_repo(tmp_path, "again")
    (repo / "exp14_submit_demo.py").rename(repo / "exp14_submit_again.py")
    env = demo_env(tmp_path)
    script = str(repo / "exp14_submit_again.py")
    base = ["submit", script, "--cluster", cluster.dashboard_url, "--env", "DEMO_COUNTER_DIR"]
    first = marin([*base, "--prefix", str(tmp_path / "one"), "--issue", "owner/repo#7"], env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (calls(tmp_path, "first"), calls(tmp_path, "slow"), calls(tmp_path, "last")) == (1, 1, 1)
    old_job = _submitted_job(first)
    # --issue reaches submit's issue line, the job's record and `marin jobs list` as it reaches the run
    assert "  issue: owner/repo#7\n" in first.stdout
    manifest = json.loads(next((tmp_path / "one" / "experiments").glob("*.json")).read_text())
    assert manifest["issue"] == "owner/repo#7"
    listing = marin(["jobs", "list", "--cluster", cluster.dashboard_url], env)
    [row] = [line for line in listing.stdout.splitlines() if line.startswith(old_job)]
    assert "owner/repo#7" in row.split()

    second = marin([*base, "--prefix", str(tmp_path / "two"), "--resubmit-on-driver-loss", "1"], env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert (calls(tmp_path, "first"), calls(tmp_path, "slow"), calls(tmp_path, "last")) == (2, 2, 2)
    for step in sorted((tmp_path / "two" / "demo").iterdir()):
        assert json.loads((step / ".marin" / "status.json").read_text())["status"] == "SUCCESS"
    assert old_job not in second.stdout  # neither its log replayed nor its end reported
    supervisor = _submitted_job(second)
    ended = second.stdout.split("marin submit: job ")[1].split()[0]
    assert ended != old_job and ended.startswith(supervisor.removesuffix("supervisor"))

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    meta = client.get_job_info(old_job).metadata
    assert meta["marin_issue"] == "owner/repo#7" and json.loads(meta["marin_flags"]) == [
        "--prefix", str(tmp_path / "one"), "--issue", "owner/repo#7"]
    client.delete_job(old_job)
    third = marin([*base, "--prefix", str(tmp_path / "one")], env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert _submitted_job(third) != old_job  # a deleted job's id is never given to a new driver
    runs = json.loads(next((tmp_path / "one" / "experiments").glob("*.json")).read_text())["runs"]
    assert [r["job"] for r in runs] == [old_job, _submitted_job(third)]  # each driver's record of its plan
    logs = marin(["jobs", "logs", old_job, "--cluster", cluster.dashboard_url], env)
    assert logs.returncode == 2 and f"no job or experiment named {old_job!r}" in logs.stderr
