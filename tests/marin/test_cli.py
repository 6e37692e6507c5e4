"""The command line: `marin run|plan|status`, `python SCRIPT` with the same flags, the hello-world experiment
end to end, definition errors before anything runs, and flag parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marin import IssueRef
from marin.execution.argv import normalize_argv, parse_flags

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=120)


def test_hello_world_end_to_end_with_marin_run_then_plan_and_status(tmp_path: Path) -> None:
    prefix = str(tmp_path / "out")
    first = run("-m", "marin", "run", "experiments/hello_world.py", "--prefix", prefix, "--backend", "local")
    assert first.returncode == 0, first.stderr
    [total_dir] = Path(prefix, "demo").glob("total-*")
    assert (total_dir / "total.txt").read_text() == "45\n"
    assert "SUCCESS: 2" in first.stderr
    info = json.loads((total_dir / ".marin/step.json").read_text())
    assert info["fn"] == "experiments.hello_world:sum_numbers"
    assert info["config_class"] == "experiments.hello_world:SumConfig"
    [manifest] = Path(prefix, "experiments").glob("hello_world-*.json")
    data = json.loads(manifest.read_text())
    assert data["description"] == "two-step demo" and data["runs"][0]["args"] == ["--prefix", prefix,
                                                                                  "--backend",
                                                                                 "local"]

    plan = run("-m", "marin", "plan", "experiments/hello_world.py", "--prefix", prefix, "--format", "json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert [s["action"] for s in doc["steps"]] == ["skip", "skip"] and doc["experiment"] == manifest.stem

    status = run("-m", "marin", "status", "--prefix", prefix)
    assert status.returncode == 0 and f"SUCCESS  {manifest.stem}" in status.stdout
    per_step = run("-m", "marin", "status", "experiments/hello_world.py", "--prefix", prefix, "--format",
                   "json")
    assert [s["status"] for s in json.loads(per_step.stdout)["steps"]] == ["SUCCESS", "SUCCESS"]


def test_python_script_takes_the_same_flags_and_marin_prefix_env(tmp_path: Path) -> None:
    prefix = tmp_path / "env-prefix"
    dry = run("experiments/hello_world.py", "--dry-run", "--backend=local", env={"MARIN_PREFIX": str(prefix)})
    assert dry.returncode == 0, dry.stderr
    assert "run     demo/numbers" in dry.stderr and not prefix.exists()
    real = run("experiments/hello_world.py", "--backend", "local", "--run-only", "numbers$",
               env={"MARIN_PREFIX": str(prefix)})
    assert real.returncode == 0, real.stderr
    assert list(prefix.glob("demo/numbers-*/numbers.txt")) and not list(prefix.glob("demo/total-*"))


def test_relative_prefix_is_made_absolute_once(tmp_path: Path) -> None:
    result = run(str(ROOT / "experiments/hello_world.py"), "--prefix", "rel-out", "--backend", "local",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [status] = (tmp_path / "rel-out").glob("demo/total-*/.marin/step.json")
    assert json.loads(status.read_text())["output_path"].startswith(str(tmp_path / "rel-out"))


BAD_SCRIPT = '''
import dataclasses
from marin import Step, executor_main, this_output_path

@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str
    value: object = None

def fn(cfg: Cfg) -> None:
    raise AssertionError("must never run")

a = Step(name="x/a", fn=fn, config=Cfg(output_path=this_output_path(), value=1))
b = Step(name="x/a", fn=fn, config=Cfg(output_path=this_output_path(), value=2))
c = Step(name="x/c", fn=fn, config=Cfg(output_path=this_output_path(), value=object()))

if __name__ == "__main__":
    import sys
    executor_main([c] if sys.argv[-1] == "unhashable" else [a, b], argv=sys.argv[1:-1])
'''


@pytest.mark.parametrize(("case", "message"), [("dup", "two different steps are named 'x/a'"),
                                               ("unhashable", "config field config.value")])
def test_definition_errors_stop_before_anything_runs(tmp_path: Path, case: str, message: str) -> None:
    script = tmp_path / "bad_experiment.py"
    script.write_text(BAD_SCRIPT)
    prefix = tmp_path / "out"
    result = run("-m", "marin", "run", str(script), "--prefix", str(prefix), "--backend", "local", case)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and not prefix.exists()


def test_unknown_subcommands_and_missing_delegates_are_clear() -> None:
    unknown = run("-m", "marin", "frobnicate")
    assert unknown.returncode == 2 and "valid commands: run, plan, status, dashboard, issue" in unknown.stderr


def test_flag_normalization_accepts_both_spellings() -> None:
    assert normalize_argv(["--dry-run", "--run-only", "a", "b$", "--prefix=x"]) == [
        "--dry_run", "true", "--run_only", '["a", "b$"]', "--prefix", "x"]
    cfg = parse_flags(["--dry-run", "--run-only", "tok", "--max-concurrent", "3", "--backend", "local"])
    assert (cfg.dry_run, cfg.run_only, cfg.max_concurrent, cfg.backend) == (True, ["tok"], 3, "local")
    assert parse_flags(["--run_only", '["a","b"]', "--dry_run", "false"]).run_only == ["a", "b"]
    with pytest.raises(SystemExit):
        parse_flags(["--no-such-flag", "1"])
    with pytest.raises(ValueError, match="--backend 'slurm' is not one of"):
        parse_flags(["--backend", "slurm"])


def test_issue_refs_parse_and_infer_from_script_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert IssueRef.parse("marin-community/marin#12") == IssueRef("marin-community/marin", 12)
    assert str(IssueRef("o/r", 3)) == "o/r#3"
    with pytest.raises(ValueError, match="expected owner/repo#N"):
        IssueRef.parse("not an issue")
    monkeypatch.delenv("MARIN_ISSUE_REPO", raising=False)
    assert IssueRef.from_script("experiments/exp12_moe_sweep.py") is None
    monkeypatch.setenv("MARIN_ISSUE_REPO", "openlab/platform")
    assert IssueRef.from_script("experiments/exp12_moe_sweep.py") == IssueRef("openlab/platform", 12)
    assert IssueRef.from_script("experiments/exp0012_moe_sweep.py") == IssueRef("openlab/platform", 12)
    assert IssueRef.from_script("experiments/exp0_moe_sweep.py") is None
    assert IssueRef.from_script("experiments/hello_world.py") is None
    assert IssueRef.parse("#5") == IssueRef("openlab/platform", 5)


FAILING_SCRIPT = '''
import dataclasses
from marin import Step, executor_main, this_output_path

@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str

def explode(cfg: Cfg) -> None:
    print("exploding now")
    raise RuntimeError("kaboom")

boom = Step(name="fail/boom", fn=explode, config=Cfg(output_path=this_output_path()))

if __name__ == "__main__":
    executor_main([boom])
'''


@pytest.mark.parametrize("entry", ["marin", "python"])
def test_a_failing_run_exits_non_zero_naming_the_step_and_its_log(tmp_path: Path, entry: str) -> None:
    script = tmp_path / "failing.py"
    script.write_text(FAILING_SCRIPT)
    prefix = tmp_path / "out"
    cmd = ["-m", "marin", "run", str(script)] if entry == "marin" else [str(script)]
    result = run(*cmd, "--prefix", str(prefix), "--backend", "local")
    assert result.returncode == 1, result.stderr
    [step_dir] = prefix.glob("fail/boom-*")
    assert f"FAILED fail/boom ({step_dir.name[-8:]}): RuntimeError: kaboom" in result.stderr
    assert f"log: {step_dir}/.marin/logs/attempt-1.log" in result.stderr
    assert "exploding now" in (step_dir / ".marin/logs/attempt-1.log").read_text()
    if entry == "python":  # the traceback chains the experiment failure to the user's exception
        assert "RuntimeError: kaboom" in result.stderr and "ExperimentFailedError" in result.stderr
