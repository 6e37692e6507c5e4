"""The compare view in a real headless Chromium (Playwright + Debian's /usr/bin/chromium, inside the private
network namespace), served by `marin dashboard` over a real executor run of a baseline and a renamed ablation
(tests/compare/lab.py): runs ticked on the experiments list open the compare view, every chart holds both
runs on one pair of axes (one set of ticks, a y range containing both curves), the hover read-out names
both runs, the table shows the difference; the experiment page's "compare with its baseline" link opens the
same comparison. Screenshots go to test-artifacts/dashboard/compare*.png."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.compare import lab

from .test_browser import ARTIFACTS, CHROMIUM, FLAGS, ROOT, _free_port, _wait

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    prefix = str(tmp_path_factory.mktemp("compare-lab"))
    base, ablation = lab.lab_prefix(prefix)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "marin.dashboard.cli", "--prefix", prefix, "--port",
                               str(port), "--log-level", "warning"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            urllib.request.urlopen(url + "/api/experiments", timeout=2).read()
            return True
        except OSError:
            return False

    try:
        _wait(up, f"the dashboard on {url}", server, timeout=30)
        yield url, base, ablation
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = b.new_page(viewport={"width": 1400, "height": 900})
        pg.errors = []
        pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
        pg.on("response", lambda r: pg.errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        yield pg
        b.close()


def _check_shared_axes(pg: Any, base: str, ablation: str) -> None:
    from playwright.sync_api import expect

    charts = pg.locator("svg.line-chart")
    expect(charts).to_have_count(2)  # loss and grad_norm
    for i in range(2):
        chart = charts.nth(i)
        expect(chart.locator("polyline.series")).to_have_count(2)
        labels = [chart.locator("polyline.series").nth(k).get_attribute("data-label") for k in range(2)]
        assert labels == [base, ablation]
        assert chart.locator("g.x-ticks text.tick").count() >= 3
        assert chart.locator("g.y-ticks text.tick").count() >= 3
        plot = [float(v) for v in chart.get_attribute("data-plot").split(",")]
        for k in range(2):  # both curves inside the one plot area: one x range, one y range
            pts = chart.locator("polyline.series").nth(k).get_attribute("points").split()
            xs = [float(p.split(",")[0]) for p in pts]
            ys = [float(p.split(",")[1]) for p in pts]
            assert plot[0] - 0.5 <= min(xs) and max(xs) <= plot[2] + 0.5
            assert plot[1] - 0.5 <= min(ys) and max(ys) <= plot[3] + 0.5
            assert max(xs) == pytest.approx(plot[2], abs=0.5)  # both end at the last step
    box = charts.nth(0).bounding_box()
    pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    hover = charts.nth(0).locator("text.hover-text")
    expect(hover.nth(0)).to_contain_text(base)  # one read-out line per run, then the x value
    expect(hover.nth(1)).to_contain_text(ablation)
    expect(hover.nth(2)).to_contain_text("x ")


def test_compare_two_runs_from_the_list(served: tuple[str, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    url, base, ablation = served
    pg = page
    pg.goto(url + "/")
    expect(pg.locator("td[data-field=verdict]").first).not_to_have_text("")
    pg.locator(f"input[name=runs][value='{ablation}']").check()
    pg.locator(f"input[name=runs][value='{base}']").check()
    pg.locator("#compare-form button[type=submit]").click()
    expect(pg.locator("h1")).to_have_text("Compare")
    pg.locator("select[name=metric]").select_option(["loss", "grad_norm"])
    pg.locator("form.compare-options button[type=submit]").click()
    expect(pg.locator("ol.compare-runs li").first).to_contain_text(base)  # the oldest is the baseline
    _check_shared_axes(pg, base, ablation)
    want = (lab.bpb(0.002, "python") + lab.bpb(0.002, "prose")) / 2 - (
        lab.bpb(0.004, "python") + lab.bpb(0.004, "prose")) / 2
    diff = pg.locator("tr[data-metric='eval:macro.bpb'] .diff")
    assert float(diff.get_attribute("data-diff")) == pytest.approx(want)
    expect(diff).to_contain_text(f"{abs(want):.4g}")
    acc = pg.locator("tr[data-metric='choices:stdlib_next_line_v1.acc'] .diff")
    expect(acc).to_contain_text("± 0.02828")
    expect(pg.locator("table.config-diff[data-step='train/tiny-lr_half']")).to_contain_text("config.lr")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    pg.locator("select[name=smooth]").select_option("0.9")  # compare.js re-submits the form
    expect(pg.locator("p.chart-note").first).to_contain_text("weight 0.9")
    assert pg.errors == []


def test_compare_with_its_baseline_from_the_experiment_page(served: tuple[str, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    url, base, ablation = served
    pg = page
    pg.goto(f"{url}/experiments/{ablation}")
    expect(pg.locator("#results-verdict")).to_be_visible()
    pg.locator("a.compare-link").click()
    expect(pg.locator("ol.compare-runs li")).to_have_count(2)
    expect(pg.locator("svg.line-chart polyline.series")).to_have_count(2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "compare-baseline.png"), full_page=True)
    assert pg.errors == []


def test_the_dag_fits_its_box_with_the_result_steps_visible(served: tuple[str, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    url, _, ablation = served
    pg = page
    pg.set_viewport_size({"width": 420, "height": 900})  # narrower than the graph's natural width
    pg.goto(f"{url}/experiments/{ablation}")
    dag = pg.locator("svg#dag")
    natural = float(dag.get_attribute("width"))
    wrap = pg.locator("#dag-wrap").bounding_box()
    box = dag.bounding_box()
    assert box["width"] < natural  # scaled down to fit
    assert box["x"] + box["width"] <= wrap["x"] + wrap["width"] + 0.5
    result = pg.locator("svg#dag g.node", has=pg.locator("title", has_text="eval/tiny-lr_half"))
    rb = result.bounding_box()
    assert rb["x"] + rb["width"] <= wrap["x"] + wrap["width"] + 0.5  # the result step is in view
    expect(pg.locator(".dag-tools")).to_be_visible()
    pg.locator("#dag-actual").click()
    assert dag.bounding_box()["width"] == pytest.approx(natural, abs=1)
    assert pg.errors == []
