"""Mistakes caught early and cheaply (issue 33, item 5): one test per mistake, each asserting that the
message names the field or file at fault and the fix."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin import Criterion, Step, StepDefinitionError, this_output_path
from marin.cli import main as marin_main
from marin.status import verdicts
from marin.storage.fs import storage_for
from tests.marin.notebook_fns import DeclaredEvalConfig, EvalConfig, write_eval

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


def _script(tmp_path: Path, body: str, name: str = "exp9_typo.py") -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(body))
    return script


TRAIN_TYPO = '''
    from marin import Step, executor_main, this_output_path
    from operators.train import TrainConfig, train

    tiny = Step(name="train/typo", fn=train,
                config=TrainConfig(output_path=this_output_path(), train_cache="/nonexistent/cache",
                                   preset="tiny", model={MODEL}, overrides={OVERRIDES}, num_steps=2))
    if __name__ == "__main__":
        executor_main([tiny])
'''


@pytest.mark.parametrize(("model", "overrides", "named", "suggested"), [
    ({}, {"optimizer.lrr": 0.002}, "overrides names 'optimizer.lrr'", "did you mean 'optimizer.lr'?"),
    ({"d_modle": 64}, {}, "model names 'model.d_modle'", "did you mean 'model.d_model'?"),
], ids=["override", "model-field"])
def test_marin_plan_catches_a_config_typo_before_anything_runs(tmp_path: Path, model: dict[str, Any],
                                                               overrides: dict[str, Any], named: str,
                                                               suggested: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    body = TRAIN_TYPO.replace("{MODEL}", repr(model)).replace("{OVERRIDES}", repr(overrides))
    script = _script(tmp_path, body)
    prefix = tmp_path / "out"
    for command in ("plan", "run"):  # the same parsing for both, before anything is written
        assert marin_main([command, str(script), "--prefix", str(prefix), "--backend", "local"]) == 2
        err = capsys.readouterr().err
        assert "step train/typo" in err and "TrainConfig" in err  # the step and its config
        assert named in err and suggested in err  # the field, and the fix
        assert "Fix: correct the named field in the experiment script" in err
        assert not prefix.exists()


def test_a_criterion_metric_typo_is_caught_before_anything_runs(run_marin: Run, marin_prefix: str) -> None:
    base = Step(name="eval/base", fn=write_eval, config=DeclaredEvalConfig(this_output_path(), 1.3))
    new = Step(name="eval/new", fn=write_eval, config=DeclaredEvalConfig(this_output_path(), 1.2))
    with pytest.raises(StepDefinitionError) as caught:
        run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base, "domains.python.bppb"))
    message = str(caught.value)
    assert "Criterion.metric = 'eval/new:domains.python.bppb'" in message  # the field
    assert "eval.json/domains.*.bpb" in message  # what the step declares it writes
    assert "did you mean 'eval/new:domains.python.bpb'?" in message  # the fix
    assert not os.path.exists(os.path.join(marin_prefix, "experiments"))
    with pytest.raises(StepDefinitionError, match=r"Criterion.baseline = 'eval/base:macro.bpd'.*did you mean "
                                                  r"'eval/base:macro.bpb'"):
        run_marin([base, new], hypothesis=HYPOTHESIS,
                  criterion=Criterion(metric="eval/new:macro.bpb", better="lower",
                                      baseline="eval/base:macro.bpd"))
    # every declared form is accepted: a domain, the a_b spelling, another file by name
    for path in ("domains.python.bpb", "macro_bpb", "choices.json/macro.accuracy"):
        assert run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base, path),
                         dry_run=True).status == "DRY_RUN"


def test_a_criterion_can_be_amended_until_its_first_verdict(run_marin: Run, marin_prefix: str) -> None:
    from marin.status.manifest import NotebookFrozenError
    from marin.tracking.local import LocalTracker

    base, new = evals(new=1.20)  # configs that declare nothing: a typo shows only when judged
    typo = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base, "macro.bbp"),
                     issue="local/experiments#4")
    first = verdicts.read_verdicts(storage_for(marin_prefix), marin_prefix, typo.experiment_id) or {}
    assert first["current"]["outcome"] == "not_evaluated"
    fixed = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base),
                      issue="local/experiments#4")
    assert fixed.experiment_id == typo.experiment_id and fixed.status == "SUCCESS"
    manifest = json.loads(Path(marin_prefix, "experiments", f"{fixed.experiment_id}.json").read_text())
    assert manifest["notebook"]["criteria"][0]["metric"] == "eval/new:macro.bpb"
    [amended] = manifest["notebook_amendments"]
    assert amended["previous"]["criteria"][0]["metric"] == "eval/new:macro.bbp" and amended["at"] > 0
    assert amended["run_id"] == fixed.run_id
    doc = verdicts.read_verdicts(storage_for(marin_prefix), marin_prefix, fixed.experiment_id) or {}
    assert doc["current"]["outcome"] == "worked"
    [comment] = LocalTracker(marin_prefix, readonly=True).list_comments(4)
    assert "amended" in comment.body and "eval/new:macro.bbp" in comment.body  # posted to the issue too
    # judged now: a further change is refused, and the message says how to proceed
    with pytest.raises(NotebookFrozenError, match="never edited after launch.*renaming the script"):
        run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criterion(base, min_effect=0.5))
