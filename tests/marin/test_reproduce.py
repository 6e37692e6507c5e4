"""Reproducible from the record (issue 35): a run from a dirty checkout records its diff and environment lock;
`marin reproduce` rebuilds the commit plus the diff in a temporary clone, re-runs the steps into another
prefix and compares the outputs digest by digest. The checkout is a git repository made from this project's
files (so the reproduced run imports the engine from it), with an uncommitted change that moves the hashes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marin.execution import reproduce
from marin.status.lock import environment_lock
from tests.marin.test_provenance import git

ROOT = Path(__file__).resolve().parents[2]

CLOCK_EXPERIMENT = '''"""Two steps: one writes a value and the time it ran."""
import dataclasses, json, os, time
from marin import Step, executor_main, this_output_path, output_path_of

@dataclasses.dataclass(frozen=True)
class StampConfig:
    output_path: str
    value: int = 7

def stamp(cfg: StampConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "out.json"), "w") as f:
        json.dump({"value": cfg.value, "time": time.time(), "where": cfg.output_path}, f)

stamped = Step(name="clock/stamp", fn=stamp, config=StampConfig(output_path=this_output_path()),
               nondeterministic=NONDETERMINISTIC)

if __name__ == "__main__":
    executor_main(steps=[stamped])
'''


def project_copy(dest: Path) -> Path:
    """A git repository holding this project's files (tracked and untracked, not ignored), committed."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    for name in names:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "snapshot")
    return dest


def run_script(repo: Path, script: str, prefix: Path, *flags: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "lib/moe_trainer/src")])}
    done = subprocess.run([sys.executable, script, "--prefix", str(prefix), "--backend", "local", *flags],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return project_copy(tmp_path_factory.mktemp("checkout"))


def test_a_dirty_run_reproduces_identically_into_another_prefix(repo: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    script = repo / "experiments/hello_world.py"
    script.write_text(script.read_text().replace("n=10", "n=12"))  # uncommitted: only the patch has it
    (repo / "experiments/notes_untracked.py").write_text("X = 1\n")  # untracked: in the patch as a new file
    run_script(repo, "experiments/hello_world.py", tmp_path / "a")
    total = next((tmp_path / "a/demo").glob("total-*"))
    info = json.loads((total / ".marin/step.json").read_text())
    assert info["git_dirty"] is True and info["script_path"] == "experiments/hello_world.py"
    assert info["git_patch"]["file"] == "source.patch" and info["git_patch"]["cap_bytes"] == 4 << 20
    patch = (total / ".marin/source.patch").read_text()
    assert "+    config=WriteConfig(output_path=this_output_path(), n=12)" in patch or "n=12" in patch
    assert "+++ b/experiments/notes_untracked.py" in patch
    assert info["environment"] == environment_lock() and info["environment"]["distributions"]
    experiment = info["experiment"]
    git(repo, "checkout", "--", "experiments/hello_world.py")  # the checkout moves on; the record does not
    monkeypatch.chdir(repo)
    assert reproduce.main([experiment, "--from", str(tmp_path / "a"), "--prefix", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "environment reused): IDENTICAL" in out and "identical demo/total" in out
    assert (tmp_path / "b/demo" / total.name / "total.txt").read_text() == f"{sum(range(12))}\n"
    recorded = json.loads((total / ".marin/reproductions.json").read_text())["reproductions"]
    assert [(r["result"], r["environment"], r["prefix"]) for r in recorded] == [
        ("identical", "reused", str(tmp_path / "b"))]


@pytest.mark.parametrize("declared,expected", [((), 1), (("out.json#time",), 0)],
                         ids=["undeclared", "declared"])
def test_declared_non_deterministic_fields_are_left_out(repo: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       declared: tuple[str, ...], expected: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "experiments/clock.py").write_text(CLOCK_EXPERIMENT.replace("NONDETERMINISTIC", repr(declared)))
    run_script(repo, "experiments/clock.py", tmp_path / "a")
    stamp = next((tmp_path / "a/clock").glob("stamp-*"))
    monkeypatch.chdir(repo)
    code = reproduce.main([str(stamp), "--from", str(tmp_path / "a"), "--prefix", str(tmp_path / "b"),
                           "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == expected
    step = result["steps"][0]
    # the output path inside out.json differs by the prefix only: that never counts as a difference
    want = ("differs", ["out.json"]) if expected else ("identical", [])
    assert (step["result"], step["differences"]) == want


def test_a_patch_that_is_not_the_recorded_one_is_refused(repo: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "experiments/dirty_marker.py").write_text("Y = 2\n")
    run_script(repo, "experiments/hello_world.py", tmp_path / "a")
    numbers = next((tmp_path / "a/demo").glob("numbers-*"))
    patch = numbers / ".marin/source.patch"
    patch.write_text(patch.read_text() + "\n")
    monkeypatch.chdir(repo)
    assert reproduce.main([str(numbers), "--from", str(tmp_path / "a"), "--prefix", str(tmp_path / "b")]) == 2
    assert "source.patch is missing or not the recorded diff (sha256 differs)" in capsys.readouterr().err
    (repo / "experiments/dirty_marker.py").unlink()


@pytest.mark.slow
def test_the_tutorials_tokenize_and_train_steps_reproduce_from_a_dirty_tree(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = project_copy(tmp_path_factory.mktemp("tutorial"))
    tutorial = repo / "experiments/tutorials/tiny_moe.py"
    tutorial.write_text(tutorial.read_text().replace("seed=0, data_seed=0", "seed=1, data_seed=0"))
    prefix = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv("MARIN_TUTORIAL_SMALL", "1")
    run_script(repo, "experiments/tutorials/tiny_moe.py", prefix / "a", "--run-only", "train/tiny_moe")
    train = next((prefix / "a/train").glob("tiny_moe-*"))
    assert "seed=1" in (train / ".marin/source.patch").read_text()
    monkeypatch.chdir(repo)
    assert reproduce.main([str(train), "--from", str(prefix / "a"), "--prefix", str(prefix / "b")]) == 0
    out = capsys.readouterr().out
    for name in ("documents/stdlib", "decontaminated/stdlib", "tokenizer/stdlib", "tokenized/stdlib",
                 "train/tiny_moe"):
        assert f"identical {name}" in out
    metrics = (prefix / "b/train" / train.name / "metrics.jsonl").read_text()
    rows = [json.loads(x) for x in metrics.splitlines()]
    assert rows and all("loss" in r for r in rows if "alert" not in r)


def runtime_lock() -> dict[str, object]:
    """The lock of an environment that holds the project's runtime dependencies only (`pip install .`, no test
    extras), at the versions installed here: the closure of pyproject's `dependencies` over the installed
    distributions' metadata. dev.py installs exactly these with uv, so uv's cache holds every one of their
    wheels; the test extras' torch and lm-eval come from pip and are not in it."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()
                 if d.metadata["Name"]}
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo, found = [(Requirement(r), frozenset({""})) for r in roots], {}
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        dist = installed[canonicalize_name(req.name)]
        name = dist.metadata["Name"]
        wanted = frozenset({"", *req.extras})
        if name in found and wanted <= found[name][1]:
            continue
        found[name] = (dist.version, wanted | (found[name][1] if name in found else frozenset()))
        todo += [(Requirement(r), found[name][1]) for r in dist.requires or []]
    return {**environment_lock(),
            "distributions": {n: v for n, (v, _) in sorted(found.items(), key=lambda kv: kv[0].lower())}}


def test_uv_is_found_beside_the_interpreter_when_it_is_not_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The project's venv holds uv (dev.py installs it) but need not be on PATH."""
    monkeypatch.setenv("PATH", "/nonexistent")
    found = reproduce.find_uv()
    assert found is not None and os.access(found, os.X_OK)
    done = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("uv ")


@pytest.mark.slow
def test_a_run_recorded_in_another_environment_reproduces_in_one_uv_builds_offline(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The recorded lock is the project's runtime dependencies only (no torch, no pytest): this interpreter
    does not match it, so `marin reproduce` builds a fresh environment with uv - offline, from uv's cache
    (UV_OFFLINE=1) - and re-runs the steps in it; the outputs are identical."""
    if reproduce.find_uv() is None:
        pytest.fail("uv is not installed in the project's environment (dev.py installs it)")
    run_script(repo, "experiments/hello_world.py", tmp_path / "a")
    lock = runtime_lock()
    assert "pytest" not in lock["distributions"] and "ray" in lock["distributions"]  # type: ignore[operator]
    steps = sorted((tmp_path / "a/demo").glob("*/.marin/step.json"))
    for step_json in steps:  # as if recorded on a machine with the runtime dependencies only
        info = json.loads(step_json.read_text())
        step_json.write_text(json.dumps({**info, "environment": lock}, indent=2))
    experiment = json.loads(steps[0].read_text())["experiment"]
    monkeypatch.chdir(repo)
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # uv is found beside the interpreter, not on PATH
    assert reproduce.main([experiment, "--from", str(tmp_path / "a"), "--prefix", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "environment built): IDENTICAL" in out and "identical demo/total" in out
    recorded = json.loads((steps[0].parent / "reproductions.json").read_text())["reproductions"]
    assert [(r["result"], r["environment"]) for r in recorded] == [("identical", "built")]
