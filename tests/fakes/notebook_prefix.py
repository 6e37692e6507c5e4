"""A prefix holding one experiment of every verdict outcome, made by real runs on the local backend (the
executor, the manifest and verdict writers, `marin verdict`), plus one whose hypothesis and note are hostile
markup. Used by the catalogue tests of the CLI and the dashboard."""

from __future__ import annotations

from typing import Any

from marin import Criterion, ExecutorMainConfig, Step, run_experiment, this_output_path
from marin.cli import main as marin_main
from tests.marin.fns import DieConfig, die
from tests.marin.notebook_fns import EvalConfig, write_eval

XSS = "<script>alert('xss')</script>"
IMG = "<img src=x onerror=alert(1)>"


def _eval(name: str, bpb: float) -> Step:
    return Step(name=name, fn=write_eval, config=EvalConfig(this_output_path(), bpb))


def _run(prefix: str, script: str, steps: list[Step], criterion: Any, hypothesis: str,
         tags: tuple[str, ...] = ()) -> str:
    result = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script=f"experiments/{script}.py", hypothesis=hypothesis, criterion=criterion,
                            tags=tags)
    return result.experiment_id


def write_notebook_prefix(prefix: str) -> dict[str, str]:
    """Experiments named by their expected outcome (plus `hostile`); returns outcome -> experiment id."""
    base = _eval("eval/base", 1.30)
    lower = Criterion("eval/new:macro.bpb", "lower", base, 0.05)
    ids = {
        "worked": _run(prefix, "exp1_worked", [base, _eval("eval/new", 1.20)], lower, "lower is better",
                       ("moe", "router")),
        "did_not_work": _run(prefix, "exp2_flat", [base, _eval("eval/new", 1.29)], lower, "a tiny gain",
                             ("moe",)),
        "mixed": _run(prefix, "exp3_mixed", [base, _eval("eval/new", 1.20)],
                      [lower, Criterion("eval/new:macro.bpb", "lower", 1.0)], "helps one, not the other"),
        "not_evaluated": _run(prefix, "exp4_missing", [base, _eval("eval/new", 1.2)],
                              Criterion("eval/new:macro.absent", "lower", base), "nothing to judge"),
        "infra_failure": _run(prefix, "exp5_lost", [base, Step(name="eval/new", fn=die, max_preemptions=0,
                                                               config=DieConfig(this_output_path()))],
                              lower, "killed under the step", ("router",)),
        "inconclusive": _run(prefix, "exp6_unsure", [base, _eval("eval/new", 1.25)], lower, "judged by hand"),
        "hostile": _run(prefix, "exp7_hostile", [base, _eval("eval/new", 1.0)], lower,
                        f"hostile {XSS} and {IMG} | pipe"),
    }
    for outcome, note in (("inconclusive", "the baseline was run on another seed"),
                          ("hostile", f"note {XSS} {IMG}")):
        rc = marin_main(["verdict", ids[outcome], "inconclusive" if outcome == "inconclusive" else "worked",
                         "--note", note, "--by", "alice", "--prefix", prefix, "--no-post"])
        assert rc == 0
    return ids
