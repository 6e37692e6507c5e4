"""The catalogue page and API, and the notebook on the experiment page, on a prefix with one experiment of
every outcome (made by real local runs: tests/fakes/notebook_prefix.py), including hostile text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from tests.fakes.notebook_prefix import write_notebook_prefix

RAW_MARKUP = ("<script>alert", "<img src=x")


@pytest.fixture(scope="module")
def notebook_prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    prefix = str(tmp_path_factory.mktemp("notebook"))
    return prefix, write_notebook_prefix(prefix)


@pytest.fixture(scope="module")
def client(notebook_prefix: tuple[str, dict[str, str]]) -> Iterator[TestClient]:
    with TestClient(create_app(notebook_prefix[0], cache_ttl=0)) as c:
        yield c


Prefix = tuple[str, dict[str, str]]


def test_the_catalogue_lists_every_experiment_with_counts(client: TestClient,
                                                          notebook_prefix: Prefix) -> None:
    data = client.get("/api/catalogue").json()
    assert data["headline"] == ("7 ideas: 2 worked, 1 did not work, 1 mixed, 1 inconclusive, "
                                "1 not evaluated, 1 infra failure")
    assert data["counts"] == {"worked": 2, "did_not_work": 1, "mixed": 1, "inconclusive": 1,
                              "not_evaluated": 1, "infra_failure": 1}
    by_id = {r["experiment"]: r for r in data["experiments"]}
    ids = notebook_prefix[1]
    for outcome in ("worked", "did_not_work", "mixed", "not_evaluated", "infra_failure", "inconclusive"):
        assert by_id[ids[outcome]]["outcome"] == outcome
    worked = by_id[ids["worked"]]
    assert worked["hypothesis"] == "lower is better" and worked["baseline"] == "eval/base:macro.bpb"
    assert "1.2 vs 1.3" in worked["deciding"] and worked["tags"] == ["moe", "router"]
    assert by_id[ids["inconclusive"]]["by"] == "alice"
    assert "1.25 vs 1.3" in by_id[ids["inconclusive"]]["deciding"]  # a person's verdict keeps the numbers


def test_the_catalogue_filters_by_outcome_and_tag(client: TestClient,
                                                 notebook_prefix: tuple[str, dict[str, str]]) -> None:
    ids = notebook_prefix[1]
    worked = client.get("/api/catalogue", params={"outcome": "worked"}).json()
    assert {r["experiment"] for r in worked["experiments"]} == {ids["worked"], ids["hostile"]}
    assert worked["headline"] == "2 ideas: 2 worked"
    two = client.get("/api/catalogue", params=[("outcome", "mixed"), ("outcome", "infra_failure")]).json()
    assert {r["experiment"] for r in two["experiments"]} == {ids["mixed"], ids["infra_failure"]}
    router = client.get("/api/catalogue", params={"tag": "router"}).json()
    assert {r["experiment"] for r in router["experiments"]} == {ids["worked"], ids["infra_failure"]}
    page = client.get("/catalogue", params={"outcome": "did_not_work"})
    assert page.status_code == 200 and ids["did_not_work"] in page.text and ids["worked"] not in page.text
    assert ">worked 2</a>" in page.text and "<strong>1 idea: 1 did not work</strong>" in page.text
    bad = client.get("/api/catalogue", params={"outcome": "great"})
    assert bad.status_code == 400 and "unknown outcome(s) great" in bad.json()["detail"]


def test_the_catalogue_exports_markdown(client: TestClient, notebook_prefix: Prefix) -> None:
    r = client.get("/api/catalogue.md", params={"tag": "moe"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown")
    lines = r.text.splitlines()
    assert lines[2] == "**2 ideas: 1 worked, 1 did not work**"
    assert lines[4].startswith("| Outcome | Experiment |") and len(lines) == 8
    assert all(line.count(" | ") == 6 for line in lines[6:])  # seven cells in every row
    hostile = client.get("/api/catalogue.md", params={"outcome": "worked"}).text
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile and "\\| pipe" in hostile


def test_hostile_hypotheses_and_notes_are_escaped(client: TestClient,
                                                   notebook_prefix: tuple[str, dict[str, str]]) -> None:
    page = client.get("/catalogue")
    assert page.status_code == 200
    for raw in RAW_MARKUP:
        assert raw not in page.text
    assert "hostile &lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;" in page.text
    assert "note &lt;script&gt;" in page.text
    exp = client.get("/experiments/" + quote(notebook_prefix[1]["hostile"], safe=""))
    assert exp.status_code == 200 and "Hypothesis and verdict" in exp.text
    for raw in RAW_MARKUP:
        assert raw not in exp.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in exp.text


def test_the_experiment_page_shows_the_frozen_notebook_and_the_verdict_history(
        client: TestClient, notebook_prefix: tuple[str, dict[str, str]]) -> None:
    exp_id = notebook_prefix[1]["inconclusive"]
    nb = client.get(f"/api/experiments/{exp_id}/notebook").json()
    assert nb["notebook"]["hypothesis"] == "judged by hand" and len(nb["notebook"]["sha256"]) == 64
    assert [(e["source"], e["outcome"]) for e in nb["history"]] == [("computed", "worked"),
                                                                     ("person", "inconclusive")]
    assert nb["current"]["by"] == "alice"
    page = client.get(f"/experiments/{exp_id}").text
    assert "judged by hand" in page and "the baseline was run on another seed" in page
    assert 'class="badge outcome-inconclusive"' in page and "eval/new:macro.bpb" in page
    assert client.get("/api/experiments/nope-00000000/notebook").status_code == 404


def test_the_experiment_page_shows_each_criterion_amendment(run_marin: Any, marin_prefix: str) -> None:
    """A criterion amended before the first verdict (docs/notebook.md) is shown on the experiment page and in
    its notebook API: when, by which run, the previous text and the new one, in order."""
    from marin import Criterion, Step, this_output_path
    from tests.marin.notebook_fns import EvalConfig, write_eval

    base = Step(name="eval/base", fn=write_eval, config=EvalConfig(this_output_path(), 1.30))
    new = Step(name="eval/new", fn=write_eval, config=EvalConfig(this_output_path(), 1.20))

    def crit(path: str) -> Criterion:
        return Criterion(metric=f"eval/new:{path}", better="lower", baseline=base, min_effect=0.05)

    texts = ["first <b>draft</b>", "second draft", "the new router lowers bits per byte"]
    runs = [run_marin([base, new], hypothesis=h, criterion=crit(p))
            for h, p in zip(texts, ("macro.bbp", "macro.bpx", "macro.bpb"), strict=True)]
    assert len({r.experiment_id for r in runs}) == 1
    exp_id = runs[0].experiment_id
    with TestClient(create_app(marin_prefix, cache_ttl=0)) as c:
        nb = c.get(f"/api/experiments/{exp_id}/notebook").json()
        page = c.get(f"/experiments/{exp_id}").text
    rows = nb["amendments"]
    assert [(r["run_id"], r["previous"]["hypothesis"], r["new"]["hypothesis"]) for r in rows] == [
        (runs[1].run_id, texts[0], texts[1]), (runs[2].run_id, texts[1], texts[2])]
    assert [r["previous"]["criteria"][0]["metric"] for r in rows] == ["eval/new:macro.bbp",
                                                                      "eval/new:macro.bpx"]
    assert rows[1]["new"]["criteria"][0]["metric"] == "eval/new:macro.bpb" and rows[0]["at"] < rows[1]["at"]
    assert nb["current"]["outcome"] == "worked"
    table = page[page.index('id="amendments"'):page.index("</table>", page.index('id="amendments"'))]
    assert table.count("<tr><td") == 2
    assert "first &lt;b&gt;draft&lt;/b&gt;" in table and "<b>draft" not in table
    assert table.index("eval/new:macro.bbp") < table.index("second draft") < table.index("eval/new:macro.bpx")
    assert table.index("eval/new:macro.bpx") < table.index("the new router lowers bits per byte")
    assert runs[1].run_id in table and runs[2].run_id in table
