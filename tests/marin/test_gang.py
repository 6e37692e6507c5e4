"""Gang steps on a real multi-node Ray cluster on loopback (run inside scripts/netns): members on distinct
nodes with one coordinator, jax.distributed across them, a fake TPU slice placed through Ray's slice
placement group; through the executor: a node killed (or drained, then killed) mid-step is an interruption
retried in the same run and recorded in the ledger, a member raising fails the step without a retry, and a
GPU task's worker is not reused.

One cluster for the module: a head (no gang resources) and three one-CPU workers. w1 and w2 are the two
hosts of a fake v4-16 slice (TPU chips, the slice-name resource, `TPU-v4-16-head` on worker 0, the
`ray.io/tpu-*` labels); all three carry `gang_slot`. Drivers run in their own processes (one Ray each).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.marin.local_cluster import ROOT, LocalCluster, node_env, tpu_host

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("gang-cluster"))
    try:
        c.head(resources={"any_slot": 1})
        for i in (0, 1):
            c.add(
                f"w{i + 1}",
                resources={
                    **tpu_host("fake-slice-A", "v4-16", i)["resources"],  # type: ignore[dict-item]
                    "any_slot": 1,
                    "gang_slot": 1,
                },
                labels=tpu_host("fake-slice-A", "v4-16", i)["labels"],  # type: ignore[arg-type]
                env=tpu_host("fake-slice-A", "v4-16", i)["env"],
            )  # type: ignore[arg-type]
        c.add("w3", gpus=1, resources={"any_slot": 1, "gang_slot": 1})
        yield c
    finally:
        c.close()


def _start_gang(
    cluster: LocalCluster, out: Path, resources: dict[str, Any], **config: Any
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.marin.gang_runner",
            cluster.address,
            str(out),
            json.dumps(resources),
            json.dumps(config),
        ],
        cwd=ROOT,
        env=node_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


@pytest.mark.parametrize(
    ("resources", "size"),
    [
        ({"num_cpus": 0, "tpu": "v4-16"}, 2),
        ({"num_cpus": 0, "hosts": 4, "resources": {"any_slot": 1}}, 4),
    ],
    ids=["tpu-v4-16-slice-of-2", "hosts-4"],
)
def test_a_gang_brings_up_jax_distributed_across_distinct_nodes(
    cluster: LocalCluster, tmp_path: Path, resources: dict[str, Any], size: int
) -> None:
    out = tmp_path / "gang"
    result = _result(_start_gang(cluster, out, resources, use_jax=True))
    assert result["ok"], result
    ranks = _ranks(out)
    assert [r["rank"] for r in ranks] == list(range(size))
    assert len({r["node"] for r in ranks}) == size  # one member per node
    assert len({r["coordinator"] for r in ranks}) == 1 and all(r["size"] == size for r in ranks)
    assert all(r["process_count"] == size and r["ranks_seen"] == list(range(size)) for r in ranks)
    assert all(r["global_devices"] == 2 * size for r in ranks)  # 2 CPU devices per process
    if "tpu" in resources:
        assert {r["node"] for r in ranks} == {"w1", "w2"}
        assert ranks[0]["node"] == "w1"  # rank 0 is the slice's worker 0, the coordinator's host
        assert all(r["tpu_visible_chips"] == "0,1,2,3" for r in ranks)
    assert (out / ".marin/logs/attempt-1.log").exists() and (
        out / f".marin/logs/attempt-1.rank-{size - 1}.log"
    ).exists()


def test_members_still_working_when_rank_0_succeeds_are_let_finish(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Rank 0 succeeds at once while rank 1 (still starting, then writing for 3 s) has not ended: the attempt
    is a success only after rank 1 had its time to end on its own, not cancelled mid-write."""
    out = tmp_path / "gang"
    result = _result(_start_gang(cluster, out, {"num_cpus": 0, "hosts": 2, "resources": {"gang_slot": 1}},
                                 finish_s=3.0))
    assert result["ok"], result
    assert [r["rank"] for r in _ranks(out)] == [0, 1]


def _start_run(cluster: LocalCluster, prefix: Path, steps: list[dict[str, Any]],
               issue: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.marin.gang_run_runner",
            cluster.address,
            str(prefix),
            json.dumps(steps),
            *([issue] if issue else []),
        ],
        cwd=ROOT,
        env=node_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(what: str, check: Any, proc: subprocess.Popen[str], timeout: float = 300) -> Any:
    deadline = time.time() + timeout
    while not (found := check()):
        if proc.poll() is not None or time.time() > deadline:
            why = proc.communicate()[1][-3000:] if proc.poll() is not None else "timeout"
            raise AssertionError(f"{what} did not happen: {why}")
        time.sleep(0.2)
    return found


def _interrupted(prefix: Path) -> bool:
    return any('"PREEMPTED"' in p.read_text() for p in prefix.glob("g/*/.marin/events.jsonl"))


GANG_OF_2 = {"num_cpus": 0, "hosts": 2, "resources": {"gang_slot": 1}}


@pytest.mark.parametrize("drained", [False, True], ids=["hard-kill", "drain-then-kill"])
def test_a_node_lost_mid_step_is_an_interruption_retried_in_the_same_run(
    cluster: LocalCluster, tmp_path: Path, drained: bool
) -> None:
    prefix, release = tmp_path / "p", tmp_path / "release"
    proc = _start_run(
        cluster,
        prefix,
        [
            {
                "name": "g/lost",
                "fn": "gang",
                "resources": GANG_OF_2,
                "config": {"sleep_s": 600, "release_file": str(release), "report_progress": True},
            }
        ],
    )
    files = _wait_for(
        "the gang's start",
        lambda: (
            len(list(prefix.glob("g/lost-*/rank-*.json"))) == 2
            and sorted(prefix.glob("g/lost-*/rank-*.json"))
        ),
        proc,
    )
    victim = json.loads(files[1].read_text())
    if drained:
        cluster.drain(victim["node_id"])
    cluster.nodes[victim["node"]].kill()
    try:
        _wait_for("the interruption", lambda: _interrupted(prefix), proc)
        release.write_text("go")  # the next attempt (on the two remaining nodes) finishes at once
        report = _result(proc)
    finally:
        cluster.replace(victim["node"])  # the cluster gets its node back, as an autoscaler would
    assert report["status"] == "SUCCESS"
    step = report["steps"]["g/lost"]
    assert [(e["event"], e["attempt"]) for e in step["events"]] == [
        ("RUNNING", 1),
        ("PREEMPTED", 1),
        ("RUNNING", 2),
        ("SUCCESS", 2),
    ]
    assert step["events"][1]["cause"] == ("preempted" if drained else "node_died")
    [entry] = step["ledger"]["interruptions"]
    assert entry["cause"] == ("preempted" if drained else "node_died")
    assert entry["hosts"] == ["127.0.0.1"] and entry["resumed_attempt"] == 2
    assert entry["step_reached"] == 7 and entry["resumed_from"] == 5 and entry["steps_redone"] == 2
    assert entry["time_lost_s"] > 0
    assert step["status"]["status"] == "SUCCESS" and step["status"]["attempt"] == 2


GANG_OF_3 = {"num_cpus": 0, "hosts": 3, "resources": {"gang_slot": 1}}


def test_a_gang_waiting_for_hosts_after_a_node_loss_is_shown_as_waiting(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Issue 32: a gang of 3 on the cluster's 3 slot nodes loses one; its next attempt waits for a third
    host. status.json, the events, the dashboard, the issue's comment (local tracker) and the driver's console
    say so until the node is back."""
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app
    from marin.tracking.local import LocalTracker

    prefix, release = tmp_path / "p", tmp_path / "release"
    spec = {"name": "g/waits", "fn": "gang", "resources": GANG_OF_3,
            "config": {"sleep_s": 600, "release_file": str(release)}}
    proc = _start_run(cluster, prefix, [spec], issue="local/experiments#7")
    pattern = "g/waits-*/rank-*.json"
    files = _wait_for("the gang's start",
                      lambda: len(list(prefix.glob(pattern))) == 3 and sorted(prefix.glob(pattern)), proc)
    step_dir = files[0].parent
    victim = json.loads(files[1].read_text())
    cluster.nodes[victim["node"]].kill()
    text = "waiting for 3 hosts with 1 gang_slot each; 2 available"
    try:
        status_file = step_dir / ".marin/status.json"
        status = _wait_for("the waiting status", lambda: (
            (s := json.loads(status_file.read_text()))["status"] == "WAITING" and s), proc)
        assert status["attempt"] == 2 and status["waiting"] == text
        with TestClient(create_app(str(prefix), cache_ttl=0)) as client:
            shown = client.get(f"/api/steps/{step_dir.relative_to(prefix)}").json()["status"]
            assert shown["status"] == "WAITING" and shown["waiting"] == text

        def waiting_row() -> str | None:
            comments = LocalTracker(str(prefix), "local/experiments").list_comments(7)
            rows = [line for c in comments for line in c.body.splitlines()
                    if line.startswith("| `g/waits` |")]
            return rows[-1] if rows and f"⏳ WAITING: `{text}` |" in rows[-1] else None

        row = _wait_for("the issue comment's WAITING row", waiting_row, proc, timeout=60)
        assert "| 2 |" in row  # the attempt that waits
        release.write_text("go")
    finally:
        cluster.replace(victim["node"])
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["status"] == "SUCCESS"
    events = report["steps"]["g/waits"]["events"]
    # one WAITING event per text the wait showed (gang_wait.py), each while fewer than 3 hosts were free
    waits = [e for e in events if e["event"] == "WAITING"]
    pairs = [(e["event"], e["attempt"]) for e in events if e["event"] != "WAITING"]
    assert pairs == [("RUNNING", 1), ("PREEMPTED", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert events[2:2 + len(waits)] == waits and {e["attempt"] for e in waits} == {2}
    assert waits[-1]["waiting"] == text
    texts = [e["waiting"] for e in waits]
    assert len(set(texts)) == len(texts), texts  # a WAITING event only when the text changes
    assert all(t.startswith("waiting for 3 hosts with 1 gang_slot each; ") and not t.endswith("; 3 available")
               for t in texts), texts
    assert f"step g/waits attempt 2: {text}" in stderr  # the driver's console
    assert "step g/waits attempt 2: hosts reserved after" in stderr


def test_a_member_raising_fails_the_step_without_a_retry(cluster: LocalCluster, tmp_path: Path) -> None:
    report = _result(
        _start_run(
            cluster,
            tmp_path / "p",
            [
                {
                    "name": "g/raises",
                    "fn": "gang",
                    "resources": GANG_OF_2,
                    "config": {"fail_rank": 1, "sleep_s": 600},
                }
            ],
        )
    )
    assert report["status"] == "FAILED"
    step = report["steps"]["g/raises"]
    assert [(e["event"], e["attempt"]) for e in step["events"]] == [("RUNNING", 1), ("FAILED", 1)]
    assert step["events"][-1]["cause"] == "failed" and step["ledger"] is None
    assert "gang rank 1 on 127.0.0.1: rank 1 fails on purpose" in step["status"]["error"]["message"]


def test_a_gpu_task_is_not_reused_for_a_second_step(cluster: LocalCluster, tmp_path: Path) -> None:
    steps = [{"name": f"g/gpu{i}", "fn": "pid", "resources": {"num_cpus": 0, "num_gpus": 1}} for i in (1, 2)]
    report = _result(_start_run(cluster, tmp_path / "p", steps))
    assert report["status"] == "SUCCESS"
    seen = [Path(report["steps"][f"g/gpu{i}"]["output_path"], "pid.txt").read_text().split() for i in (1, 2)]
    assert [node for _, node in seen] == ["w3", "w3"]  # the one node with a (fake) GPU
    assert seen[0][0] != seen[1][0]  # two worker processes: max_calls=1
