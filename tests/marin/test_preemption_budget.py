"""Two budgets per step on embedded Ray: interruptions (here: the worker process killed under the step, as
the system kills it) draw on `max_preemptions`, failures (the function raised, or ran out of memory) on
`retries`; every attempt is the executor's own (Ray does not re-run a step task), is recorded, and an
exhausted budget says which one. Run inside scripts/netns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from marin import Step, this_output_path
from tests.marin.gang_fns import ScriptedConfig, scripted

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def _run(marin_prefix: str, tmp_path: Path, plan: tuple[str, ...], **step: Any) -> tuple[Any, str]:
    from marin import run_experiment
    from marin.execution.argv import ExecutorMainConfig

    s = Step(
        name="budget/step",
        fn=scripted,
        config=ScriptedConfig(
            output_path=this_output_path(), counter_file=str(tmp_path / "attempts"), plan=plan
        ),
        **step,
    )
    result = run_experiment(
        [s], ExecutorMainConfig(prefix=marin_prefix, backend="ray"), verbose=False, script="tests/budget.py"
    )
    return result, result.output_path("budget/step")


def _events(path: str) -> list[tuple[str, int]]:
    lines = Path(path, ".marin/events.jsonl").read_text().splitlines()
    return [(e["event"], e["attempt"]) for e in map(json.loads, lines)]


def _ledger(path: str) -> dict[str, Any]:
    return json.loads(Path(path, ".marin/interruptions.json").read_text())


def test_interruptions_are_retried_apart_from_failures(
    ray_embedded: Any, marin_prefix: str, tmp_path: Path
) -> None:
    # killed twice, then it raises: retries=0 still allows no failure, whatever the preemptions were
    result, path = _run(marin_prefix, tmp_path, ("kill", "kill", "raise"), max_preemptions=5)
    assert result.status_of("budget/step") == "FAILED"
    assert _events(path) == [
        ("RUNNING", 1),
        ("PREEMPTED", 1),
        ("RUNNING", 2),
        ("PREEMPTED", 2),
        ("RUNNING", 3),
        ("FAILED", 3),
    ]
    ledger = _ledger(path)
    assert [e["cause"] for e in ledger["interruptions"]] == ["preempted", "preempted"]
    assert [e["resumed_attempt"] for e in ledger["interruptions"]] == [2, 3]
    assert (tmp_path / "attempts").read_text().split() == ["1", "2", "3"]  # each one an executor attempt


def test_an_exhausted_preemption_budget_is_reported(
    ray_embedded: Any, marin_prefix: str, tmp_path: Path
) -> None:
    result, path = _run(marin_prefix, tmp_path, ("kill",), max_preemptions=1, retries=3)
    assert result.status_of("budget/step") == "PREEMPTED"
    status = json.loads(Path(path, ".marin/status.json").read_text())
    assert (
        status["attempt"] == 2
        and "preemption budget exhausted (max_preemptions=1)" in status["error"]["message"]
    )
    assert [e for e, _ in _events(path)].count("PREEMPTED") == 2  # retries=3 was not spent on preemptions
    assert _ledger(path)["totals"]["count"] == 2


def test_out_of_memory_is_a_failure_with_its_own_cause(
    ray_embedded: Any, marin_prefix: str, tmp_path: Path
) -> None:
    result, path = _run(marin_prefix, tmp_path, ("oom", "ok"), retries=1)
    assert result.status_of("budget/step") == "SUCCESS"
    failed = [
        json.loads(line)
        for line in Path(path, ".marin/events.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "FAILED"
    ]
    assert len(failed) == 1 and failed[0]["cause"] == "oom" and "out of memory" in failed[0]["message"]
    assert not Path(path, ".marin/interruptions.json").exists()  # a failure is not an interruption
