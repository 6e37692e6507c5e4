"""A run whose every step is already settled never starts (or joins) Ray: a re-run of a finished experiment
must take seconds on the default backend too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marin import Step, output_path_of, this_output_path
from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers


def test_fully_skipped_run_does_not_start_the_ray_backend(run_marin: Callable[..., Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    numbers = Step(name="settled/numbers", fn=write_numbers,
                   config=WriteConfig(output_path=this_output_path()))
    total = Step(name="settled/total", fn=sum_numbers,
                 config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                                  output_path=this_output_path()))
    assert run_marin([total]).status == "SUCCESS"

    from marin.execution import ray_backend

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the Ray backend was started for a run with nothing to submit")

    monkeypatch.setattr(ray_backend.RayBackend, "__init__", refuse)
    again = run_marin([total], backend="ray")
    assert again.status == "SUCCESS"
    assert {st.note for st in again.steps.values()} == {"reused"}
