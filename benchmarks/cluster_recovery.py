"""Gang start overhead and recovery from a killed node, on a local 3-node Ray cluster (inside scripts/netns).

    scripts/netns .venv/bin/python benchmarks/cluster_recovery.py [--repeats 3] [--jax] [--train 1]
        [--steps 60 --checkpoint-every 10] [--health-check-period-ms 1000 --health-check-failures 3]

Three one-CPU nodes (the head and two workers, all with a `gang_slot`); every figure is the median of
`--repeats` runs and every member is a fresh worker process (`max_calls=1`), as on a real cluster:

- `start`: wall time of a no-op gang of 2 (`marin.execution.gang`: placement group, rank 0's free port, two
  members, teardown) minus that of the same no-op as one `max_calls=1` task; with where it goes: submit ->
  both members running, and a bare STRICT_SPREAD placement group of two bundles (create, ready, remove).
- `recovery` (the gang module alone): a gang of 2 runs the step function (with `--jax`, each member first
  brings up `jax.distributed`); at a random moment (0-2 s after both members started) the worker node of
  the member that is not on the driver's node is SIGKILLed (its whole session: raylet, object store,
  workers). `detection_s` = kill -> the supervisor's classified result; `rescheduling_s` = that result ->
  both members of the next attempt running on the two remaining nodes; `jax_start_s` = members running ->
  jax.distributed up in all of them (with --jax). The killed node is replaced between repeats.
- `training` (`--train N`, through the executor: `run_experiment` on the cluster, the gang step
  `tests/marin/train_fns.timed_gang_train`: the train operator on the tiny preset, 16 x 128 tokens, a
  checkpoint every K = `--checkpoint-every` steps, `max_preemptions=3`): a member's node is SIGKILLed once
  the progress file says a random step in (K, 3K] was reached; the executor classifies, backs off, retries,
  and the trainer resumes from its checkpoint. From the step's own records: `detection_s` = kill -> the
  PREEMPTED event; `rescheduling_s` = PREEMPTED -> the next attempt's RUNNING (executor back-off,
  supervisor, placement group, port, member start); `jax_start_s` = RUNNING -> jax.distributed up in both
  members; `restore_and_first_step_s` = that -> the first step after the restore (the progress file's
  `first_step_time`: restore, compile, one step); `kill_to_first_step_s` the whole; the ledger entry
  (checkpoint, steps redone, restart gap, time lost) and the step's goodput (interruptions.py).

`--worker-niceness` sets Ray's `worker_niceness` (Ray starts workers at nice 15, below the raylet and any
job niced 10 on a shared machine). `--health-check-period-ms` / `--health-check-failures` set Ray's node
health check on the test cluster (`RAY_health_check_period_ms`, `RAY_health_check_failure_threshold`; Ray's
defaults 3000 ms and 5): how soon the GCS declares a SIGKILLed node dead bounds detection, since the gang
supervisor waits for that verdict to tell a lost node from a failure (gang.py). The executor's back-off is
in `rescheduling_s` of the training figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
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


def _start_overhead(ray: Any, work: Path, repeats: int) -> dict[str, Any]:
    from tests.marin.gang_fns import PidConfig, write_pid

    single = ray.remote(max_calls=1)(write_pid).options(num_cpus=0, resources={"gang_slot": 1}, max_retries=0)
    gang_s, task_s, entered_s, pg_s = [], [], [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        w0 = time.time()
        result = ray.get(
            _submit(ray, work / f"noop-gang-{i}", size=2, sleep_s=0, use_jax=False, release=None)
        )
        gang_s.append(time.perf_counter() - t0)
        assert result.ok, result
        entered_s.append(max(r["entered"] for r in _wait_ranks(work / f"noop-gang-{i}", 2)) - w0)
        t0 = time.perf_counter()
        ray.get(single.remote(PidConfig(output_path=str(work / f"noop-task-{i}"))))
        task_s.append(time.perf_counter() - t0)
        pg_s.append(_placement_group_s(ray))
    return {
        "gang_of_2_s": statistics.median(gang_s),
        "single_task_s": statistics.median(task_s),
        "gang_start_overhead_s": statistics.median(gang_s) - statistics.median(task_s),
        "gang_to_members_running_s": statistics.median(entered_s),
        "placement_group_s": statistics.median(pg_s),
        "runs": {"gang_s": gang_s, "task_s": task_s, "members_running_s": entered_s},
    }


def _placement_group_s(ray: Any) -> float:
    """Create, wait for and remove a STRICT_SPREAD group of two gang bundles (the gang's reservation)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    t0 = time.perf_counter()
    pg = placement_group([{"gang_slot": 1}, {"gang_slot": 1}], strategy="STRICT_SPREAD")
    ray.get(pg.ready())
    remove_placement_group(pg)
    return time.perf_counter() - t0


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_progress(out: Path, step: int, thread: threading.Thread, timeout: float = 900) -> dict[str, Any]:
    deadline = time.time() + timeout
    while True:
        progress = _read_json(out / ".marin/progress.json") or {}
        if (progress.get("step") or 0) >= step:
            return progress
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError(f"the training step at {out} never reached step {step}")
        time.sleep(0.05)


def _train_step(work: Path, i: int, args: argparse.Namespace) -> Any:
    from marin import Step, this_output_path
    from marin.definition.step import Resources
    from tests.marin.train_fns import TimedTrainConfig, timed_gang_train

    return Step(
        name=f"bench/train-{i}",
        fn=timed_gang_train,
        config=TimedTrainConfig(
            output_path=this_output_path(),
            train_cache=str(work / "cache"),
            num_steps=args.steps,
            checkpoint_every=args.checkpoint_every,
        ),
        resources=Resources(num_cpus=0, hosts=2, resources={"gang_slot": 1}),
        max_preemptions=3,
    )


def _run_in_thread(steps: list[Any], prefix: str, address: str) -> tuple[threading.Thread, dict[str, Any]]:
    from marin import run_experiment
    from marin.execution.argv import ExecutorMainConfig

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = run_experiment(
                steps,
                ExecutorMainConfig(prefix=prefix, backend="ray", ray_address=address),
                verbose=False,
                script="benchmarks/cluster_recovery.py",
            )
        except BaseException as e:  # reported by the caller
            box["error"] = e

    thread = threading.Thread(target=run, name="bench-driver", daemon=True)
    thread.start()
    return thread, box


def _training_recovery(cluster: LocalCluster, work: Path, i: int, args: argparse.Namespace) -> dict[str, Any]:
    """A gang of 2 trains through the executor; a member's node is SIGKILLed at a random step after the
    first checkpoint; the executor retries it and it resumes from the checkpoint."""
    step = _train_step(work, i, args)
    thread, box = _run_in_thread([step], str(work / f"prefix-train-{i}"), cluster.address)
    k = args.checkpoint_every
    kill_at = random.randint(k + 1, max(k + 1, min(args.steps - k, 3 * k)))
    out = _wait_output(work / f"prefix-train-{i}" / "bench", f"train-{i}-", thread)
    _wait_progress(out, kill_at, thread)
    import ray

    driver = ray.get_runtime_context().get_node_id()
    members = [_read_json(p) for p in sorted((out / "timing").glob("*.json"))]
    victim = next(m["node"] for m in members if m["node_id"] != driver)
    t_kill = time.time()
    cluster.nodes[victim].kill()
    thread.join()
    if "error" in box:
        raise box["error"]
    cluster.replace(victim)
    return _recovery_row(out, t_kill, kill_at, box["result"].status_of(step.name), k)


def _wait_output(parent: Path, stem: str, thread: threading.Thread, timeout: float = 300) -> Path:
    deadline = time.time() + timeout
    while True:
        found = [p for p in parent.glob(f"{stem}*") if p.is_dir()] if parent.is_dir() else []
        if found:
            return found[0]
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError(f"no output path {parent}/{stem}* appeared")
        time.sleep(0.1)


def _recovery_row(out: Path, t_kill: float, kill_at: int, status: str, k: int) -> dict[str, Any]:
    from marin.status import interruptions as il
    from marin.status.files import read_events, read_status
    from marin.storage import storage_for

    storage = storage_for(str(out))
    events = read_events(storage, str(out))
    preempted = next(e for e in events if e["event"] == "PREEMPTED")
    running2 = next(e for e in events if e["event"] == "RUNNING" and e["attempt"] == preempted["attempt"] + 1)
    after = [m for m in map(_read_json, (out / "timing").glob("*.json")) if m and m["entered"] > t_kill]
    jax_up = max(m["jax_up"] for m in after)
    progress = _read_json(out / ".marin/progress.json")
    first_step = float(progress["first_step_time"])
    ledger = il.read_ledger(storage, str(out))
    [entry] = ledger["interruptions"]
    wall, lost = il.step_wall_and_lost(read_status(storage, str(out)), ledger)
    return {
        "status": status,
        "cause": entry["cause"],
        "kill_at_step": kill_at,
        "checkpoint_every": k,
        "detection_s": preempted["ts"] - t_kill,
        "rescheduling_s": running2["ts"] - preempted["ts"],
        "jax_start_s": jax_up - running2["ts"],
        "restore_and_first_step_s": first_step - jax_up,
        "kill_to_first_step_s": first_step - t_kill,
        "ledger": {key: entry[key] for key in ("step_reached", "checkpoint_step", "resumed_from",
                                               "steps_redone", "restart_gap_s", "time_lost_s")},
        "goodput": (wall - lost) / wall if wall else None,
        "step_wall_s": wall,
    }


def _cluster_env(args: argparse.Namespace) -> dict[str, Any]:
    """Ray's node health check on the test cluster (the GCS declares a node dead after `threshold` missed
    checks, `period` apart): Ray's defaults unless given. The nodes inherit this process's environment."""
    settings = {"period_ms": args.health_check_period_ms, "failure_threshold": args.health_check_failures}
    for key, value in settings.items():
        if value is not None:
            os.environ[f"RAY_health_check_{key}"] = str(value)
    return {k: v for k, v in settings.items() if v is not None} or {"ray_defaults": True}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jax", action="store_true", help="members bring up jax.distributed")
    parser.add_argument("--train", type=int, default=0, help="runs of the training recovery (0: none)")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the gang")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="K: the checkpoint interval")
    parser.add_argument("--health-check-period-ms", type=int, default=None, help="Ray's (default 3000)")
    parser.add_argument("--health-check-failures", type=int, default=None, help="Ray's threshold (default 5)")
    parser.add_argument("--skip-gang", action="store_true", help="only the training recovery")
    parser.add_argument("--worker-niceness", type=int, default=None,
                        help="Ray's worker niceness (default 15; 0 on a machine shared with niced jobs)")
    return parser.parse_args()


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _keep_logs(cluster: LocalCluster, work: Path) -> None:
    """On a failure, keep the nodes' start logs and Ray's session logs (the temp dirs go)."""
    import shutil

    keep = Path(tempfile.mkdtemp(prefix="cluster-recovery-failed-", dir="/tmp"))
    shutil.copytree(cluster.ray_temp, keep / "ray", ignore=shutil.ignore_patterns("*.sock", "sockets"),
                    dirs_exist_ok=True, ignore_dangling_symlinks=True)
    for log in work.glob("*.log"):
        shutil.copy(log, keep / log.name)
    _progress(f"failed; logs kept in {keep}")


def _summary(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main() -> int:
    args = _parse()
    import ray

    report: dict[str, Any] = {"health_check": _cluster_env(args), "repeats": args.repeats}
    if args.worker_niceness is not None:  # Ray starts its workers at nice 15 unless told otherwise
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)  # noqa: SIM112 (Ray's own name)
        report["worker_niceness"] = args.worker_niceness
    report["load_average_at_start"] = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cluster-recovery-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster(work)
        try:
            cluster.head(resources={"gang_slot": 1})
            for name in ("w1", "w2"):
                cluster.add(name, resources={"gang_slot": 1})
            ray.init(address=cluster.address, log_to_driver=False, namespace="marin")
            if not args.skip_gang:
                _progress("cluster up; measuring the gang start overhead")
                report["start"] = _start_overhead(ray, work, args.repeats)
                _progress(f"start: {report['start']}; measuring recovery")
                rows = [_recovery(ray, cluster, work, i, args.jax) for i in range(args.repeats)]
                keys = ["detection_s", "rescheduling_s"] + (["jax_start_s"] if args.jax else [])
                report["recovery"] = _summary(rows, keys)
                report["recovery"]["detection_plus_rescheduling_s"] = (
                    report["recovery"]["detection_s"] + report["recovery"]["rescheduling_s"]
                )
                report["runs"] = rows
            if args.train:
                from tests.marin.train_fns import write_random_cache

                _progress("measuring the training recovery")
                write_random_cache(str(work / "cache"), vocab=4096, tokens=400_000)
                train_rows = [_training_recovery(cluster, work, i, args) for i in range(args.train)]
                keys = ["detection_s", "rescheduling_s", "jax_start_s", "restore_and_first_step_s",
                        "kill_to_first_step_s", "goodput"]
                report["training"] = {"median": _summary(train_rows, keys), "runs": train_rows}
            ray.shutdown()
        except BaseException:
            _keep_logs(cluster, work)
            raise
        finally:
            cluster.close()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
