"""The executor's queued attempts (what the Ray backend does), driven by a deterministic in-process backend
that runs an attempt as soon as the attempts it is queued behind have results, and then reports the results of
a burst in *reverse* order: a dependent's result reaches the executor before its dependency's, which is the
order the executor must cope with on a real cluster."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from marin.execution import main as marin_main
from marin.execution import worker
from marin.execution.attempt import AttemptResult, Outcome, Task
from marin.execution.backend import AttemptDone, Completions
from marin.execution.worker import execute_step
from tests.marin.fns import CountConfig, FailConfig, FlakyConfig, count_and_write, fail, flaky


class ReversingQueueBackend:
    """Runs attempts in this process once their `after` attempts have results; reports each burst reversed."""

    name = "reversing"
    queues_behind_dependencies = True

    def __init__(self, completions: Completions) -> None:
        self.completions = completions
        # (step name, attempt, names queued behind)
        self.submitted: list[tuple[str, int, tuple[str, ...]]] = []
        self._names: dict[str, str] = {}
        self._results: dict[str, AttemptResult] = {}
        self._pending: list[Task] = []
        self._burst: list[AttemptDone] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self._flusher.start()

    def check_resources(self, tasks: list[tuple[str, Any]]) -> None:
        pass

    def submit(self, task: Task) -> None:
        self._names[task.key] = task.name
        self.submitted.append((task.name, task.attempt, tuple(self._names[k] for k in task.after)))
        self._results.pop(task.key, None)  # a new attempt: whatever is queued behind it waits for this one
        self._pending.append(task)
        progressed = True
        while progressed:
            progressed = False
            for t in list(self._pending):
                if all(k in self._results for k in t.after):
                    self._pending.remove(t)
                    result = self._execute(t)
                    self._results[t.key] = result
                    with self._lock:
                        self._burst.append(AttemptDone(t.key, t.attempt, result))
                    progressed = True

    def _execute(self, t: Task) -> AttemptResult:
        return execute_step(t.fn, t.config, t.log_path, t.env, t.record, *[self._results[k] for k in t.after])

    def _flush_loop(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                burst, self._burst = self._burst, []
            for item in reversed(burst):
                self.completions.put(item)

    def forget(self, key: str) -> None:
        pass

    def cancel(self, key: str) -> None:
        self._pending = [t for t in self._pending if t.key != key]

    def shutdown(self) -> None:
        self._stop.set()
        self._flusher.join(timeout=5)


class CrashingQueueBackend(ReversingQueueBackend):
    """Like ReversingQueueBackend, but the first attempt of `q/b` dies after its worker wrote RUNNING, the way
    a Ray worker process that is killed mid-step fails: Ray reports an error and no start time."""

    def _execute(self, t: Task) -> AttemptResult:
        if t.name == "q/b" and t.attempt == 1:
            assert t.record is not None
            worker._record_start(t.record, time.time())
            return AttemptResult.from_exception(RuntimeError("the worker died"), outcome=Outcome.PREEMPTED)
        return super()._execute(t)


@pytest.fixture
def reversing(monkeypatch: pytest.MonkeyPatch) -> list[ReversingQueueBackend]:
    made: list[ReversingQueueBackend] = []

    def make(backend: str, completions: Completions, ray_address: str | None) -> Any:
        made.append(ReversingQueueBackend(completions))
        return made[-1]

    monkeypatch.setattr(marin_main, "_make_backend", make)
    return made


def _events(result: Any, name: str) -> list[tuple[str, int]]:
    path = Path(result.output_path(name), ".marin/events.jsonl")
    return [(e["event"], e["attempt"]) for e in map(json.loads, path.read_text().splitlines())]


def _status(result: Any, name: str) -> dict[str, Any]:
    return json.loads(Path(result.output_path(name), ".marin/status.json").read_text())


def _chain(tmp_path: Path, first: Step) -> tuple[Step, Step]:
    counter = str(tmp_path / "ran.txt")
    b = Step(name="q/b", fn=count_and_write,
             config=CountConfig(output_path=this_output_path(), counter_file=counter,
                                                                inputs=(output_path_of(first),)))
    c = Step(name="q/c", fn=count_and_write,
             config=CountConfig(output_path=this_output_path(), counter_file=counter,
                                                                inputs=(output_path_of(b),)))
    return b, c


def test_a_chain_is_queued_at_once_and_results_arriving_out_of_order_are_handled_in_order(
        reversing: list[ReversingQueueBackend], tmp_path: Path) -> None:
    counter = str(tmp_path / "ran.txt")
    a = Step(name="q/a", fn=count_and_write,
             config=CountConfig(output_path=this_output_path(), counter_file=counter))
    b, c = _chain(tmp_path, a)
    result = run_experiment([c],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               max_concurrent=8),
                            verbose=False, script="q.py")
    assert result.status == "SUCCESS"
    [backend] = reversing
    assert backend.submitted == [("q/a", 1, ()), ("q/b", 1, ("q/a",)), ("q/c", 1, ("q/b",))]
    for name in ("q/a", "q/b", "q/c"):
        assert _events(result, name) == [("RUNNING", 1), ("SUCCESS", 1)]
        assert _status(result, name)["status"] == "SUCCESS"
        assert not Path(result.output_path(name), ".marin/lease.json").exists()
    assert (tmp_path / "ran.txt").read_text().splitlines() == [result.output_path(n) for n in ("q/a", "q/b",
                                                                                               "q/c")]


def test_a_step_with_many_dependencies_is_submitted_once_they_succeeded_not_queued_behind_them(
        reversing: list[ReversingQueueBackend], tmp_path: Path) -> None:
    from marin.execution.executor import QUEUE_BEHIND_MAX_DEPENDENCIES

    counter = str(tmp_path / "ran.txt")
    root = Step(name="q/root", fn=count_and_write, config=CountConfig(output_path=this_output_path(),
                                                                      counter_file=counter))
    middles = [Step(name=f"q/m{i}", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter, inputs=(output_path_of(root),)))
        for i in range(QUEUE_BEHIND_MAX_DEPENDENCIES + 1)]
    few = Step(name="q/few", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter,
        inputs=tuple(output_path_of(m) for m in middles[:QUEUE_BEHIND_MAX_DEPENDENCIES])))
    many = Step(name="q/many", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter,
        inputs=tuple(output_path_of(m) for m in middles)))
    result = run_experiment([few, many],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               max_concurrent=64),
                            verbose=False, script="q.py")
    assert result.status == "SUCCESS"
    [backend] = reversing
    submitted = {name: after for name, _, after in backend.submitted}
    assert set(submitted["q/few"]) == {m.name for m in middles[:QUEUE_BEHIND_MAX_DEPENDENCIES]}
    assert submitted["q/many"] == ()  # submitted after its dependencies' results were handled
    order = [name for name, _, _ in backend.submitted]
    assert order.index("q/many") > max(order.index(m.name) for m in middles)
    ran = (tmp_path / "ran.txt").read_text().splitlines()
    assert ran.count(result.output_path("q/many")) == 1 and ran[-1] in (result.output_path("q/many"),
                                                                         result.output_path("q/few"))


def test_attempts_queued_behind_a_retried_failure_are_submitted_again_and_run_once(
        reversing: list[ReversingQueueBackend], tmp_path: Path) -> None:
    a = Step(name="q/a", fn=flaky, retries=1, config=FlakyConfig(output_path=this_output_path(),
                                                                   marker=str(tmp_path / "seen")))
    b, c = _chain(tmp_path, a)
    t0 = time.time()
    result = run_experiment([c],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               max_concurrent=8),
                            verbose=False, script="q.py")
    assert result.status == "SUCCESS", result.summary
    [backend] = reversing
    # b and c were queued behind a's first attempt, saw it fail without running, and were submitted again once
    # a
    # succeeded: still as their first attempt, since they never ran.
    assert backend.submitted[:3] == [("q/a", 1, ()), ("q/b", 1, ("q/a",)), ("q/c", 1, ("q/b",))]
    assert ("q/a", 2, ()) in backend.submitted
    assert backend.submitted.count(("q/b", 1, ())) == 1
    assert _events(result, "q/a") == [("RUNNING", 1), ("FAILED", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    for name in ("q/b", "q/c"):
        assert _events(result, name) == [("RUNNING", 1), ("SUCCESS", 1)]
        assert _status(result, name)["attempt"] == 1 and _status(result, name)["started"] >= t0
    assert (tmp_path / "ran.txt").read_text().splitlines() == [result.output_path(n) for n in ("q/b", "q/c")]


def test_attempts_queued_behind_a_final_failure_become_dep_failed_without_running(
        reversing: list[ReversingQueueBackend], tmp_path: Path) -> None:
    a = Step(name="q/a", fn=fail, config=FailConfig(output_path=this_output_path(), message="nope"))
    b, c = _chain(tmp_path, a)
    result = run_experiment([c],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               max_concurrent=8),
                            verbose=False, script="q.py")
    assert result.status == "FAILED"
    assert [result.status_of(n) for n in ("q/a", "q/b", "q/c")] == ["FAILED", "DEP_FAILED", "DEP_FAILED"]
    for name in ("q/b", "q/c"):
        assert _events(result, name) == [("DEP_FAILED", 0)]
        assert _status(result, name)["status"] == "DEP_FAILED"
        assert not Path(result.output_path(name), ".marin/lease.json").exists()
        assert not Path(result.output_path(name), ".marin/logs").exists()
    assert not (tmp_path / "ran.txt").exists()


def test_a_queued_attempt_whose_worker_died_after_starting_counts_as_an_attempt(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made: list[CrashingQueueBackend] = []
    monkeypatch.setattr(marin_main, "_make_backend",
                        lambda *a: made.append(CrashingQueueBackend(a[1])) or made[-1])
    counter = str(tmp_path / "ran.txt")
    a = Step(name="q/a", fn=count_and_write,
             config=CountConfig(output_path=this_output_path(), counter_file=counter))
    b = Step(name="q/b", fn=count_and_write, retries=1,
             config=CountConfig(output_path=this_output_path(), counter_file=counter,
                                inputs=(output_path_of(a),)))
    result = run_experiment([b],
                            ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local",
                                               max_concurrent=8),
                            verbose=False, script="q.py")
    assert result.status == "SUCCESS", result.summary
    [backend] = made
    # b's first attempt was queued behind a; its result (a crash after RUNNING) was held until a's was
    # handled.
    # It started, so it is a preempted attempt and the retry is attempt 2 with its own log, not attempt 1
    # again.
    assert backend.submitted == [("q/a", 1, ()), ("q/b", 1, ("q/a",)), ("q/b", 2, ())]
    assert _events(result, "q/b") == [("RUNNING", 1), ("PREEMPTED", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert _status(result, "q/b")["attempt"] == 2
    assert (tmp_path / "ran.txt").read_text().splitlines() == [result.output_path(n) for n in ("q/a", "q/b")]


class _AtOnceQueueingBackend:
    """Queues an attempt behind its dependencies like Ray, and runs whatever is runnable at once, inside
    `submit`: a dependency's result and its dependent's submission reach the loop in one batch."""

    name = "at-once"
    queues_behind_dependencies = True

    def __init__(self, completions: Completions) -> None:
        self.completions = completions
        self.results: dict[str, AttemptResult] = {}
        self.pending: list[Task] = []
        self.submitted: list[tuple[str, int]] = []

    def check_resources(self, tasks: Any) -> None:
        pass

    def submit(self, task: Task) -> None:
        self.submitted.append((task.name, task.attempt))
        self.pending.append(task)
        progressed = True
        while progressed:
            progressed = False
            for t in [t for t in self.pending if all(k in self.results for k in t.after)]:
                self.pending.remove(t)
                result = execute_step(t.fn, t.config, t.log_path, t.env, t.record,
                                      *[self.results[k] for k in t.after])
                self.results[t.key] = result
                self.completions.put(AttemptDone(t.key, t.attempt, result))
                progressed = True

    def forget(self, key: str) -> None:
        pass

    def cancel(self, key: str) -> None:
        self.pending = [t for t in self.pending if t.key != key]

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("second", ["succeeds", "fails"])
def test_a_step_whose_lease_is_being_taken_is_not_started_again_by_its_dependencys_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: str) -> None:
    """Review of issue 35's leases taken off the loop: on a queueing backend over an object store, `b`'s lease
    was being taken on a pool thread while `a`'s launch queued its dependents and took `b`'s lease again
    inline. The second take found the lease held (by this very executor): `b` then counted as waiting for
    another executor, a success of its own was reported as reused, and a failure hung the run forever."""
    from marin.storage.local import LocalStorage

    monkeypatch.setattr(LocalStorage, "is_local", False)  # leases taken off the loop, as on an object store
    backends: list[_AtOnceQueueingBackend] = []

    def make(name: str, completions: Completions, address: Any) -> _AtOnceQueueingBackend:
        backends.append(_AtOnceQueueingBackend(completions))
        return backends[-1]

    monkeypatch.setattr(marin_main, "_make_backend", make)
    counter = str(tmp_path / "ran.txt")
    a = Step(name="q/a", fn=count_and_write, config=CountConfig(output_path=this_output_path(),
                                                                counter_file=counter))
    after_a = (output_path_of(a),)
    b = (Step(name="q/b", fn=count_and_write,
              config=CountConfig(output_path=this_output_path(), counter_file=counter, inputs=after_a))
         if second == "succeeds" else
         Step(name="q/b", fn=fail, config=FailConfig(output_path=this_output_path(), inputs=after_a)))
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            config = ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local", max_concurrent=8)
            results.append(run_experiment([b], config, verbose=False, script="tests/queued.py"))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the run hung"
    assert backends[0].submitted == [("q/a", 1), ("q/b", 1)]  # each step submitted once
    assert not errors, errors
    result = results[0]
    status = json.loads(next((tmp_path / "out/q").glob("b-*/.marin/status.json")).read_text())
    if second == "succeeds":
        assert result.status == "SUCCESS" and status["status"] == "SUCCESS"
        assert [s.note for s in result.steps.values() if s.node.name == "q/b"] == ["ran"]
    else:
        assert result.status_of("q/b") == "FAILED" and status["status"] == "FAILED"
