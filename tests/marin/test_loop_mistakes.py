"""Mistakes caught early and cheaply (issue 33, item 5): one test per mistake, each asserting that the
message names the field or file at fault and the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marin import Criterion, Step, this_output_path
from marin.cli import main as marin_main
from marin.status import verdicts
from marin.storage.fs import storage_for
from tests.marin.notebook_fns import EvalConfig, write_eval

Run = Callable[..., Any]
HYPOTHESIS = "the new router lowers held-out bits per byte by at least 0.05"


def evals(base: float = 1.30, new: float = 1.29) -> tuple[Step, Step]:
    return (Step(name="eval/base", fn=write_eval, config=EvalConfig(this_output_path(), base)),
            Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), new)))


def criterion(baseline: Step, path: str = "macro.bpb", min_effect: float = 0.05) -> Criterion:
    return Criterion(metric=f"eval/new:{path}", better="lower", baseline=baseline, min_effect=min_effect)


def test_overturning_the_computed_verdict_needs_a_note(run_marin: Run, marin_prefix: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base, new = evals()  # 1.29 vs 1.30: an effect of 0.01, 0.05 needed -> did_not_work
    result = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base))
    storage = storage_for(marin_prefix)
    computed = verdicts.read_verdicts(storage, marin_prefix, result.experiment_id)
    assert computed is not None and computed["current"]["outcome"] == "did_not_work"
    argv = ["verdict", result.experiment_id, "worked", "--prefix", marin_prefix, "--no-post"]
    assert marin_main([*argv, "--note", "  "]) == 2
    err = capsys.readouterr().err
    assert "worked contradicts the computed verdict did_not_work" in err
    assert "eval/new:macro.bpb 1.29 vs 1.3" in err  # the numbers it overturns
    assert "Fix: say why with --note" in err
    after = verdicts.read_verdicts(storage, marin_prefix, result.experiment_id)
    assert after == computed  # nothing recorded
    # agreeing needs no note; overturning with a reason is recorded
    assert marin_main(["verdict", result.experiment_id, "did_not_work", "--prefix", marin_prefix,
                       "--no-post"]) == 0
    assert marin_main([*argv, "--note", "0.01 is the gain we care about at this scale"]) == 0
    doc = verdicts.read_verdicts(storage, marin_prefix, result.experiment_id) or {}
    assert doc["current"]["outcome"] == "worked" and doc["current"]["note"].startswith("0.01 is the gain")
