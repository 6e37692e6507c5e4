"""``marin issue new|show|list`` against the local tracker and the fake GitHub API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from marin.tracking.cli import main
from marin.tracking.local import LocalTracker
from marin.tracking.skeleton import slugify
from tests.fakes.github_api import FakeGitHub
from tests.tracking.conftest import REPO, TOKEN

BODY = ("Hypothesis: doubling the router width lowers the load imbalance\nwithout hurting loss.\n\n"
        "Details follow.")


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GITHUB_TOKEN", "GITHUB_API_URL", "MARIN_TRACKER", "MARIN_ISSUE_REPO", "MARIN_PREFIX",
                 "MARIN_DASHBOARD_URL"):
        monkeypatch.delenv(name, raising=False)


def test_new_in_the_local_tracker_writes_the_script(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    prefix, experiments = tmp_path / "out", tmp_path / "experiments"
    argv = ["new", "Wider router: 2x!", "--body", BODY, "--prefix", str(prefix), "--write",
            "--experiments-dir", str(experiments)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("created local/experiments#1: Wider router: 2x!\n")
    script = experiments / "exp1_wider_router_2x.py"
    assert f"wrote {script}" in out and script.is_file()
    source = script.read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    assert doc.startswith("Experiment local/experiments#1: Wider router: 2x!")
    assert "Hypothesis: doubling the router width lowers the load imbalance without hurting loss." in doc
    assert "local:local/experiments#1" in doc
    assert source.rstrip().endswith('executor_main(steps=[tiny_moe_eval, eval_changed], '
                                     'description=\'Wider router: 2x!\', issue="local/experiments#1")')
    # a real ablation: the tutorial's steps by identity, one train field changed, a criterion on the baseline
    assert ("Criterion: eval/tiny_moe-wider_router_2x:macro.bpb lower than eval/tiny_moe by at least 0.01"
            in doc)
    assert "from experiments.tutorials.tiny_moe import tiny_moe, tiny_moe_eval" in source
    assert "dataclasses.replace(tiny_moe.config, **CHANGE)" in source
    issue = LocalTracker(str(prefix)).get_issue(1)
    assert (issue.title, issue.body, issue.labels) == ("Wider router: 2x!", BODY, ("experiment",))
    assert main(argv) == 0  # the same title again: a new issue, so a new script name
    assert (experiments / "exp2_wider_router_2x.py").is_file()


def test_write_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "exp1_x.py").write_text("mine")
    # the local tracker numbers past every existing script: #2, a new file
    assert main(["new", "x", "--prefix", str(tmp_path / "out"), "--write", "--experiments-dir",
                 str(experiments)]) == 0
    assert (experiments / "exp1_x.py").read_text() == "mine" and (experiments / "exp2_x.py").is_file()
    capsys.readouterr()
    # GitHub numbers its issues itself: #1 collides, and the existing file is kept
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", server.base_url)
        assert main(["new", "x", "--repo", REPO, "--prefix", str(tmp_path / "out"), "--write",
                     "--experiments-dir", str(experiments)]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "exp1_*.py already exists for another experiment" in err
    assert (experiments / "exp1_x.py").read_text() == "mine"


def test_new_prints_the_skeleton_without_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new", "Deeper", "--prefix", str(tmp_path), "--label", "moe", "--label", "experiment"]) == 0
    out = capsys.readouterr().out
    assert "script skeleton: experiments/exp1_deeper.py (create it with --write)" in out
    assert '"""Experiment local/experiments#1: Deeper' in out
    assert LocalTracker(str(tmp_path)).get_issue(1).labels == ("experiment", "moe")


def test_new_on_github_then_show_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeGitHub(token=TOKEN) as server:
        server.add_repo(REPO)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("GITHUB_API_URL", server.base_url)
        assert main(["new", "Try MoE 8x", "--body", BODY, "--repo", REPO, "--prefix", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"created {REPO}#1: Try MoE 8x" in out
        assert f"url: {server.base_url}/{REPO}/issues/1" in out
        assert "experiments/exp1_try_moe_8x.py" in out
        created = server.repos[REPO]["issues"][1]
        assert created["body"] == BODY and created["_labels"] == {"experiment"}
        server.add_issue(REPO, "second")
        assert main(["list", "--repo", REPO]) == 0
        assert capsys.readouterr().out.splitlines() == [f"{REPO}#2\topen\tsecond",
                                                        f"{REPO}#1\topen\tTry MoE 8x [experiment]"]
        assert main(["show", f"{REPO}#1"]) == 0
        shown = capsys.readouterr().out
        assert shown.startswith(f"{REPO}#1 (open) [experiment]: Try MoE 8x")
        assert "doubling the router" in shown
        assert TOKEN not in out + shown
        assert not (tmp_path / ".marin-tracker").exists()  # nothing went to the local tracker


def test_show_and_list_local(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracker = LocalTracker(str(tmp_path))
    tracker.create_issue("A", "body a")
    tracker.create_comment(1, "status table")
    assert main(["show", "local/experiments#1", "--prefix", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "local/experiments#1 (open): A" in out and "status table" in out
    assert main(["show", "local/experiments#9", "--prefix", str(tmp_path)]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["list", "--prefix", str(tmp_path), "--state", "all"]) == 0
    assert capsys.readouterr().out == "local/experiments#1\topen\tA\n"


def test_github_backend_without_token_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new", "x", "--backend", "github", "--repo", REPO, "--prefix", str(tmp_path)]) == 1
    assert "needs GITHUB_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize(("title", "slug"), [("Wider router: 2x!", "wider_router_2x"), ("???", "experiment"),
                                             ("a" * 60, "a" * 40), ("Ünïcode names ok", "n_code_names_ok")])
def test_slugify(title: str, slug: str) -> None:
    assert slugify(title) == slug


def test_new_numbers_the_issue_past_every_existing_script(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The local tracker held #1 (the tutorial's) and the repository ships exp2_*.py, exp3_*.py and exp15/:
    the new issue is #4, so its script collides with none of them."""
    prefix, experiments = tmp_path / "out", tmp_path / "experiments"
    (experiments / "exp15").mkdir(parents=True)
    for name in ("exp2_aux_free.py", "exp3_vocab.py", "exp15_ladder.py"):
        (experiments / name).write_text("")
    LocalTracker(str(prefix)).create_issue("the tutorial", "")
    assert main(["new", "Half the learning rate", "--prefix", str(prefix), "--write", "--experiments-dir",
                 str(experiments)]) == 0
    assert "created local/experiments#4: Half the learning rate" in capsys.readouterr().out
    assert (experiments / "exp4_half_the_learning_rate.py").is_file()
    assert main(["new", "Again", "--prefix", str(prefix), "--experiments-dir", str(experiments)]) == 0
    assert "created local/experiments#5: Again" in capsys.readouterr().out


def test_show_and_list_print_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    tracker = LocalTracker(str(tmp_path))
    tracker.create_issue("A", "body a", labels=["experiment"])
    tracker.create_comment(1, "status table")
    assert main(["show", "local/experiments#1", "--prefix", str(tmp_path), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["ref"], shown["title"], shown["labels"]) == ("local/experiments#1", "A", ["experiment"])
    assert [c["body"] for c in shown["comments"]] == ["status table"]
    assert main(["list", "--prefix", str(tmp_path), "--format", "json"]) == 0
    assert [i["number"] for i in json.loads(capsys.readouterr().out)] == [1]
