"""The executor on the local backend: status files, skips, failures, retries, run-only, dry runs,
publishers."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin import (
    ExperimentFailedError,
    Step,
    StepFailedError,
    executor_main,
    output_path_of,
    this_output_path,
)
from marin.status import publisher as pubmod
from marin.status.publisher import RunContext, RunView
from tests.marin.fns import (
    CountConfig,
    EnvConfig,
    FailConfig,
    FlakyConfig,
    SumConfig,
    WriteConfig,
    count_and_write,
    fail,
    flaky,
    sum_numbers,
    write_env,
    write_numbers,
)

Run = Callable[..., Any]


def two_steps(n: int = 10) -> tuple[Step, Step]:
    numbers = Step(name="demo/numbers", fn=write_numbers,
                   config=WriteConfig(output_path=this_output_path(), n=n))
    total = Step(name="demo/total", fn=sum_numbers,
                 config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                                  output_path=this_output_path()))
    return numbers, total


def meta(output_path: str, name: str) -> Any:
    text = Path(output_path, ".marin", name).read_text()
    return [json.loads(x) for x in text.splitlines()] if name.endswith(".jsonl") else json.loads(text)


def test_two_step_run_resolves_placeholders_and_writes_the_status_contract(run_marin: Run,
                                                                           marin_prefix: str) -> None:
    numbers, total = two_steps()
    result = run_marin([total], description="two-step demo", issue="openlab/demo#12")
    assert result.status == "SUCCESS"
    n_path, t_path = result.output_path("demo/numbers"), result.output_path("demo/total")
    assert n_path == f"{marin_prefix}/demo/numbers-{result.plan.entries[0].hash[:8]}"
    assert Path(t_path, "total.txt").read_text() == "45\n"

    status = meta(t_path, "status.json")
    assert set(status) == {"name", "hash", "status", "attempt", "run_id", "executor", "created", "updated",
                           "started",
                           "ended", "error", "log", "outputs"}  # outputs: the manifest summary (issue 35)
    assert (status["status"], status["attempt"], status["error"], status["log"]) == ("SUCCESS", 1, None,
                                                                                     "logs/attempt-1.log")
    assert [e["event"] for e in meta(t_path, "events.jsonl")] == ["RUNNING", "SUCCESS"]
    info = meta(t_path, "step.json")
    assert info["config"] == {"input_path": f"{n_path}/numbers.txt", "output_path": t_path}
    assert info["identity"]["config"]["input_path"]["$dep"] == result.plan.entries[0].hash
    assert info["dependencies"] == [{"name": "demo/numbers", "hash": result.plan.entries[0].hash,
                                     "output_path": n_path}]
    assert info["fn"] == "tests.marin.fns:sum_numbers" and info["config_class"] == "tests.marin.fns:SumConfig"
    assert info["issue"] == "openlab/demo#12" and info["experiment"] == result.experiment_id
    assert len(info["fn_source_hash"]) == 64 and info["host"] and info["user"]
    assert "total=45" in Path(t_path, ".marin/logs/attempt-1.log").read_text()
    assert not Path(t_path, ".marin/lease.json").exists()  # released after the final status

    manifest = json.loads(Path(marin_prefix, "experiments", f"{result.experiment_id}.json").read_text())
    assert result.experiment_id.startswith("experiment_under_test-")
    assert [s["name"] for s in manifest["steps"]] == ["demo/numbers", "demo/total"]
    assert manifest["description"] == "two-step demo" and manifest["issue"] == "openlab/demo#12"
    assert manifest["runs"][-1]["status"] == "SUCCESS" and manifest["runs"][-1]["run_id"] == result.run_id


def test_rerun_skips_succeeded_steps_and_rewrites_nothing(run_marin: Run, marin_prefix: str,
                                                          tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    step = Step(name="once/x", fn=count_and_write, config=CountConfig(output_path=this_output_path(),
                                                                      counter_file=str(counter)))
    run_marin([step])
    files = [p for p in Path(marin_prefix).rglob("*") if p.is_file() and "experiments" not in p.parts]
    before = {p: p.stat().st_mtime_ns for p in files}
    second = run_marin([step])
    assert second.status == "SUCCESS" and second.plan.entries[0].action == "skip"
    assert counter.read_text().count("\n") == 1
    assert {p: p.stat().st_mtime_ns for p in files} == before


def test_run_only_runs_matching_steps_and_their_dependencies(run_marin: Run, tmp_path: Path) -> None:
    counter = str(tmp_path / "c.txt")

    def s(name: str, *deps: Step) -> Step:
        return Step(name=name, fn=count_and_write, config=CountConfig(
            output_path=this_output_path(), counter_file=counter,
            inputs=tuple(output_path_of(d) for d in deps)))

    a = s("g/a")
    b = s("g/b", a)
    c = s("g/c", b)
    other = s("h/other")
    result = run_marin([c, other], run_only=["g/b$"])
    ran = sorted(Path(line).name.rsplit("-", 1)[0] for line in Path(counter).read_text().split())
    assert ran == ["a", "b"]
    assert result.plan.not_selected == 2
    both = run_marin([c, other], run_only=["g/c", "other"])
    assert both.status == "SUCCESS" and {e.name: e.action for e in both.plan.entries} == {
        "g/b": "skip", "g/c": "run", "h/other": "run"}


def test_failure_marks_dependents_and_lets_independent_branches_finish(run_marin: Run,
                                                                       tmp_path: Path) -> None:
    bad = Step(name="f/bad", fn=fail, config=FailConfig(output_path=this_output_path(), message="no good"))
    child = Step(name="f/child", fn=write_numbers, config=WriteConfig(output_path=output_path_of(bad, "x")))
    grandchild = Step(name="f/grandchild", fn=write_numbers,
                      config=WriteConfig(output_path=this_output_path(), n=output_path_of(child)))
    _, fine = two_steps()
    result = run_marin([grandchild, fine])
    assert result.status == "FAILED"
    assert {n: result.status_of(n) for n in ("f/bad", "f/child", "f/grandchild", "demo/total")} == {
        "f/bad": "FAILED", "f/child": "DEP_FAILED", "f/grandchild": "DEP_FAILED", "demo/total": "SUCCESS"}
    bad_path = result.output_path("f/bad")
    status = meta(bad_path, "status.json")
    assert status["error"]["type"] == "ValueError" and status["error"]["message"] == "no good"
    assert "Traceback" in status["error"]["traceback"] and "raise ValueError" in status["error"]["traceback"]
    assert "about to fail" in Path(bad_path, ".marin/logs/attempt-1.log").read_text()
    dep = meta(result.output_path("f/child"), "status.json")
    assert dep["status"] == "DEP_FAILED" and dep["error"]["dependency"] == "f/" + Path(bad_path).name
    assert f"f/bad ({status['hash'][:8]}): ValueError: no good" in result.summary
    assert f"log: {bad_path}/.marin/logs/attempt-1.log" in result.summary
    [failure] = result.failures
    assert isinstance(failure, StepFailedError) and isinstance(failure.__cause__, ValueError)

    again = run_marin([grandchild, fine])
    assert {e.name: e.action for e in again.plan.entries}["f/bad"] == "failed"
    assert {e.name: e.action for e in again.plan.entries}["f/grandchild"] == "blocked"
    assert again.status == "FAILED" and "--force-run-failed" in again.plan.entries[0].reason + again.summary

    forced = run_marin([grandchild], force_run_failed=True)
    assert forced.status_of("f/bad") == "FAILED" and meta(bad_path, "status.json")["attempt"] == 2
    assert Path(bad_path, ".marin/logs/attempt-2.log").exists()


def test_executor_main_raises_with_the_chain_to_the_user_error(marin_prefix: str) -> None:
    bad = Step(name="f/bad", fn=fail, config=FailConfig(output_path=this_output_path(), message="chained"))
    with pytest.raises(ExperimentFailedError) as info:
        executor_main([bad], argv=["--prefix", marin_prefix, "--backend", "local"])
    assert "f/bad" in str(info.value) and "attempt-1.log" in str(info.value)
    step_error = info.value.__cause__
    assert isinstance(step_error, StepFailedError) and step_error.name == "f/bad"
    assert isinstance(step_error.__cause__, ValueError) and str(step_error.__cause__) == "chained"


def test_retries_make_new_attempts_with_their_own_logs(run_marin: Run, tmp_path: Path) -> None:
    step = Step(name="r/flaky", fn=flaky, retries=1,
                config=FlakyConfig(output_path=this_output_path(), marker=str(tmp_path / "marker")))
    result = run_marin([step])
    path = result.output_path("r/flaky")
    assert result.status == "SUCCESS" and meta(path, "status.json")["attempt"] == 2
    assert [e["event"] for e in meta(path, "events.jsonl")] == ["RUNNING", "FAILED", "RUNNING", "SUCCESS"]
    assert "first attempt fails" in Path(path, ".marin/logs/attempt-1.log").read_text()
    assert Path(path, ".marin/logs/attempt-2.log").exists()


def test_status_created_is_the_steps_first_record_in_every_attempt(run_marin: Run, tmp_path: Path) -> None:
    """`created` in status.json is the time of the step's first record, kept by the FAILED of attempt 1 and
    the RUNNING and SUCCESS of attempt 2 (a step's wall time and goodput are measured from it)."""
    step = Step(name="r/flaky", fn=flaky, retries=1,
                config=FlakyConfig(output_path=this_output_path(), marker=str(tmp_path / "marker")))
    path = run_marin([step]).output_path("r/flaky")
    status, events = meta(path, "status.json"), meta(path, "events.jsonl")
    assert status["created"] <= events[0]["ts"] + 0.5  # when the first RUNNING was written, not later
    assert status["ended"] - status["created"] >= status["ended"] - events[0]["ts"] - 0.5
    assert status["created"] < events[2]["ts"]  # older than the second attempt's RUNNING


def test_dry_run_writes_nothing(run_marin: Run, marin_prefix: str) -> None:
    _, total = two_steps()
    result = run_marin([total], dry_run=True)
    assert result.status == "DRY_RUN" and [e.action for e in result.plan.entries] == ["run", "run"]
    assert list(Path(marin_prefix).iterdir()) == []


def test_plan_explains_changes_field_by_field(run_marin: Run) -> None:
    _, total10 = two_steps(n=10)
    run_marin([total10])
    _, total20 = two_steps(n=20)
    plan = run_marin([total20], dry_run=True).plan.to_json()
    by_name = {s["name"]: s for s in plan["steps"]}
    assert by_name["demo/numbers"]["action"] == "run"
    assert "config.n: 10 -> 20" in by_name["demo/numbers"]["changed"]
    assert "dependency demo/numbers changed: config.n: 10 -> 20" in by_name["demo/total"]["changed"]
    assert all(not c.startswith("config.") for c in by_name["demo/total"]["changed"])
    first_hashes = {e.name: e.hash for e in run_marin([total10], dry_run=True).plan.entries}
    assert by_name["demo/total"]["previous_hash"] == first_hashes["demo/total"]


def test_plan_warns_about_code_drift(run_marin: Run) -> None:
    _, total = two_steps()
    first = run_marin([total])
    path = first.output_path("demo/total")
    info = meta(path, "step.json")
    info["fn_source_hash"] = "0" * 64  # as if the function's source had been edited since
    Path(path, ".marin/step.json").write_text(json.dumps(info))
    entry = {e.name: e for e in run_marin([total], dry_run=True).plan.entries}["demo/total"]
    assert entry.action == "skip" and entry.hash == first.plan.entries[1].hash
    assert any("code drift" in w and "version=" in w for w in entry.warnings)


def test_step_env_reaches_the_function(run_marin: Run) -> None:
    step = Step(name="e/env", fn=write_env, env={"MARIN_TEST_VAR": "hello"},
                config=EnvConfig(output_path=this_output_path()))
    result = run_marin([step])
    assert Path(result.output_path("e/env"), "env.txt").read_text() == "hello"
    assert "MARIN_TEST_VAR" not in os.environ


class RecordingPublisher:
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[RunView, bool]] = []

    def publish(self, run: RunView, final: bool) -> None:
        self.calls.append((run, final))


class BrokenPublisher:
    name = "broken"

    def publish(self, run: RunView, final: bool) -> None:
        raise ConnectionError("tracker unreachable")


def test_publishers_see_every_transition_and_failures_never_fail_the_run(
    run_marin: Run, marin_prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rec = RecordingPublisher()
    made: list[RunContext] = []

    def factory(ctx: RunContext) -> RecordingPublisher:
        made.append(ctx)
        return RecordingPublisher()

    monkeypatch.setattr(pubmod, "DEFAULT_PUBLISHER_FACTORIES", [factory])
    # only `factory`, no issue publisher
    monkeypatch.setattr(pubmod, "entry_point_factories", lambda: ((), ()))
    monkeypatch.setenv("MARIN_ISSUE_REPO", "openlab/platform")
    # a first step that stays RUNNING longer than the publishing interval, so a RUNNING view must be published
    numbers = Step(name="demo/numbers", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(tmp_path / "ran.txt"), sleep_s=0.6))
    total = Step(name="demo/total", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(tmp_path / "ran.txt"),
        inputs=(output_path_of(numbers),)))
    result = run_marin([total], publishers=[rec, BrokenPublisher()], script="experiments/exp42_demo.py")
    assert result.status == "SUCCESS"
    assert made and made[0].issue == "openlab/platform#42" and made[0].experiment_id == result.experiment_id
    finals = [v for v, final in rec.calls if final]
    assert len(finals) == 1 and rec.calls[-1][1] is True
    last = finals[0]
    assert last.status == "SUCCESS" and last.issue == "openlab/platform#42"
    assert [(s.name, s.status, s.attempt) for s in last.steps] == [("demo/numbers", "SUCCESS", 1),
                                                                   ("demo/total", "SUCCESS", 1)]
    assert last.steps[1].dependencies == (last.steps[0].hash,)
    assert last.steps[1].log_path and last.steps[1].log_path.endswith("attempt-1.log")
    seen = [(s.name, s.status) for v, _ in rec.calls for s in v.steps]
    assert ("demo/numbers", "RUNNING") in seen and ("demo/total", "WAITING") in seen
    assert result.publisher_errors and result.publisher_errors[0]["publisher"] == "broken"
    assert "publisher broken failed" in result.summary and "tracker unreachable" in result.summary
    manifest = json.loads(Path(marin_prefix, "experiments", f"{result.experiment_id}.json").read_text())
    assert manifest["issue"] == "openlab/platform#42"
    assert "ConnectionError: tracker unreachable" in manifest["runs"][-1]["publisher_errors"][0]["error"]


def test_mixed_run_fixture_holds_every_state(mixed_run: Any) -> None:
    from marin.status.files import read_status
    from marin.storage import storage_for

    storage = storage_for(mixed_run.prefix)
    found = {}
    for status_file in Path(mixed_run.prefix).rglob("status.json"):
        data = read_status(storage, str(status_file.parent.parent))
        found[data["name"]] = data["status"]
    assert found == {"mixed/ok": "SUCCESS", "mixed/bad": "FAILED", "mixed/child": "DEP_FAILED",
                     "mixed/slow": "RUNNING"}
    result = mixed_run.release()
    assert result.status == "FAILED" and result.status_of("mixed/slow") == "SUCCESS"


def test_max_concurrent_one_runs_independent_steps_one_at_a_time(run_marin: Run, tmp_path: Path) -> None:
    counter = str(tmp_path / "c.txt")
    steps = [Step(name=f"m/s{i}", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter, sleep_s=0.1)) for i in range(3)]
    result = run_marin(steps, max_concurrent=1)
    assert result.status == "SUCCESS"
    spans = sorted((st.started, st.ended) for st in result.steps.values())
    assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False))


def test_deleting_an_output_directory_reruns_that_step(run_marin: Run, tmp_path: Path) -> None:
    import shutil

    counter = tmp_path / "counter.txt"
    step = Step(name="del/x", fn=count_and_write, config=CountConfig(output_path=this_output_path(),
                                                                     counter_file=str(counter)))
    first = run_marin([step])
    shutil.rmtree(first.output_path("del/x"))  # the documented way to force a re-run of one step
    second = run_marin([step])  # same process: cached directory knowledge must not get in the way
    assert second.status == "SUCCESS" and second.plan.entries[0].action == "run"
    assert counter.read_text().count("\n") == 2
    assert Path(second.output_path("del/x"), "done.txt").exists()


def test_a_dying_worker_is_reported_and_replaced(run_marin: Run) -> None:
    from tests.marin.fns import DieConfig, die

    # max_preemptions=0: a worker killed by a signal is an interruption, re-run up to 100 times by default
    killed = Step(name="die/killed", fn=die, config=DieConfig(output_path=this_output_path(), how="kill"),
                  max_preemptions=0)
    exited = Step(name="die/exited", fn=die, config=DieConfig(output_path=this_output_path(), how="exit"))
    after = [Step(name=f"die/after{i}", fn=write_numbers,
                  config=WriteConfig(output_path=this_output_path(), n=i))
             for i in range(4)]
    result = run_marin([killed, exited, *after], max_concurrent=2)
    assert result.status_of("die/killed") == "PREEMPTED"  # killed by a signal: not the step's own fault
    assert result.status_of("die/exited") == "FAILED"
    assert all(result.status_of(f"die/after{i}") == "SUCCESS" for i in range(4))  # fresh workers took over
    status = meta(result.output_path("die/killed"), "status.json")
    assert status["error"]["type"] == "WorkerDied" and "signal 9" in status["error"]["message"]
    assert "exited with code 3" in meta(result.output_path("die/exited"), "status.json")["error"]["message"]
    assert "dying now" in Path(result.output_path("die/killed"), ".marin/logs/attempt-1.log").read_text()
    again = run_marin([killed], dry_run=True)
    assert again.plan.entries[0].action == "run" and "preempted" in again.plan.entries[0].reason


def test_views_are_published_at_most_every_interval_however_many_steps_change(
    run_marin: Run, tmp_path: Path
) -> None:
    """A view lists every step: one per transition would make a 1,000-step run quadratic. Above
    VIEW_EVERY_TRANSITION_MAX_STEPS steps, views are coalesced to one per VIEW_INTERVAL_S."""
    from marin.execution.views import VIEW_EVERY_TRANSITION_MAX_STEPS, VIEW_INTERVAL_S

    rec = RecordingPublisher()
    root = Step(name="many/root", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(tmp_path / "ran.txt")))
    leaves = [Step(name=f"many/leaf{i}", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=str(tmp_path / "ran.txt"),
        inputs=(output_path_of(root),)))
        for i in range(150)]
    assert len(leaves) + 1 > VIEW_EVERY_TRANSITION_MAX_STEPS
    t0 = time.monotonic()
    result = run_marin(leaves, publishers=[rec], script="experiments/exp7_many.py")
    wall_s = time.monotonic() - t0
    assert result.status == "SUCCESS"
    interim = [v for v, final in rec.calls if not final]
    assert interim and rec.calls[-1][1] is True
    assert len(interim) <= 2 + wall_s / VIEW_INTERVAL_S  # 302 transitions, a handful of views
    assert all(s.status == "SUCCESS" for s in rec.calls[-1][0].steps)


def test_steps_of_a_fraction_of_a_cpu_run_more_at_once_than_the_cpus(run_marin: Run, tmp_path: Path) -> None:
    """The local default concurrency follows what the steps ask (as Ray packs a node): 1/16 CPU each, more
    than the machine's CPUs run at once; steps of the default 1 CPU keep the number of CPUs."""
    from marin.execution.argv import LOCAL_MAX_CONCURRENCY, ExecutorMainConfig

    cpus = os.cpu_count() or 1
    local = ExecutorMainConfig(backend="local")
    assert local.concurrency_limit([1.0, 2.0]) == cpus and local.concurrency_limit() == cpus
    assert local.concurrency_limit([1.0, 1 / 16]) == max(cpus, min(16 * cpus, LOCAL_MAX_CONCURRENCY))
    assert local.concurrency_limit([0.0]) == max(cpus, LOCAL_MAX_CONCURRENCY)
    assert ExecutorMainConfig(backend="local", max_concurrent=3).concurrency_limit([0.0]) == 3
    assert ExecutorMainConfig(backend="ray").concurrency_limit([1.0]) >= 100_000
    n = cpus + 3
    steps = [Step(name=f"frac/s{i}", fn=count_and_write, resources={"num_cpus": 1 / 16},
                  config=CountConfig(output_path=this_output_path(), counter_file=str(tmp_path / f"c{i}"),
                                     sleep_s=1.5)) for i in range(n)]
    result = run_marin(steps)
    assert result.status == "SUCCESS"
    spans = [(st.started, st.ended) for st in result.steps.values()]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most > cpus, spans
