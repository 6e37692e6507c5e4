"""The run's provenance: the script checkout's commit and dirtiness, read from a real git repository."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from marin.status.stepinfo import provenance

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_CONFIG_GLOBAL": os.devnull}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "exp.py").write_text("print('hi')\n")
    (root / "data.txt").write_text("1\n")
    git(root, "add", "exp.py", "data.txt")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_commit_and_clean_checkout(repo: Path) -> None:
    got = provenance(str(repo / "exp.py"))
    assert got["git_commit"] == git(repo, "rev-parse", "HEAD")
    assert got["git_dirty"] is False


def test_untracked_files_do_not_make_it_dirty(repo: Path) -> None:
    (repo / "scratch.txt").write_text("notes\n")
    assert provenance(str(repo / "exp.py"))["git_dirty"] is False


@pytest.mark.parametrize("change", ["modified", "staged", "deleted"])
def test_changed_tracked_files_make_it_dirty(repo: Path, change: str) -> None:
    if change == "deleted":
        (repo / "data.txt").unlink()
    else:
        (repo / "data.txt").write_text("2\n")
        if change == "staged":
            git(repo, "add", "data.txt")
    got = provenance(str(repo / "exp.py"))
    assert got["git_commit"] == git(repo, "rev-parse", "HEAD")
    assert got["git_dirty"] is True


def test_a_new_commit_is_seen_by_the_next_run(repo: Path) -> None:
    first = provenance(str(repo / "exp.py"))["git_commit"]
    (repo / "exp.py").write_text("print('v2')\n")
    git(repo, "commit", "-q", "-am", "second")
    second = provenance(str(repo / "exp.py"))
    assert second["git_commit"] == git(repo, "rev-parse", "HEAD") != first
    assert second["git_dirty"] is False


def test_outside_a_checkout_and_before_the_first_commit(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "exp.py").write_text("")
    got = provenance(str(plain / "exp.py"))
    assert (got["git_commit"], got["git_dirty"]) == (None, None)
    git(plain, "init", "-q")
    git(plain, "add", "exp.py")  # staged, but nothing committed yet
    got = provenance(str(plain / "exp.py"))
    assert (got["git_commit"], got["git_dirty"]) == (None, None)


def test_a_run_records_its_scripts_commit_in_the_manifest_and_step_json(repo: Path, tmp_path: Path) -> None:
    from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
    from tests.marin.fns import WriteConfig, write_numbers

    (repo / "data.txt").write_text("edited\n")  # a dirty checkout
    step = Step(name="p/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=2))
    result = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local"),
                            verbose=False, script=str(repo / "exp.py"))
    assert result.status == "SUCCESS"
    manifest = json.loads(Path(tmp_path / "out" / "experiments" / f"{result.experiment_id}.json").read_text())
    step_json = json.loads(Path(result.output_path("p/numbers"), ".marin/step.json").read_text())
    assert manifest["git_commit"] == step_json["git_commit"] == git(repo, "rev-parse", "HEAD")
    assert step_json["git_dirty"] is True



def test_provenance_that_is_never_read_leaves_no_process_or_open_pipe(repo: Path) -> None:
    import gc
    import warnings

    from marin.status.stepinfo import provenance_started

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # an unclosed pipe or a running child would warn
        started = provenance_started(str(repo / "exp.py"))
        proc = started._proc  # type: ignore[attr-defined]
        del started
        gc.collect()
    assert proc.returncode is not None and proc.stdout.closed
