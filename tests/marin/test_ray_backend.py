"""The Ray backend: embedded Ray (one per session), a real two-node local cluster with a custom resource, and
infeasible requests reported up front. Run inside scripts/netns."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marin import InfeasibleResourcesError, Resources, Step, StepFailedError, output_path_of, this_output_path
from marin.execution.ray_backend import ray_options
from marin.execution.resources import check_feasible
from tests.marin.fns import (
    CountConfig,
    EnvConfig,
    FailConfig,
    FlakyConfig,
    NoopConfig,
    SumConfig,
    WriteConfig,
    count_and_write,
    fail,
    flaky,
    ray_task_info,
    sum_numbers,
    write_env,
    write_numbers,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def test_check_feasible_names_the_step_and_the_missing_resource() -> None:
    nodes = [{"CPU": 2.0, "memory": 4e9}, {"CPU": 1.0, "fake_gpu": 1.0}]
    check_feasible([("ok/cpu", Resources(num_cpus=2)), ("ok/gpu", Resources(resources={"fake_gpu": 1}))],
                   nodes,
                   "add a node")
    with pytest.raises(InfeasibleResourcesError) as info:
        check_feasible([("train/big", Resources(num_cpus=1, resources={"TPU": 4})),
                        ("ok/cpu", Resources(num_cpus=1))], nodes, "add a node")
    assert "step train/big requests TPU=4 (largest node has 0)" in str(info.value)
    assert "ok/cpu" not in str(info.value)
    with pytest.raises(InfeasibleResourcesError, match="step split/x requests CPU=2"):
        # each resource exists somewhere, but no single node has both
        check_feasible([("split/x", Resources(num_cpus=2, resources={"fake_gpu": 1}))], nodes, "add a node")


def test_ray_options_carry_resources_and_env() -> None:
    opts = ray_options(Resources(num_cpus=2, num_gpus=1, memory=2**30, resources={"TPU": 4}), {"A": "b"})
    assert opts == {"num_cpus": 2, "num_gpus": 1, "memory": 2**30, "resources": {"TPU": 4}, "max_retries": 0,
                    "retry_exceptions": False, "runtime_env": {"env_vars": {"A": "b"}}}


def test_embedded_ray_runs_steps_captures_logs_and_wraps_failures(
    ray_embedded: Any, marin_prefix: str
) -> None:
    from marin import ExecutorMainConfig, run_experiment

    numbers = Step(name="ray/numbers", fn=write_numbers,
                   config=WriteConfig(output_path=this_output_path(), n=5))
    total = Step(name="ray/total", fn=sum_numbers,
                 config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                                  output_path=this_output_path()))
    env = Step(name="ray/env", fn=write_env, env={"MARIN_TEST_VAR": "from-step"},
               config=EnvConfig(output_path=this_output_path()))
    bad = Step(name="ray/bad", fn=fail, config=FailConfig(output_path=this_output_path(), message="ray boom"))
    result = run_experiment([total, env, bad], ExecutorMainConfig(prefix=marin_prefix, backend="ray"),
                            verbose=False, script="tests/ray.py")
    assert {n: result.status_of(n) for n in ("ray/numbers", "ray/total", "ray/env", "ray/bad")} == {
        "ray/numbers": "SUCCESS", "ray/total": "SUCCESS", "ray/env": "SUCCESS", "ray/bad": "FAILED"}
    assert Path(result.output_path("ray/total"), "total.txt").read_text() == "10\n"
    assert "total=10" in Path(result.output_path("ray/total"), ".marin/logs/attempt-1.log").read_text()
    assert Path(result.output_path("ray/env"), "env.txt").read_text() == "from-step"
    bad_log = Path(result.output_path("ray/bad"), ".marin/logs/attempt-1.log").read_text()
    assert "about to fail" in bad_log and "ValueError: ray boom" in bad_log
    [failure] = result.failures
    assert isinstance(failure, StepFailedError) and isinstance(failure.__cause__, ValueError)
    assert failure.log_path
    assert failure.log_path.endswith("ray/bad-" + failure.hash[:8] + "/.marin/logs/attempt-1.log")
    assert ray_embedded.is_initialized()  # the session's Ray is not shut down by a run that did not start it


def test_an_embedded_ray_starts_on_loopback_without_probing_outside_addresses(tmp_path: Path) -> None:
    """The embedded node takes 127.0.0.1, as Ray does on macOS/Windows, so Ray does not probe 8.8.8.8 for an
    address to show other hosts (in the tests' private network namespace that probe fails and logs a
    `network_util.cc ... Failed to determine local IP` warning at every run's start)."""
    code = ("import ray\nfrom ray._private import ray_constants\n"
            "from marin.execution.ray_backend import ensure_ray\n"
            "assert ensure_ray(None)\n"
            "print(ray.util.get_node_ip_address(), ray_constants.ENABLE_RAY_CLUSTER)\n"
            "ray.shutdown()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["127.0.0.1", "True"]  # the switch is put back once the node is up
    assert "Failed to determine local IP" not in done.stderr and "8.8.8.8" not in done.stderr, done.stderr


def test_every_attempt_is_a_ray_task_named_after_its_step_with_its_resources(ray_embedded: Any,
                                                                            marin_prefix: str) -> None:
    """Options are validated once per resource set and later submissions skip `.options()`: names and
    resources must still reach each task."""
    from marin import ExecutorMainConfig, run_experiment

    steps = [Step(name=f"ray/task{i}", fn=ray_task_info, resources=Resources(num_cpus=cpus),
                  config=NoopConfig(output_path=this_output_path(), tag=str(i)))
             for i, cpus in enumerate([1, 1, 1, 2, 2])]
    result = run_experiment(steps, ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False,
                            script="tests/ray_names.py")
    assert result.status == "SUCCESS", result.summary
    for i, cpus in enumerate([1, 1, 1, 2, 2]):
        path = result.output_path(f"ray/task{i}")
        info = json.loads(Path(path, "task.json").read_text())
        assert info == {"name": f"ray/task{i}:{path.rsplit('-', 1)[1]}:attempt-1", "cpus": cpus}


def test_results_of_a_batch_come_back_once_each_with_ray_level_failures_as_errors(ray_embedded: Any) -> None:
    import queue

    from marin.execution.ray_backend import _ResultWatcher

    ray = ray_embedded
    ok = ray.remote(lambda i: {"i": i})
    crash = ray.remote(max_retries=0)(lambda: os._exit(3))
    slow = ray.remote(max_retries=0)(lambda: time.sleep(60))
    finished = {f"ok{i}": ok.remote(i) for i in range(20)}
    finished["crash"] = crash.remote()
    ray.wait(list(finished.values()), num_returns=len(finished), timeout=60)  # all finished: one batch below
    got: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    watcher = _ResultWatcher(ray, lambda task, value: got.put((task, value)))  # type: ignore[arg-type, misc]
    try:
        for key, ref in {**finished, "slow": slow.remote()}.items():
            watcher.watch(ref, key)  # type: ignore[arg-type]
        first = dict(got.get(timeout=60) for _ in finished)  # the slow one is still running
        ray.cancel(next(r for r, k in watcher._pending.items() if k == "slow"), force=True)
        key, cancelled = got.get(timeout=60)
        time.sleep(3 * watcher.MAX_WAIT_S)
        assert got.empty()  # nothing is delivered twice
    finally:
        watcher.close()
    assert {k: v for k, v in first.items() if k != "crash"} == {f"ok{i}": {"i": i} for i in range(20)}
    assert isinstance(first["crash"], ray.exceptions.WorkerCrashedError)
    assert key == "slow" and isinstance(cancelled, ray.exceptions.RayError)


def _watch_one(fake_ray: Any) -> tuple[Any, Any]:
    """Watch one reference ("ref-1" of "task-1") with a result watcher over `fake_ray`; (task, value)
    delivered."""
    import queue

    from marin.execution.ray_backend import _ResultWatcher

    got: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    watcher = _ResultWatcher(fake_ray, lambda task, value: got.put((task, value)))  # type: ignore[arg-type]
    try:
        watcher.watch("ref-1", "task-1")  # type: ignore[arg-type]
        return got.get(timeout=10)
    finally:
        watcher.close()


def test_the_result_watcher_waits_longer_when_a_call_costs_more() -> None:
    # A fake Ray whose `wait` burns 2 ms of CPU per call (as ~6,000 pending references would) and finds
    # nothing ready three times: each next wait must be at least COST_FACTOR times that, not MIN_WAIT_S.
    from marin.execution.ray_backend import _ResultWatcher

    class SlowWaitRay:
        def __init__(self) -> None:
            self.timeouts: list[float] = []

        def wait(self, refs: list[Any], num_returns: int, timeout: float, fetch_local: bool) -> tuple[list,
                                                                                                      list]:
            self.timeouts.append(timeout)
            start = time.thread_time()
            while time.thread_time() - start < 0.002:
                pass
            return (list(refs), []) if len(self.timeouts) > 3 else ([], list(refs))

        def get(self, refs: list[Any]) -> list[Any]:
            return [f"value of {r}" for r in refs]

    fake = SlowWaitRay()
    assert _watch_one(fake) == ("task-1", "value of ref-1")
    assert fake.timeouts[0] == _ResultWatcher.MIN_WAIT_S
    assert all(t >= _ResultWatcher.COST_FACTOR * 0.002 for t in fake.timeouts[1:4]), fake.timeouts


class _FlakyWaitRay:
    """A fake Ray whose `wait` raises on its first `failures` calls; `up` says whether Ray is still
    initialized."""

    def __init__(self, up: bool, failures: int = 1) -> None:
        self.up = up
        self.failures = failures
        self.calls = 0

    def is_initialized(self) -> bool:
        return self.up

    def wait(self, refs: list[Any], num_returns: int, timeout: float, fetch_local: bool) -> tuple[list, list]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("GCS RPC failed")
        return list(refs), []

    def get(self, refs: list[Any]) -> list[Any]:
        return [f"value of {r}" for r in refs]


@pytest.mark.parametrize("ray_up", [True, False])
def test_a_failing_wait_is_retried_while_ray_is_up_and_fails_the_attempts_once_it_is_gone(
    ray_up: bool,
) -> None:
    fake = _FlakyWaitRay(up=ray_up)
    task, value = _watch_one(fake)
    assert task == "task-1"
    if ray_up:  # a passing error: the result still arrives, as a value
        assert value == "value of ref-1" and fake.calls == 2
    else:  # Ray is gone: the attempt gets the error (the executor records it preempted)
        assert isinstance(value, ConnectionError) and fake.calls == 1


def test_a_wait_that_keeps_failing_while_ray_is_up_fails_the_attempts_in_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from marin.execution.ray_backend import _ResultWatcher

    monkeypatch.setattr(_ResultWatcher, "MAX_FAILED_WAITS", 3)
    fake = _FlakyWaitRay(up=True, failures=1000)
    task, value = _watch_one(fake)
    assert task == "task-1" and isinstance(value, ConnectionError) and fake.calls == 3


def test_infeasible_resources_fail_before_anything_runs(ray_embedded: Any, marin_prefix: str) -> None:
    from marin import ExecutorMainConfig, run_experiment

    ok = Step(name="inf/ok", fn=write_numbers, config=WriteConfig(output_path=this_output_path()))
    tpu = Step(name="inf/tpu", fn=write_numbers, resources={"resources": {"TPU": 8}},
               config=WriteConfig(output_path=output_path_of(ok, "x")))
    with pytest.raises(InfeasibleResourcesError, match=r"step inf/tpu requests TPU=8"):
        run_experiment([tpu], ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False)
    assert list(Path(marin_prefix).iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(ray_bin: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`ray start --block`: the node lives as long as this process, so teardown can stop exactly what this
    test started (`ray stop` would stop every Ray process on the machine, other users' included)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([ray_bin, "start", "--block", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"ray start {args} did not come "
                               f"up:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    return proc


def _stop_node(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)  # `ray start --block` tears its node down on SIGTERM
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    logs = tmp_path_factory.mktemp("ray-cluster")
    # Ray's AF_UNIX socket paths must stay under 108 bytes: its temp dir lives directly under /tmp, not under
    # pytest's base temp (which xdist makes longer: .../popen-gw0/...)
    temp = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    common = ["--num-cpus=1", "--memory=1000000000", "--object-store-memory=100000000",
              "--disable-usage-stats"]
    head = _start_node(ray_bin,
                       ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}",
                                 *common], {**env, "MARIN_NODE_TAG": "head"}, logs / "head.log")
    address = f"127.0.0.1:{port}"
    worker = None
    try:
        worker = _start_node(ray_bin, [f"--address={address}", '--resources={"fake_gpu": 1}', *common],
                             {**env, "MARIN_NODE_TAG": "worker-with-fake-gpu"}, logs / "worker.log")
        yield address
    finally:
        if worker is not None:
            _stop_node(worker)
        _stop_node(head)
        shutil.rmtree(temp, ignore_errors=True)


def test_two_node_cluster_runs_pinned_steps_on_the_node_with_the_resource(
    two_node_cluster: str, tmp_path: Path
) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    deadline = time.time() + 240
    out = subprocess.run([sys.executable, "-m", "tests.marin.ray_runner", two_node_cluster,
                          str(tmp_path / "p")],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=max(30, deadline - time.time()))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["status"] == "SUCCESS"
    assert report["node"] == "worker-with-fake-gpu"
    assert "writing 4 numbers" in report["log"]  # captured by the worker on the other node


def test_a_script_that_defines_its_own_steps_runs_them_on_the_cluster(two_node_cluster: str,
                                                                      tmp_path: Path) -> None:
    """hello_world.py defines its functions and config classes in `__main__`, which cluster workers cannot
    import: they travel in the run's table of script objects (attempt_pickle), once, and every step runs."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    prefix = tmp_path / "p"
    out = subprocess.run([sys.executable, "experiments/hello_world.py", "--prefix", str(prefix), "--backend",
                          "ray",
                          "--ray-address", two_node_cluster], cwd=ROOT, env=env, capture_output=True,
                          text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    [total] = prefix.glob("demo/total-*/total.txt")
    assert total.read_text() == "45\n"
    [numbers_log] = prefix.glob("demo/numbers-*/.marin/logs/attempt-1.log")
    assert "wrote 10 numbers" in numbers_log.read_text()


def _status(result: Any, name: str) -> dict[str, Any]:
    return json.loads(Path(result.output_path(name), ".marin/status.json").read_text())


def _events(result: Any, name: str) -> list[tuple[str, int]]:
    path = Path(result.output_path(name), ".marin/events.jsonl")
    if not path.exists():
        return []
    return [(e["event"], e["attempt"]) for e in map(json.loads, path.read_text().splitlines())]


def test_dependents_queued_behind_running_steps_start_only_after_them(ray_embedded: Any, marin_prefix: str,
                                                                       tmp_path: Path) -> None:
    """On Ray a chain is submitted at once, each attempt queued behind its dependency's result: every step
    still starts after its dependency ended, reads its output, and writes RUNNING only when it really runs."""
    from marin import ExecutorMainConfig, run_experiment

    counter = tmp_path / "ran.txt"
    first = Step(name="queue/a", fn=count_and_write, config=CountConfig(output_path=this_output_path(),
                                                                        counter_file=str(counter),
                                                                        sleep_s=0.5))
    second = Step(name="queue/b", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(counter), sleep_s=0.2,
        inputs=(output_path_of(first, "done.txt"),)))
    third = Step(name="queue/c", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(counter),
        inputs=(output_path_of(second, "done.txt"),)))
    result = run_experiment([third], ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False,
                            script="tests/queue.py")
    assert result.status == "SUCCESS"
    a, b, c = (_status(result, n) for n in ("queue/a", "queue/b", "queue/c"))
    assert a["ended"] <= b["started"] and b["ended"] <= c["started"]
    assert [x["status"] for x in (a, b, c)] == ["SUCCESS"] * 3 and [x["attempt"] for x in (a, b, c)] == [1, 1,
                                                                                                         1]
    for name in ("queue/a", "queue/b", "queue/c"):
        assert _events(result, name) == [("RUNNING", 1), ("SUCCESS", 1)]
        info = json.loads(Path(result.output_path(name), ".marin/step.json").read_text())
        assert info["name"] == name and info["output_path"] == result.output_path(name)
        assert not Path(result.output_path(name), ".marin/lease.json").exists()
    assert counter.read_text().splitlines() == [result.output_path(n) for n in ("queue/a", "queue/b",
                                                                                "queue/c")]


def test_steps_queued_behind_a_failure_never_run_and_are_dep_failed(ray_embedded: Any, marin_prefix: str,
                                                                    tmp_path: Path) -> None:
    from marin import ExecutorMainConfig, run_experiment

    counter = tmp_path / "ran.txt"
    bad = Step(name="qfail/bad", fn=fail, config=FailConfig(output_path=this_output_path(), message="early"))
    middle = Step(name="qfail/middle", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(counter), inputs=(output_path_of(bad),)))
    last = Step(name="qfail/last", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(counter), inputs=(output_path_of(middle),)))
    result = run_experiment([last], ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False,
                            script="tests/qfail.py")
    assert result.status == "FAILED"
    assert [result.status_of(n) for n in ("qfail/bad", "qfail/middle", "qfail/last")] == [
        "FAILED", "DEP_FAILED", "DEP_FAILED"]
    assert not counter.exists()  # neither dependent called its function
    for name in ("qfail/middle", "qfail/last"):
        status = _status(result, name)
        assert status["status"] == "DEP_FAILED" and status["attempt"] == 0
        assert _events(result, name) == [("DEP_FAILED", 0)]
        assert not Path(result.output_path(name), ".marin/logs").exists()
        assert not Path(result.output_path(name), ".marin/lease.json").exists()


def test_a_step_queued_behind_a_retried_failure_runs_once_after_the_retry(ray_embedded: Any,
                                                                          marin_prefix: str,
                                                                          tmp_path: Path) -> None:
    from marin import ExecutorMainConfig, run_experiment

    counter = tmp_path / "ran.txt"
    shaky = Step(name="qretry/shaky", fn=flaky, retries=1,
                 config=FlakyConfig(output_path=this_output_path(), marker=str(tmp_path / "seen")))
    after = Step(name="qretry/after", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(counter), inputs=(output_path_of(shaky),)))
    result = run_experiment([after], ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False,
                            script="tests/qretry.py")
    assert result.status == "SUCCESS"
    assert _events(result, "qretry/shaky") == [("RUNNING", 1), ("FAILED", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert _events(result, "qretry/after") == [("RUNNING", 1), ("SUCCESS", 1)]
    assert _status(result, "qretry/after")["started"] >= _status(result, "qretry/shaky")["ended"]
    assert counter.read_text().splitlines() == [result.output_path("qretry/after")]


def test_an_attempt_that_cannot_be_pickled_fails_and_what_is_queued_behind_it_is_skipped(
    ray_embedded: Any, tmp_path: Path
) -> None:
    import queue
    import threading

    from marin.execution.attempt import Outcome, Task
    from marin.execution.backend import AttemptDone, Completions
    from marin.execution.ray_backend import RayBackend
    from tests.marin.fns import NoopConfig, noop

    completions: Completions = queue.SimpleQueue()
    backend = RayBackend(completions)

    def task(key: str, config: Any, after: tuple[str, ...] = ()) -> Task:
        return Task(key=key, name=f"pickle/{key}", fn=noop, config=config,
                    log_path=str(tmp_path / key / "a.log"),
                    env={}, resources=Resources(), attempt=1, after=after)

    backend.submit(task("bad", threading.Lock()))  # a lock cannot be pickled
    backend.submit(task("after", NoopConfig(str(tmp_path / "after")), after=("bad",)))
    results = {}
    for _ in range(2):
        done = completions.get(timeout=120)
        assert isinstance(done, AttemptDone)
        results[done.key] = done.result
    assert not results["bad"].ok and results["bad"].outcome is not Outcome.PREEMPTED
    assert results["bad"].message.startswith("cannot send the step to a Ray worker: cannot pickle")
    assert results["after"].outcome is Outcome.SKIPPED and not (tmp_path / "after").exists()
