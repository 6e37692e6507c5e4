"""The dashboard's compare view and its numbers (issue 33 items 1 and 2) on a real executor run of a
baseline and a renamed ablation (tests/compare/lab.py), through FastAPI's TestClient: the JSON API equals
marin.compare's result, the page draws every run on one pair of axes as inline SVG (readable without
JavaScript), the table shows each difference, the config diff pairs renamed steps; the experiments list has a
verdict and headline column and checkboxes that open the compare view; the experiment page has a results
section and a link to compare with its baseline; step pages show final values, per-domain and
multiple-choice tables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from marin.compare import PrefixSource, compare
from marin.dashboard import create_app
from tests.compare import lab


@pytest.fixture(scope="module")
def lab_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, str, str]]:
    prefix = str(tmp_path_factory.mktemp("lab"))
    base, ablation = lab.lab_prefix(prefix)
    with TestClient(create_app(prefix, cache_ttl=0)) as client:
        yield client, prefix, base, ablation


def test_api_compare_is_the_library_result(lab_client: tuple[TestClient, str, str, str]) -> None:
    client, prefix, base, ablation = lab_client
    r = client.get("/api/compare", params={"runs": [base, ablation], "x": "tokens", "metric": ["loss", "lr"]})
    assert r.status_code == 200, r.text
    want = compare(PrefixSource(prefix), [base, ablation], metrics=["loss", "lr"], axis="tokens").to_json()
    assert r.json() == want
    one = client.get("/api/compare", params={"runs": ablation}).json()
    assert [run["label"] for run in one["runs"]] == [base, ablation]
    bad = client.get("/api/compare", params={"runs": ["nope", base]})
    assert bad.status_code == 400 and "'nope' is no experiment id" in bad.json()["detail"]


def test_compare_page_shares_axes_and_shows_differences(
        lab_client: tuple[TestClient, str, str, str]) -> None:
    client, _, base, ablation = lab_client
    r = client.get("/compare", params={"runs": f"{base},{ablation}", "smooth": "0.6", "logy": "true"})
    assert r.status_code == 200, r.text
    html = r.text
    charts = re.findall(r'<svg class="line-chart".*?</svg>', html, re.S)
    assert len(charts) == 1  # loss: both runs in one chart, so one x range and one y range
    assert len(re.findall(r"<polyline class=\"series\"", charts[0])) == 2
    assert 'data-log-y="1"' in charts[0] and "smoothed: exponential moving average, weight 0.6" in html
    first = lab.loss_at(lab.ROWS, 0.004)
    second = lab.loss_at(lab.ROWS, 0.002)
    row = re.search(r'<tr data-metric="train:loss">(.*?)</tr>', html, re.S)
    assert row is not None
    assert f'data-diff="{second - first}"' in row.group(1)
    assert "config.lr" in html and "0.004" in html and "0.002" in html
    assert "dependency train/tiny -&gt; train/tiny-lr_half" in html
    assert "<script" not in html.split("<main", 1)[1]  # no inline script: the page reads without JS
    empty = client.get("/compare")
    assert empty.status_code == 200 and "experiments list" in empty.text
    assert client.get("/compare", params={"runs": "nope"}).status_code == 400


def test_long_curves_are_downsampled_and_say_so(lab_client: tuple[TestClient, str, str, str]) -> None:
    client, _, base, ablation = lab_client
    html = client.get("/compare", params={"runs": [base, ablation], "max_points": 50}).text
    assert "downsampled on the server" in html
    for points in re.findall(r'<polyline class="series"[^>]*points="([^"]+)"', html):
        assert len(points.split()) <= 50
    assert f"({lab.ROWS} points, " in html


def test_experiments_list_has_verdicts_headlines_and_compare_checkboxes(
        lab_client: tuple[TestClient, str, str, str]) -> None:
    client, _, base, ablation = lab_client
    items = {e["id"]: e for e in client.get("/api/experiments").json()["items"]}
    assert items[ablation]["verdict"] in ("worked", "did_not_work")
    assert items[ablation]["headline"][0]["name"] == "eval/tiny-lr_half:macro.bpb"
    assert items[base]["verdict"] is None
    assert items[base]["headline"][0]["name"] == "eval/tiny:macro.bpb"
    html = client.get("/").text
    assert '<form id="compare-form" method="get" action="/compare">' in html
    assert f'<input type="checkbox" name="runs" value="{ablation}"' in html
    assert f'verdict-{items[ablation]["verdict"]}' in html


def test_experiment_page_has_results_and_a_baseline_link(
        lab_client: tuple[TestClient, str, str, str]) -> None:
    client, _, base, ablation = lab_client
    detail = client.get(f"/api/experiments/{ablation}").json()
    assert detail["baseline"] == base
    assert [r["name"] for r in detail["results"]] == ["train/tiny-lr_half", "eval/tiny-lr_half"]
    html = client.get(f"/experiments/{ablation}").text
    assert f'href="/compare?runs={base}&amp;runs={ablation}"' in html
    assert 'id="results-verdict"' in html and "deciding" in html
    assert client.get(f"/api/experiments/{base}").json()["baseline"] is None


def test_step_pages_show_final_values_and_eval_tables(
        lab_client: tuple[TestClient, str, str, str]) -> None:
    client, _, base, _ = lab_client
    steps = {s["name"]: s["path"] for s in client.get(f"/api/experiments/{base}").json()["steps"]}
    train = client.get(f"/steps/{steps['train/tiny']}", params={"smooth": 0.9}).text
    final = re.search(r'data-metric="loss">([^<]+)<', train)
    assert final is not None
    assert float(final.group(1)) == pytest.approx(lab.loss_at(lab.ROWS, 0.004), rel=1e-3)  # 4 digits shown
    assert '<svg class="line-chart"' in train and "weight 0.9" in train
    ev = client.get(f"/steps/{steps['eval/tiny']}").text
    python = re.search(r'<tr data-domain="python">(.*?)</tr>', ev, re.S)
    assert python is not None and f"{lab.bpb(0.004, 'python'):.4g}" in python.group(1)
    task = re.search(r'<tr data-task="stdlib_next_line_v1">(.*?)</tr>', ev, re.S)
    assert task is not None
    assert f"{lab.accuracy(0.004)[0]:.4g}" in task.group(1) and "± 0.02" in task.group(1)


def test_eval_standard_errors_over_documents_are_shown_where_recorded(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """eval.json's optional bpb_stderr/loss_stderr/documents (moe_trainer.evaluate, issue 33) appear as
    ± on the eval step's table and as the standard error of the metric in a comparison (never as metrics of
    their own); an eval.json written before them still reads, without ±."""
    prefix = str(tmp_path_factory.mktemp("lab-se"))
    base, ablation = lab.lab_prefix(prefix)
    with TestClient(create_app(prefix, cache_ttl=0)) as client:
        steps = {s["name"]: s["path"] for s in client.get(f"/api/experiments/{base}").json()["steps"]}
        path = Path(prefix, steps["eval/tiny"], "eval.json")
        doc = json.loads(path.read_text())
        for i, row in enumerate(doc["domains"].values()):
            row.update(bpb_stderr=0.0125 + i / 1000, loss_stderr=0.025, documents=40)
        doc["macro"]["bpb_stderr"] = 0.0091
        path.write_text(json.dumps(doc))
        page = client.get(f"/steps/{steps['eval/tiny']}").text
        python = re.search(r'<tr data-domain="python">(.*?)</tr>', page, re.S)
        assert python is not None and "± 0.0125" in python.group(1) and "± 0.025" in python.group(1)
        assert "<td class=\"num\">40</td>" in python.group(1) and "over the documents" in page
        macro = re.search(r'<tr data-domain="macro" class="summary-row">(.*?)</tr>', page, re.S)
        assert macro is not None and "± 0.0091" in macro.group(1)
        theirs = {s["name"]: s["path"] for s in client.get(f"/api/experiments/{ablation}").json()["steps"]}
        old = client.get(f"/steps/{theirs['eval/tiny-lr_half']}").text
        assert 'data-domain="python"' in old and "over the documents" not in old
        assert "±" not in re.search(r'<table class="list eval-domains".*?</table>', old, re.S).group(0)
        table = client.get("/api/compare", params={"runs": [base, ablation]}).json()["metrics"]
    rows = {r["metric"]: r for r in table}
    assert not any(k.endswith("_stderr") for k in rows)
    bpb = rows["eval:domains.python.bpb"]
    assert bpb["values"][0]["stderr"] == 0.0125 and bpb["values"][1]["stderr"] is None
    assert rows["eval:macro.bpb"]["values"][0]["stderr"] == 0.0091


def test_synthetic_list_and_compare(synthetic_client: TestClient, synthetic_prefix: Path) -> None:
    items = synthetic_client.get("/api/experiments", params={"limit": 4}).json()["items"]
    assert any(e["headline"] for e in items)
    ids = [e["id"] for e in items[:2]]
    doc = synthetic_client.get("/api/compare", params={"runs": ids}).json()
    assert doc["curves"][0]["series"] and doc["metrics"]


def test_fit_and_prediction_pages_show_the_fit_plot(lab_client: tuple[TestClient, str, str, str]) -> None:
    """(Last in this module: it adds a ladder's records to the lab's steps.) A step with fit.json shows the
    law through the runs; a step with prediction.json whose dependency wrote fit.json adds the target."""
    import json

    from tests.compare.test_fitplot import RECORD, fit_doc

    client, prefix, base, _ = lab_client
    steps = {s["name"]: s["path"] for s in client.get(f"/api/experiments/{base}").json()["steps"]}
    record = json.loads(RECORD.read_text())
    fit = fit_doc(record["points"][-1]["params"])
    Path(prefix, steps["train/tiny"], "fit.json").write_text(json.dumps(fit))
    Path(prefix, steps["eval/tiny"], "prediction.json").write_text(RECORD.read_text())
    fit_page = client.get(f"/steps/{steps['train/tiny']}").text
    assert 'id="fit-plot"' in fit_page and fit_page.count('<circle class="run"') == 6
    assert '<line class="interval"' not in fit_page
    prediction_page = client.get(f"/steps/{steps['eval/tiny']}").text
    assert 'id="fit-plot"' in prediction_page and '<line class="interval"' in prediction_page
    assert f"forecast {record['points'][-1]['point']:.4g}" in prediction_page
