"""Gang start overhead and recovery from a killed node, on a local 3-node Ray cluster (inside scripts/netns).

    scripts/netns .venv/bin/python benchmarks/cluster_recovery.py [--repeats 3] [--jax]

Three one-CPU nodes (the head and two workers, all with a `gang_slot`); every figure is the median of
`--repeats` runs and every member is a fresh worker process (`max_calls=1`), as on a real cluster:

- `gang_start_overhead_s`: wall time of a no-op gang of 2 (`marin.execution.gang`: placement group, rank 0's
  free port, two members, teardown) minus that of the same no-op as one `max_calls=1` task.
- recovery: a gang of 2 runs the step function (with `--jax`, each member first brings up
  `jax.distributed`); at a random moment (0-2 s after both members started) the worker node of the member
  that is not on the driver's node is SIGKILLed (its whole session: raylet, object store, workers). Then
  `detection_s` = kill -> the supervisor's classified result (cause, hosts); `rescheduling_s` = that result ->
  both members of the next attempt running the function on the two remaining nodes (placement group,
  port, worker start); `jax_start_s` = members running -> jax.distributed up in all of them (with --jax).
  The killed node is replaced between repeats.

What it does not measure: the trainer restoring a checkpoint and its first step after restore (a gang
training the tiny preset needs the multi-host trainer, another branch of this issue); `steps_redone` and
`goodput` are therefore not printed. The executor's own back-off between attempts is not included here.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.marin.local_cluster import LocalCluster  # noqa: E402


def _submit(ray: Any, out: Path, *, size: int, sleep_s: float, use_jax: bool, release: Path | None) -> Any:
    from marin.definition.step import Resources
    from marin.execution.gang import GangPlan, submit_gang
    from tests.marin.gang_fns import GangConfig, gang_member

    config = GangConfig(
        output_path=str(out), use_jax=use_jax, sleep_s=sleep_s, release_file=str(release) if release else ""
    )
    log_path = str(out / ".marin/logs/attempt-1.log")
    payload = ray.cloudpickle.dumps((gang_member, config, log_path, {}, None))
    plan = GangPlan.of(Resources(num_cpus=0, hosts=size, resources={"gang_slot": 1}))
    return submit_gang(
        ray, plan, payload, None, name=f"bench/{out.name}", log_path=log_path, env={}, after=[]
    )


def _start_overhead(ray: Any, work: Path, repeats: int) -> dict[str, float]:
    from tests.marin.gang_fns import PidConfig, write_pid

    single = ray.remote(max_calls=1)(write_pid).options(num_cpus=0, resources={"gang_slot": 1}, max_retries=0)
    gang_s, task_s = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        result = ray.get(
            _submit(ray, work / f"noop-gang-{i}", size=2, sleep_s=0, use_jax=False, release=None)
        )
        gang_s.append(time.perf_counter() - t0)
        assert result.ok, result
        t0 = time.perf_counter()
        ray.get(single.remote(PidConfig(output_path=str(work / f"noop-task-{i}"))))
        task_s.append(time.perf_counter() - t0)
    return {
        "gang_of_2_s": statistics.median(gang_s),
        "single_task_s": statistics.median(task_s),
        "gang_start_overhead_s": statistics.median(gang_s) - statistics.median(task_s),
    }


def _wait_ranks(out: Path, size: int, timeout: float = 300) -> list[dict[str, Any]]:
    deadline = time.time() + timeout
    while len(list(out.glob("rank-*.json"))) < size:
        if time.time() > deadline:
            raise RuntimeError(f"gang at {out} did not start")
        time.sleep(0.05)
    time.sleep(0.1)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def _recovery(ray: Any, cluster: LocalCluster, work: Path, i: int, use_jax: bool) -> dict[str, Any]:
    first = work / f"run-{i}-a"
    ref = _submit(ray, first, size=2, sleep_s=600, use_jax=use_jax, release=None)
    ranks = _wait_ranks(first, 2)
    driver_node = ray.get_runtime_context().get_node_id()
    victim = next(r for r in ranks if r["node_id"] != driver_node)
    time.sleep(random.uniform(0.0, 2.0))
    t_kill = time.time()
    cluster.nodes[victim["node"]].kill()
    result = ray.get(ref)
    t_detect = time.time()
    second = work / f"run-{i}-b"
    release = work / f"release-{i}"
    ref2 = _submit(ray, second, size=2, sleep_s=600, use_jax=use_jax, release=release)
    ranks2 = _wait_ranks(second, 2)
    running = max(r["entered"] for r in ranks2)
    release.write_text("go")
    ok = ray.get(ref2).ok
    cluster.replace(victim["node"])
    row = {
        "cause": result.cause,
        "hosts": list(result.hosts),
        "retry_ok": ok,
        "detection_s": t_detect - t_kill,
        "rescheduling_s": running - t_detect,
    }
    if use_jax:
        row["jax_start_s"] = max(r["jax_up"] for r in ranks2) - running
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jax", action="store_true", help="members bring up jax.distributed")
    args = parser.parse_args()
    import ray

    with tempfile.TemporaryDirectory(prefix="cluster-recovery-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster(work)
        try:
            cluster.head(resources={"gang_slot": 1})
            for name in ("w1", "w2"):
                cluster.add(name, resources={"gang_slot": 1})
            ray.init(address=cluster.address, log_to_driver=False)
            start = _start_overhead(ray, work, args.repeats)
            rows = [_recovery(ray, cluster, work, i, args.jax) for i in range(args.repeats)]
            ray.shutdown()
        finally:
            cluster.close()
    keys = ["detection_s", "rescheduling_s"] + (["jax_start_s"] if args.jax else [])
    summary = {k: statistics.median(r[k] for r in rows) for k in keys}
    summary["detection_plus_rescheduling_s"] = summary["detection_s"] + summary["rescheduling_s"]
    print(
        json.dumps(
            {
                "start": start,
                "recovery": summary,
                "runs": rows,
                "repeats": args.repeats,
                "not_measured": ["restore", "first_step_after_restore", "steps_redone", "goodput"],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
