"""The published site in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright), served by
a plain `python -m http.server` on 127.0.0.1 and opened from file://. Run inside the private network
namespace (scripts/netns, or dev.py test). Screenshots go to test-artifacts/publish/ (whole pages); with
MARIN_PUBLISH_SCREENSHOTS=DIR the test also writes the documentation's screenshots there (1000 px wide, the
first screen of each page, PNG; docs/publish.md says how to refresh docs/img/publish/)."""

from __future__ import annotations

import html
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from marin.publish.policy import parse_policy
from marin.publish.site import publish
from tests.operators.test_decontaminate import QUESTION
from tests.publish.data_lab import LEAK_MARK

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "publish"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
_LINK = re.compile(r'\s(?:href|src)="([^"]*)"')
DOCS_WIDTH, DOCS_HEIGHT = 1000, 720

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed")]


def _lab_in_a_fresh_process(root: Path) -> tuple[str, str, str]:
    """`write_site_lab` run by a new interpreter: the local backend forks its workers from the process that
    runs the experiment, and a test process that has already started threads (embedded Ray, JAX's) can hand
    a forked worker a lock held forever (seen: a worker stuck in JAX's lowering under pytest-xdist)."""
    code = ("import json, sys; from pathlib import Path; from tests.publish.data_lab import write_site_lab; "
            "print(json.dumps(write_site_lab(Path(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, str(root)], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    prefix, ablation, data = json.loads(done.stdout.strip().splitlines()[-1])
    return prefix, ablation, data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str, str]]:
    root = tmp_path_factory.mktemp("site-lab")
    prefix, ablation, data = _lab_in_a_fresh_process(root)
    out = root / "site"
    report = publish(prefix, str(out), parse_policy({"select": {"all": True}}))
    assert report.problems == []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(base + "/index.html", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "http.server did not start"
            time.sleep(0.2)
    yield base, out, ablation, data
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def page(site: tuple[str, Path, str, str]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    origin = site[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        pg = ctx.new_page()
        pg.problems = []
        pg.on("request", lambda r: pg.problems.append("left the site: " + r.url)
              if not r.url.startswith((origin + "/", "file://", "data:")) else None)
        pg.on("response",
              lambda r: pg.problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        pg.on("pageerror", lambda e: pg.problems.append(str(e)))
        yield pg
        browser.close()


def shot(page: Any, name: str) -> None:
    """The whole page into test-artifacts/publish/, and with MARIN_PUBLISH_SCREENSHOTS its first screen at
    the documentation's size."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    docs = os.environ.get("MARIN_PUBLISH_SCREENSHOTS")
    if docs:
        size = page.viewport_size
        Path(docs).mkdir(parents=True, exist_ok=True)
        page.set_viewport_size({"width": DOCS_WIDTH, "height": DOCS_HEIGHT})
        page.screenshot(path=str(Path(docs) / f"{name}.png"))
        page.set_viewport_size(size)


def test_pages_render_filter_and_stay_on_their_origin(site: tuple[str, Path, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    base, out, ablation, data = site
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(base + "/index.html")
    expect(page.locator("#site-table tbody tr")).to_have_count(3)
    page.fill("#site-q", "half the learning rate")
    expect(page.locator("#site-table tbody tr:visible")).to_have_count(1)
    expect(page.locator("#site-count")).to_have_text("1 of 3")
    shot(page, "index")
    page.fill("#site-q", "")
    page.locator("a.exp-link", has_text=ablation).click()
    expect(page.locator("h1")).to_contain_text(ablation)
    expect(page.locator("svg#dag g.node")).not_to_have_count(0)
    shot(page, "experiment")
    page.locator("a", has_text="Compare with its baseline").first.click()
    expect(page.locator("svg").first).to_be_visible()
    assert "/compare/" in page.url
    shot(page, "compare")
    page.goto(base + "/predictions.html")
    expect(page.locator("main")).to_contain_text("1.4610")
    page.goto(base + "/data.html")
    expect(page.locator("section.card")).to_have_count(4)  # ingest, decontaminate, tokenize, the mixture
    page.locator("section.card h2 a", has_text="tiny-tokens").click()
    expect(page.locator("h1")).to_contain_text("Data card: data/tiny-tokens")
    expect(page.locator("main table")).to_contain_text("python")
    shot(page, "datacard")
    page.goto(base + "/data.html")
    page.locator("section.card h2 a", has_text="tiny-mixture").click()
    expect(page.locator("h1")).to_contain_text("Data card: train/tiny-mixture")
    sources = page.locator("#mixture-sources")
    expect(sources).to_contain_text("python")  # sources, their caches, documents and tokens
    expect(sources).to_contain_text("prose")
    tokens = tokens_per_source(out)
    for source, count in tokens.items():
        expect(sources.locator("tr", has_text=source)).to_contain_text(str(count))
    weights = page.locator("#mixture-weights")  # weights by stage
    expect(weights.locator("tr", has_text="from step 0")).to_have_count(2)
    expect(weights.locator("tr", has_text="from step 2")).to_have_count(2)
    report = page.locator("table.decontamination").first  # the decontamination report
    expect(report).to_contain_text("gsm8k")
    expect(report.locator("tr", has_text="gsm8k")).to_contain_text("1 of 1")
    expect(page.locator("table.decontamination-domains tr", has_text="prose")).to_contain_text("1")
    shot(page, "mixture")
    forecast = next(out.glob("steps/eval/tiny-????????.html"))  # the baseline's eval holds the forecast
    page.goto(base + "/" + forecast.relative_to(out).as_posix())
    expect(page.locator("#fit-plot")).to_be_visible()
    shot(page, "forecast")
    assert page.problems == []


def tokens_per_source(out: Path) -> dict[str, int]:
    """The tokens of each mixture source as the tokenize step recorded them in the prefix (the fixture's
    prefix is the site's sibling `lab`)."""
    record = json.loads(next((out.parent / "lab").glob("data/tiny-tokens-*/tokenize.json")).read_text())
    return {s: int(record["stats"][f"train/{s}"]["totals"]["tokens"]) for s in ("python", "prose")}


def test_no_raw_document_is_published(site: tuple[str, Path, str, str]) -> None:
    _, out, _, _ = site
    leaked = [p for p in out.rglob("*") if p.is_file() and (
        LEAK_MARK.encode() in p.read_bytes() or QUESTION[:60].encode() in p.read_bytes())]
    assert leaked == []


def test_no_broken_link_anywhere(site: tuple[str, Path, str, str]) -> None:
    base, out, _, _ = site
    seen, queue, broken = {base + "/index.html"}, [base + "/index.html"], []
    while queue:
        url = queue.pop()
        body = urllib.request.urlopen(url, timeout=10).read().decode("utf-8")
        if not url.endswith(".html"):
            continue
        for raw in _LINK.findall(body):
            link = html.unescape(raw)
            if link.startswith(("http://", "https://", "mailto:")):
                continue  # an outside link is text for the reader; the browser test checks nothing is fetched
            target = urljoin(url, link).split("#")[0]
            assert urlsplit(target).netloc == urlsplit(base).netloc, (url, link)
            if target in seen:
                continue
            seen.add(target)
            try:
                urllib.request.urlopen(target, timeout=10)
                queue.append(target)
            except OSError as e:
                broken.append(f"{url} -> {link}: {e}")
    assert broken == []
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    assert {urlsplit(u).path.lstrip("/") for u in seen} >= pages  # every page is reachable from the index


def test_the_same_site_from_file_urls(site: tuple[str, Path, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    _, out, ablation, _ = site
    page.problems.clear()
    page.goto((out / "index.html").as_uri())
    expect(page.locator("#site-table tbody tr")).to_have_count(3)
    page.locator("a.exp-link", has_text=ablation).click()
    expect(page.locator("h1")).to_contain_text(ablation)
    color = page.evaluate("getComputedStyle(document.querySelector('header.top')).display")
    assert color != "inline"  # app.css applied from a relative path
    page.locator("a", has_text="Catalogue").first.click()
    assert page.url.endswith("catalogue.html")
    assert page.problems == []
