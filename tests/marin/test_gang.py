"""Gang steps on a real multi-node Ray cluster on loopback (run inside scripts/netns): members on distinct
nodes with one coordinator, jax.distributed across them, a fake TPU slice placed through Ray's slice
placement group, and a gang's end classified from node liveness (a hard-killed node, a member raising).

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
            c.add(f"w{i + 1}", resources={**tpu_host("fake-slice-A", "v4-16", i)["resources"],  # type: ignore[dict-item]
                                          "any_slot": 1, "gang_slot": 1},
                  labels=tpu_host("fake-slice-A", "v4-16", i)["labels"],  # type: ignore[arg-type]
                  env=tpu_host("fake-slice-A", "v4-16", i)["env"])  # type: ignore[arg-type]
        c.add("w3", gpus=1, resources={"any_slot": 1, "gang_slot": 1})
        yield c
    finally:
        c.close()


def _start_gang(cluster: LocalCluster, out: Path, resources: dict[str, Any], **config: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.marin.gang_runner", cluster.address, str(out),
                             json.dumps(resources), json.dumps(config)], cwd=ROOT, env=node_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


@pytest.mark.parametrize(("resources", "size"), [
    ({"num_cpus": 0, "tpu": "v4-16"}, 2),
    ({"num_cpus": 0, "hosts": 4, "resources": {"any_slot": 1}}, 4),
], ids=["tpu-v4-16-slice-of-2", "hosts-4"])
def test_a_gang_brings_up_jax_distributed_across_distinct_nodes(cluster: LocalCluster, tmp_path: Path,
                                                               resources: dict[str, Any], size: int) -> None:
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
    assert (out / ".marin/logs/attempt-1.log").exists() and (out / f".marin/logs/attempt-1.rank-{size - 1}.log").exists()


def _wait_for_ranks(out: Path, size: int, proc: subprocess.Popen[str], timeout: float = 240) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while len(list(out.glob("rank-*.json"))) < size:
        if proc.poll() is not None or time.time() > deadline:
            why = proc.communicate()[1][-3000:] if proc.poll() is not None else "timeout"
            raise AssertionError(f"the gang did not start: {why}")
        time.sleep(0.2)
    return _ranks(out)


def test_one_member_raising_fails_the_gang_at_once_and_cancels_the_others(cluster: LocalCluster,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "gang"
    begun = time.time()
    result = _result(_start_gang(cluster, out, {"num_cpus": 0, "hosts": 2, "resources": {"gang_slot": 1}},
                                 fail_rank=1, sleep_s=600))
    assert not result["ok"] and result["cause"] == "failed" and not result["preempted"]
    assert result["type"] == "ValueError" and "gang rank 1 on 127.0.0.1: rank 1 fails on purpose" in result["message"]
    assert {m["rank"]: m["outcome"] for m in result["gang"]} == {0: "cancelled", 1: "app"}
    assert time.time() - begun < 300  # rank 0 (sleeping 600 s) was cancelled, not waited for


@pytest.mark.parametrize("drained", [False, True], ids=["hard-kill", "drain-then-kill"])
def test_a_node_lost_under_a_gang_ends_it_as_an_interruption(cluster: LocalCluster, tmp_path: Path,
                                                             drained: bool) -> None:
    out = tmp_path / "gang"
    proc = _start_gang(cluster, out, {"num_cpus": 0, "hosts": 2, "resources": {"gang_slot": 1}}, sleep_s=600)
    ranks = _wait_for_ranks(out, 2, proc)
    victim = ranks[1]
    if drained:
        cluster.drain(victim["node_id"])
    cluster.nodes[victim["node"]].kill()
    try:
        result = _result(proc)
    finally:
        cluster.replace(victim["node"])  # the cluster gets its node back, as an autoscaler would
    assert not result["ok"] and result["preempted"]
    assert result["cause"] == ("preempted" if drained else "node_died"), result
    assert result["hosts"] == ["127.0.0.1"]
    assert {m["rank"]: m["outcome"] for m in result["gang"]}[1] == "node"
