"""The lab notebook on the local backend: hypothesis and criterion checked at launch and frozen with the
experiment, verdicts computed from the steps' real outputs (worked, did_not_work, mixed, not_evaluated,
infra_failure from the interruption ledger and a lost driver), a person's override with its history, and
the label and status-comment section on the local tracker."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marin import Criterion, Step, StepDefinitionError, this_output_path
from marin.cli import main as marin_main
from marin.definition.criterion import parse_docstring
from marin.status import manifest as mf
from marin.status import verdicts
from marin.status.manifest import NotebookFrozenError
from marin.storage.fs import storage_for
from marin.tracking.local import LocalTracker
from tests.marin.fns import DieConfig, die
from tests.marin.notebook_fns import EvalConfig, TrainRowsConfig, write_eval, write_rows

Run = Callable[..., Any]
HYPOTHESIS = "the new router lowers held-out bits per byte by at least 0.05"


def evals(base: float = 1.30, new: float = 1.20, acc: tuple[float, float] = (0.5, 0.6)) -> tuple[Step, Step]:
    baseline = Step(name="eval/base", fn=write_eval, config=EvalConfig(this_output_path(), base, acc[0]))
    variant = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), new, acc[1]))
    return baseline, variant


def bpb(baseline: Any, min_effect: float = 0.05, path: str = "macro.bpb") -> Criterion:
    return Criterion(metric=f"eval/new:{path}", better="lower", baseline=baseline, min_effect=min_effect)


def verdict_of(result: Any) -> dict[str, Any]:
    doc = verdicts.read_verdicts(storage_for(result.prefix), result.prefix, result.experiment_id)
    assert doc is not None, "no verdicts.json written"
    return doc


def test_a_met_criterion_gives_worked_with_its_deciding_numbers(run_marin: Run) -> None:
    base, new = evals(1.30, 1.20)
    result = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base), tags=("router",))
    current = verdict_of(result)["current"]
    assert current["outcome"] == "worked" and current["source"] == "computed" and current["by"] == "marin"
    [c] = current["criteria"]
    assert c["value"] == 1.20 and c["baseline_value"] == 1.30 and c["met"] is True
    assert c["effect"] == pytest.approx(0.10) and c["min_effect"] == 0.05
    m = json.loads(Path(mf.manifest_path(result.prefix, result.experiment_id)).read_text())
    assert m["notebook"]["hypothesis"] == HYPOTHESIS and m["notebook"]["tags"] == ["router"]
    hashes = {s["name"]: s["hash"] for s in m["steps"]}
    assert m["notebook"]["criteria"][0]["baseline"] == {"kind": "step", "step": "eval/base",
                                                        "hash": hashes["eval/base"], "path": "macro.bpb",
                                                        "label": "eval/base:macro.bpb"}
    assert len(m["notebook"]["sha256"]) == 64 and m["notebook"]["frozen_by"] == result.run_id


@pytest.mark.parametrize(("new", "min_effect", "outcome"), [(1.28, 0.05, "did_not_work"),
                                                             (1.35, 0.0, "did_not_work"),
                                                             (1.31, -0.02, "worked")],
                         ids=["too-small", "worse", "within-margin"])
def test_an_unmet_criterion_gives_did_not_work(run_marin: Run, new: float, min_effect: float,
                                               outcome: str) -> None:
    base, variant = evals(1.30, new)
    result = run_marin([base, variant], hypothesis=HYPOTHESIS, criterion=bpb(base, min_effect))
    assert verdict_of(result)["current"]["outcome"] == outcome


def test_two_criteria_one_met_give_mixed_and_baselines_of_every_kind(run_marin: Run) -> None:
    base, new = evals(1.30, 1.20, acc=(0.6, 0.5))
    criteria = [bpb("eval/base"), Criterion("eval/new:choices.json/macro.accuracy", "higher", base, 0.0),
                Criterion("eval/new:macro_bpb", "lower", 1.25), Criterion("eval/new:macro.bpb", "lower",
                                                                          "eval/base:micro.bpb", 0.05)]
    result = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=criteria)
    current = verdict_of(result)["current"]
    assert [c["met"] for c in current["criteria"]] == [True, False, True, True]
    assert current["outcome"] == "mixed" and current["note"] == "3 of 4 criteria met"


def test_a_baseline_from_another_experiments_record(run_marin: Run) -> None:
    base, new = evals(1.30, 1.20)
    first = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base))
    better = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), 1.12))
    second = run_marin([better], hypothesis="beats the first experiment's 1.20 by 0.05",
                       criterion=Criterion("eval/new:macro.bpb", "lower", first.experiment_id, 0.05),
                       script="tests/second.py")
    [c] = verdict_of(second)["current"]["criteria"]
    assert (c["value"], c["baseline_value"], c["met"]) == (1.12, 1.20, True)
    assert c["baseline"] == f"experiment {first.experiment_id}"
    orphan = run_marin([better], hypothesis="against nothing", script="tests/third.py",
                       criterion=Criterion("eval/new:macro.bpb", "lower", "nobody-00000000"))
    current = verdict_of(orphan)["current"]
    assert current["outcome"] == "not_evaluated"
    assert current["note"] == "baseline: no experiment nobody-00000000 under the prefix"


def test_a_missing_metric_gives_not_evaluated(run_marin: Run) -> None:
    base, new = evals()
    result = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base, path="macro.nothing"))
    current = verdict_of(result)["current"]
    assert current["outcome"] == "not_evaluated"
    assert "eval/new:macro.nothing was not found" in current["note"]


def test_a_metric_from_the_last_training_row(run_marin: Run) -> None:
    train = Step(name="train/new", fn=write_rows, config=TrainRowsConfig(this_output_path(), 2.0))
    criteria = [Criterion("train/new:loss", "lower", 2.5),
                Criterion("train/new:eval.macro.bpb", "lower", 2.4)]  # the last eval row
    result = run_marin([train], hypothesis=HYPOTHESIS, criterion=criteria)
    current = verdict_of(result)["current"]
    assert [c["value"] for c in current["criteria"]] == [2.0, 2.5] and current["outcome"] == "mixed"


def test_a_run_that_lost_its_worker_past_the_budget_is_infra_failure(run_marin: Run) -> None:
    base = Step(name="eval/base", fn=write_eval, config=EvalConfig(this_output_path(), 1.3))
    killed = Step(name="eval/new", fn=die, config=DieConfig(this_output_path()), max_preemptions=0)
    result = run_marin([base, killed], hypothesis=HYPOTHESIS, criterion=bpb(base))
    assert result.status_of("eval/new") == "PREEMPTED"
    ledger = json.loads(Path(result.output_path("eval/new"), ".marin/interruptions.json").read_text())
    assert ledger["totals"]["count"] == 1  # the ledger's own record of the interruption
    current = verdict_of(result)["current"]
    assert current["outcome"] == "infra_failure", current
    assert "PREEMPTED (1 preempted)" in current["note"] and current["infra"]


def test_a_lost_driver_is_infra_failure_never_did_not_work(run_marin: Run, marin_prefix: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    base, new = evals()
    monkeypatch.setenv("MARIN_JOB_SUBMISSION_ID", "job-1")  # a driver started by `marin submit`
    result = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base), dry_run=True)
    storage = storage_for(marin_prefix)
    from marin.definition.criterion import declare
    from marin.execution.main import _manifest_steps  # the manifest the driver wrote before it was lost
    from marin.execution.notebook import freeze
    from marin.graph.dag import build_graph

    graph = build_graph([base, new])
    mf.start_run(storage, marin_prefix, result.experiment_id, script="x.py", description="", issue=None,
                 provenance={}, steps=_manifest_steps(graph, result.plan), run_id="r1", args=[],
                 notebook=freeze(declare(HYPOTHESIS, bpb(base)), graph))
    mf.record_driver_loss(storage, marin_prefix, result.experiment_id, job="job-1", ended=None,
                          message="driver node lost")
    manifest = json.loads(Path(mf.manifest_path(marin_prefix, result.experiment_id)).read_text())
    entry = verdicts.judge(storage, marin_prefix, manifest)
    assert entry["outcome"] == "infra_failure" and "driver was lost" in entry["note"]


def test_the_notebook_is_frozen_by_the_first_run(run_marin: Run) -> None:
    base, new = evals()
    first = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base))
    again = run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base))  # same declaration: fine
    assert again.experiment_id == first.experiment_id and again.status == "SUCCESS"
    with pytest.raises(NotebookFrozenError, match="never edited after launch.*renaming the script"):
        run_marin([base, new], hypothesis="something else entirely", criterion=bpb(base))
    with pytest.raises(NotebookFrozenError):
        run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base, min_effect=0.01))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"better": "smaller"}, "Criterion.better = 'smaller' is invalid: use one of"),
    ({"metric": "eval/new"}, "write STEP:PATH"),
    ({"min_effect": float("nan")}, "Criterion.min_effect"),
    ({"baseline": None}, "Criterion.baseline = None"),
], ids=["better", "metric", "min_effect", "baseline"])
def test_a_bad_criterion_is_refused_when_built(kwargs: dict[str, Any], message: str) -> None:
    args = {"metric": "eval/new:macro.bpb", "better": "lower", "baseline": 1.0, **kwargs}
    with pytest.raises(StepDefinitionError, match=message):
        Criterion(**args)


def test_names_a_criterion_uses_must_be_in_the_dag(run_marin: Run) -> None:
    base, new = evals()
    with pytest.raises(StepDefinitionError, match="names step 'eval/other'.*add the step"):
        run_marin([base, new], hypothesis=HYPOTHESIS, criterion=Criterion("eval/other:x", "lower", 1.0),
                  dry_run=True)
    stray = Step(name="eval/stray", fn=write_eval, config=EvalConfig(this_output_path(), 9.0))
    with pytest.raises(StepDefinitionError, match="baseline is step 'eval/stray'"):
        run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(stray), dry_run=True)
    with pytest.raises(StepDefinitionError, match="a criterion decides a hypothesis"):
        run_marin([base, new], criterion=bpb(base), dry_run=True)


def test_the_docstring_form() -> None:
    nb = parse_docstring('''exp9: something.

Hypothesis: a wider router
  helps (by a lot).

Criterion: eval/new:macro.bpb lower than eval/base by at least 0.01
Criterion: eval/new:accuracy higher than 0.25
Tags: moe, router
''')
    assert nb.hypothesis == "a wider router helps (by a lot)." and nb.tags == ("moe", "router")
    assert nb.criteria == (Criterion("eval/new:macro.bpb", "lower", "eval/base", 0.01),
                           Criterion("eval/new:accuracy", "higher", 0.25, 0.0))
    with pytest.raises(StepDefinitionError, match="the docstring's Criterion line"):
        parse_docstring("Hypothesis: x\n\nCriterion: eval/new:x is better\n")


def test_an_override_is_recorded_with_its_history_and_posted(run_marin: Run, marin_prefix: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base, new = evals(1.30, 1.20)
    result = run_marin([base, new], hypothesis=f"{HYPOTHESIS} <script>x</script> @team",
                       criterion=bpb(base), issue="local/experiments#4")
    tracker = LocalTracker(marin_prefix, "local/experiments")
    assert "marin:worked" in tracker.get_issue(4).labels
    [comment] = [c for c in tracker.list_comments(4) if c.body.startswith("<!-- marin-status:")]
    assert "#### Hypothesis and verdict" in comment.body and "**Verdict: ✅ worked**" in comment.body
    assert "&lt;script&gt;" in comment.body and "<script>" not in comment.body
    assert "@\u200dteam" in comment.body  # no mention
    assert "eval/new:macro.bpb 1.2 vs 1.3" in comment.body

    rc = marin_main(["verdict", result.experiment_id, "did_not_work", "--note", "the gain is noise",
                     "--by", "alice", "--prefix", marin_prefix])
    assert rc == 0, capsys.readouterr().err
    doc = verdict_of(result)
    assert [(e["outcome"], e["by"], e["source"]) for e in doc["history"]] == [
        ("worked", "marin", "computed"), ("did_not_work", "alice", "person")]
    assert doc["current"]["note"] == "the gain is noise" and doc["current"]["at"] >= doc["history"][0]["at"]
    labels = tracker.get_issue(4).labels
    assert "marin:did_not_work" in labels and "marin:worked" not in labels
    [comment] = [c for c in tracker.list_comments(4) if c.body.startswith("<!-- marin-status:")]
    assert "**Verdict: ❌ did_not_work** — by alice" in comment.body and "the gain is noise" in comment.body
    assert comment.body.count("#### Hypothesis and verdict") == 1 and "| Step |" in comment.body

    # a later run computes again: recorded in the history, but the person's verdict stays current
    moved = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), 1.0))
    run_marin([base, moved], hypothesis=HYPOTHESIS, criterion=bpb(base))  # another DAG: another experiment
    run_marin([base, new], hypothesis=f"{HYPOTHESIS} <script>x</script> @team", criterion=bpb(base),
              issue="local/experiments#4")
    doc = verdict_of(result)
    assert len(doc["history"]) == 2  # the same computed numbers are not appended twice
    assert doc["current"]["by"] == "alice"
    capsys.readouterr()
    assert marin_main(["verdict", result.experiment_id[:-4], "--prefix", marin_prefix]) == 0
    shown = capsys.readouterr().out
    assert "did_not_work (by alice)" in shown and "computed" in shown and "person" in shown


def test_verdict_cli_refuses_an_unknown_experiment(run_marin: Run, marin_prefix: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # an empty prefix: the one error every read command gives for a wrong --prefix, naming the fix
    assert marin_main(["verdict", "nope", "worked", "--prefix", marin_prefix]) == 2
    err = capsys.readouterr().err
    assert f"marin verdict: error: no experiments under {marin_prefix}" in err and "Fix: pass --prefix" in err
    base, new = evals()
    run_marin([base, new], hypothesis=HYPOTHESIS, criterion=bpb(base))
    assert marin_main(["verdict", "nope", "worked", "--prefix", marin_prefix]) == 2
    assert "experiment 'nope' is not under" in capsys.readouterr().err


def test_hello_world_declares_its_criterion_in_its_docstring_and_it_works(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    prefix = str(tmp_path / "out")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-m", "marin", "run", "experiments/hello_world.py", "--prefix", prefix,
                    "--backend", "local"], check=True, capture_output=True, env=env, cwd=root)
    listing = subprocess.run([sys.executable, "-m", "marin", "catalogue", "--prefix", prefix, "--format",
                              "json"], check=True, capture_output=True, text=True, env=env, cwd=root).stdout
    [row] = json.loads(listing)["experiments"]
    assert row["outcome"] == "worked" and row["tags"] == ["demo"] and "exactly 45" in row["hypothesis"]
    assert "total.json/total 45 vs 44" in row["deciding"]


def test_marin_plan_checks_the_docstring_criterion_against_the_dag(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "exp9_bad.py"
    script.write_text('''"""exp9.

Hypothesis: something.

Criterion: eval/missing:macro.bpb lower than 1.0
"""
from marin import Step, executor_main, this_output_path
from tests.marin.notebook_fns import EvalConfig, write_eval

new = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), 1.2))
if __name__ == "__main__":
    executor_main([new])
''')
    assert marin_main(["plan", str(script), "--prefix", str(tmp_path / "out")]) == 2
    assert "names step 'eval/missing', which is not in this experiment's DAG" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written
