"""`--force-run STEP`: a step that succeeded runs again, with every step that depends on it, as new attempts
(earlier logs kept); names are exact and an unknown one is an error listing the steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin import Step, output_path_of, this_output_path
from marin.execution.argv import parse_flags
from marin.execution.inputs import name_producer, producer_of
from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers

Run = Callable[..., Any]


def _steps() -> tuple[Step, Step, Step]:
    numbers = Step(name="fr/numbers", fn=write_numbers,
                   config=WriteConfig(output_path=this_output_path(), n=10))
    total = Step(name="fr/total", fn=sum_numbers,
                 config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                                  output_path=this_output_path()))
    other = Step(name="fr/other", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=3))
    return numbers, total, other


def test_force_run_reruns_the_step_and_its_dependents_as_new_attempts(run_marin: Run) -> None:
    numbers, total, other = _steps()
    assert run_marin([total, other]).status == "SUCCESS"
    skipped = run_marin([total, other])
    assert {e.name: e.action for e in skipped.plan.entries} == {
        "fr/numbers": "skip", "fr/total": "skip", "fr/other": "skip"}

    forced = run_marin([total, other], force_run=["fr/numbers"])
    entries = {e.name: e for e in forced.plan.entries}
    assert {n: (e.action, e.forced) for n, e in entries.items()} == {
        "fr/numbers": ("run", True), "fr/total": ("run", True), "fr/other": ("skip", False)}
    assert {s["name"]: s["forced"] for s in forced.plan.to_json()["steps"]} == {
        "fr/numbers": True, "fr/total": True, "fr/other": False}
    assert entries["fr/numbers"].reason == "forced by --force-run: success before (attempt 1); re-running"
    assert entries["fr/total"].reason.startswith("dependency fr/numbers is forced to re-run (--force-run)")
    assert forced.status == "SUCCESS"
    for name in ("fr/numbers", "fr/total"):
        path = Path(forced.output_path(name))
        assert json.loads((path / ".marin/status.json").read_text())["attempt"] == 2
        assert (path / ".marin/logs/attempt-1.log").exists() and (path / ".marin/logs/attempt-2.log").exists()
        events = [json.loads(x)["event"] for x in (path / ".marin/events.jsonl").read_text().splitlines()]
        assert events == ["RUNNING", "SUCCESS", "RUNNING", "SUCCESS"]
    other_status = json.loads((Path(forced.output_path("fr/other")) / ".marin/status.json").read_text())
    assert other_status["attempt"] == 1

    only_total = run_marin([total, other], force_run=["fr/total"])
    assert {e.name: e.action for e in only_total.plan.entries} == {
        "fr/numbers": "skip", "fr/total": "run", "fr/other": "skip"}


def test_force_run_names_are_exact_and_an_unknown_one_lists_the_steps(run_marin: Run) -> None:
    _, total, other = _steps()
    with pytest.raises(ValueError, match=r"--force-run fr/num: no such step .*fr/numbers, fr/other, fr/tot"):
        run_marin([total, other], force_run=["fr/num"])


def test_force_run_combines_with_run_only_inside_its_selection_and_refuses_a_step_outside_it(
        run_marin: Run) -> None:
    """`--run-only fr/total --force-run fr/numbers`: numbers is a dependency of total, so both re-run and
    fr/other stays out of the run. `--run-only fr/other --force-run fr/numbers` contradicts itself (numbers
    is not in what run-only selects): an error naming both flags and the fix, nothing run."""
    numbers, total, other = _steps()
    first = run_marin([total, other])
    assert first.status == "SUCCESS"
    both = run_marin([total, other], run_only=["fr/total"], force_run=["fr/numbers"])
    assert {e.name: (e.action, e.forced) for e in both.plan.entries} == {
        "fr/numbers": ("run", True), "fr/total": ("run", True)}
    assert both.status == "SUCCESS"
    other_status = Path(first.output_path("fr/other")) / ".marin/status.json"
    assert json.loads(other_status.read_text())["attempt"] == 1
    inside = run_marin([total, other], run_only=["fr/numbers"], force_run=["fr/numbers"])
    assert {e.name: (e.action, e.forced) for e in inside.plan.entries} == {"fr/numbers": ("run", True)}
    with pytest.raises(ValueError, match=(
            r"--force-run fr/numbers: not among the steps --run-only fr/other selects .* "
            r"add it to --run-only "
            r"\(--run-only fr/other fr/numbers\) or leave out --run-only or --force-run fr/numbers")):
        run_marin([total, other], run_only=["fr/other"], force_run=["fr/numbers"])
    numbers_status = json.loads((Path(inside.output_path("fr/numbers")) / ".marin/status.json").read_text())
    assert numbers_status["attempt"] == 3  # the refused run ran nothing


def test_the_flag_takes_several_names() -> None:
    assert parse_flags(["--force-run", "a/x", "b"]).force_run == ["a/x", "b"]
    assert parse_flags(["--force-run=a/x"]).force_run == ["a/x"]
    assert parse_flags([]).force_run is None


class _Unreadable(Exception):
    def __init__(self, input_path: str) -> None:
        super().__init__(f"cannot read {input_path}")
        self.input_path = input_path


def test_an_unreadable_input_is_traced_to_the_dependency_that_wrote_it() -> None:
    import pickle

    deps = [("a/train", "/p/a/train-12345678"), ("a/tok", "/p/a/tok-87654321")]
    assert producer_of("/p/a/train-12345678/checkpoints/6", deps) == "a/train"
    assert producer_of("/p/a/train-12345678", deps) == "a/train"
    assert producer_of("/p/a/train-123456789", deps) is None  # a sibling path, not under it
    error = {"type": "_Unreadable", "message": "cannot read /p/a/train-12345678/checkpoints"}
    named = name_producer(error, pickle.dumps(_Unreadable("/p/a/train-12345678/checkpoints")), deps)
    assert named["producer"] == "a/train" and "`marin run SCRIPT --force-run a/train`" in named["message"]
    assert name_producer(error, pickle.dumps(ValueError("x")), deps) == error  # no input_path: unchanged
    assert name_producer(error, pickle.dumps(_Unreadable("/elsewhere")), deps) == error
    assert name_producer(error, b"not a pickle", deps) == error
