"""The README's newcomer path, end to end on the reduced tutorial (MARIN_TUTORIAL_SMALL=1), through the real
CLI: run the tutorial -> `marin issue new` -> edit one field of the skeleton -> `marin plan` -> `marin run` ->
(`marin compare`, when that subcommand exists) -> `marin verdict`. Every number the runs and the verdict
print is compared with the record it came from (issue 33)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = "experiments/tutorials/tiny_moe.py"
SLUG = "quarter_the_learning_rate"
# a results line: `  [label]  FILE  PATH = VALUE [± STDERR]` (marin/execution/report.py)
RESULT = re.compile(r"^  (?P<label>\S+-[0-9a-f]{8})?\s+(?P<file>\S+\.jsonl?)  (?P<path>\S+) = (?P<value>\S+)"
                    r"(?: ± (?P<stderr>\S+))?$")
DECIDING = re.compile(r"(?P<metric>\S+:\S+) (?P<value>\S+) vs (?P<base>\S+) \((?P<label>\S+); effect "
                      r"(?P<effect>\S+), needed >= (?P<needed>\S+)\)")


_COMPILE_CACHE: dict[str, str] = {}  # this test's persistent JAX compilation cache (set by compile_cache)


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One persistent JAX compilation cache for the test's CLI runs: the experiment's evaluation step runs the
    program the tutorial's evaluation compiled (the same model shapes), and finds it there."""
    _COMPILE_CACHE["dir"] = str(tmp_path_factory.mktemp("newcomer-jax-cache"))
    yield
    _COMPILE_CACHE.clear()


def marin(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MARIN_TUTORIAL_TEXT", "MARIN_ISSUE_REPO")}
    if "dir" in _COMPILE_CACHE:
        env.update({"JAX_COMPILATION_CACHE_DIR": _COMPILE_CACHE["dir"],
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    env.update({"MARIN_TUTORIAL_SMALL": "1", "MARIN_TRACKER_MIN_INTERVAL": "0.2",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lib/moe_trainer/src")]),
                # the one CPU device a newcomer's machine shows, not the eight fake devices conftest.py gives
                # the sharding tests (every step compiled and run 8-way partitioned on 2 cores); LLVM -O0 for
                # compile time, as conftest.py sets for every test
                "XLA_FLAGS": "--xla_backend_optimization_level=0"})
    done = subprocess.run([sys.executable, "-m", "marin", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, f"marin {' '.join(args)}:\n{done.stdout}\n{done.stderr[-5000:]}"
    return done


def dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[part]
    return obj


def printed_results_match_records(stderr: str, paths: dict[str, str]) -> set[str]:
    """Check every results line against the file it names; return the steps it covered."""
    block = stderr.split("results (each step's headline numbers, from the files it wrote):\n", 1)[1]
    label, seen = None, set()
    for line in block.split("\nverdict: ", 1)[0].splitlines():
        found = RESULT.match(line)
        assert found, f"not a results line: {line!r}"
        label = found["label"] or label
        assert label is not None
        name = label.rsplit("-", 1)[0]
        record = json.loads(Path(paths[name], found["file"]).read_text())
        value = float(dig(record, found["path"]))
        assert float(found["value"]) == float(f"{value:.6g}"), line
        if found["stderr"]:
            key = found["path"].rsplit(".", 1)
            stderr_value = float(dig(record, f"{key[0]}.{key[1]}_stderr"))
            assert float(found["stderr"]) == float(f"{stderr_value:.6g}"), line
        seen.add(name)
    return seen


def deciding_matches_record(text: str, criteria: list[dict[str, Any]]) -> None:
    found = list(DECIDING.finditer(text))
    assert len(found) == len(criteria) > 0, text
    for shown, c in zip(found, criteria, strict=True):
        assert shown["metric"] == c["metric"] and shown["label"] == c["baseline"]
        assert shown["value"] == f"{c['value']:.4g}" and shown["base"] == f"{c['baseline_value']:.4g}"
        assert shown["effect"] == f"{c['effect']:+.4g}" and float(shown["needed"]) == c["min_effect"]


def test_newcomer_path_from_the_readme(tmp_path: Path) -> None:
    from marin.cli import DELEGATES
    from marin.tracking.local import LocalTracker

    prefix, experiments = str(tmp_path / "out"), tmp_path / "experiments"
    tutorial = marin("run", TUTORIAL, "--prefix", prefix, "--backend", "local")
    # 1. a new issue and its script: #2 (the tutorial holds #1), a real ablation of the tutorial
    made = marin("issue", "new", "Quarter the learning rate", "--body",
                 "Hypothesis: a quarter of the tutorial's learning rate lowers held-out bits per byte.",
                 "--prefix", prefix, "--write", "--experiments-dir", str(experiments))
    script = experiments / f"exp2_{SLUG}.py"
    assert f"wrote {script}" in made.stdout
    # 2. edit one field: the skeleton halves the learning rate; this experiment quarters it
    source = script.read_text()
    assert source.count('overrides["optimizer.lr"] / 2') == 1
    script.write_text(source.replace('overrides["optimizer.lr"] / 2', 'overrides["optimizer.lr"] / 4'))
    # 3. the plan reuses the tutorial's steps by identity; only the changed model and its evaluation run
    plan = json.loads(marin("plan", str(script), "--prefix", prefix, "--format", "json").stdout)
    actions = {s["name"]: s["action"] for s in plan["steps"]}
    assert {n for n, a in actions.items() if a == "run"} == {f"train/tiny_moe-{SLUG}",
                                                             f"eval/tiny_moe-{SLUG}"}
    assert all(actions[n] == "skip" for n in ("tokenized/stdlib", "train/tiny_moe", "eval/tiny_moe"))
    tutorial_plan = json.loads(marin("plan", TUTORIAL, "--prefix", prefix, "--format", "json").stdout)
    paths = {s["name"]: s["output_path"] for s in [*tutorial_plan["steps"], *plan["steps"]]}
    assert not Path(paths[f"train/tiny_moe-{SLUG}"]).exists()  # plan wrote nothing
    # 4. run it: where to look first, every number and the verdict last, each as recorded
    ran = marin("run", str(script), "--prefix", prefix, "--backend", "local")
    experiment = plan["experiment"]
    assert f"experiment {experiment} under {prefix}" in ran.stderr
    assert (f"issue:     local/experiments#2   (marin issue show local/experiments#2 --prefix {prefix})"
            in ran.stderr)
    assert f"RUNNING  train/tiny_moe-{SLUG}-" in ran.stderr and f"train/tiny_moe-{SLUG} | " in ran.stderr
    trained = json.loads(Path(paths[f"train/tiny_moe-{SLUG}"], "train_config.json").read_text())
    assert trained["optimizer"]["lr"] == 0.004 / 4  # the edited field reached the trainer
    covered = printed_results_match_records(ran.stderr, paths)
    assert {"train/tiny_moe", "eval/tiny_moe", f"train/tiny_moe-{SLUG}", f"eval/tiny_moe-{SLUG}"} <= covered
    assert printed_results_match_records(tutorial.stderr, paths) >= {"eval/tiny_moe", "eval_choices/tiny_moe"}
    verdict = json.loads(Path(prefix, "experiments", experiment, "verdicts.json").read_text())["current"]
    assert verdict["outcome"] in ("worked", "did_not_work")
    [criterion] = verdict["criteria"]
    assert criterion["metric"] == f"eval/tiny_moe-{SLUG}:macro.bpb" and criterion["min_effect"] == 0.01
    new_eval = json.loads(Path(paths[f"eval/tiny_moe-{SLUG}"], "eval.json").read_text())
    old_eval = json.loads(Path(paths["eval/tiny_moe"], "eval.json").read_text())
    assert criterion["value"] == new_eval["macro"]["bpb"]
    assert criterion["baseline_value"] == old_eval["macro"]["bpb"]
    verdict_line = ran.stderr.split("\nverdict: ", 1)[1].splitlines()[0]
    assert verdict_line.startswith(f"{verdict['outcome']} (")
    deciding_matches_record(verdict_line, verdict["criteria"])
    # 5. `marin compare` (issue 33 item 1, helper "compare"): when the subcommand is there, the numbers it
    #    prints for the two evaluations are the recorded ones.
    if "compare" in DELEGATES:
        compared = marin("compare", "eval/tiny_moe", f"eval/tiny_moe-{SLUG}", "--prefix", prefix, "--format",
                         "json").stdout
        for value in (new_eval["macro"]["bpb"], old_eval["macro"]["bpb"]):
            assert repr(value) in compared or f"{value:.6g}" in compared
    # 6. the verdict, as `marin verdict` shows it and as JSON
    shown = marin("verdict", experiment, "--prefix", prefix).stdout
    assert shown.startswith(f"{experiment}: {verdict['outcome']} (by marin)")
    deciding_matches_record(shown.split("deciding: ", 1)[1].splitlines()[0], verdict["criteria"])
    as_json = json.loads(marin("verdict", experiment, "--prefix", prefix, "--format", "json").stdout)
    assert as_json["current"] == verdict
    # 7. the issue got the run's status comment and the verdict label
    issue = LocalTracker(prefix, readonly=True)
    [comment] = issue.list_comments(2)
    assert "— SUCCESS" in comment.body and f"`eval/tiny_moe-{SLUG}`" in comment.body
    assert f"marin:{verdict['outcome']}" in issue.get_issue(2).labels
