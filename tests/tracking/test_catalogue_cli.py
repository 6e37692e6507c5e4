"""`marin catalogue` on a prefix with one experiment of every outcome (tests/fakes/notebook_prefix.py)."""

from __future__ import annotations

import json

import pytest

from marin.cli import main as marin_main
from tests.fakes.notebook_prefix import write_notebook_prefix


@pytest.fixture(scope="module")
def notebook_prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    prefix = str(tmp_path_factory.mktemp("notebook"))
    return prefix, write_notebook_prefix(prefix)


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert marin_main(["catalogue", *args]) == 0
    return capsys.readouterr().out


def test_catalogue_table_json_and_markdown(notebook_prefix: tuple[str, dict[str, str]],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    prefix, ids = notebook_prefix
    table = _out(capsys, "--prefix", prefix)
    assert table.splitlines()[0] == ("7 ideas: 2 worked, 1 did not work, 1 mixed, 1 inconclusive, "
                                     "1 not evaluated, 1 infra failure")
    assert all(i in table for i in ids.values())
    doc = json.loads(_out(capsys, "--prefix", prefix, "--format", "json"))
    assert doc["counts"]["infra_failure"] == 1 and len(doc["experiments"]) == 7
    md = _out(capsys, "--prefix", prefix, "--format", "markdown", "--outcome", "did_not_work",
              "--outcome", "mixed")
    assert "**2 ideas: 1 did not work, 1 mixed**" in md
    assert f"| did not work | `{ids['did_not_work']}` |" in md and ids["worked"] not in md


def test_catalogue_filters_by_tag(notebook_prefix: tuple[str, dict[str, str]],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    prefix, ids = notebook_prefix
    doc = json.loads(_out(capsys, "--prefix", prefix, "--format", "json", "--tag", "moe", "--tag", "router"))
    assert [r["experiment"] for r in doc["experiments"]] == [ids["worked"]]
    assert doc["headline"] == "1 idea: 1 worked"
    with pytest.raises(SystemExit):
        marin_main(["catalogue", "--prefix", prefix, "--outcome", "great"])
    assert "invalid choice: 'great'" in capsys.readouterr().err
