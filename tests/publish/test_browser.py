"""The published site in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright), served by
a plain `python -m http.server` on 127.0.0.1 and opened from file://. Run inside the private network
namespace (scripts/netns, or dev.py test). Screenshots go to test-artifacts/publish/ (docs/publish.md)."""

from __future__ import annotations

import html
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
from tests.publish.data_lab import write_site_lab

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "publish"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
_LINK = re.compile(r'\s(?:href|src)="([^"]*)"')

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str, str]]:
    root = tmp_path_factory.mktemp("site-lab")
    prefix, ablation, data = write_site_lab(root)
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


def test_pages_render_filter_and_stay_on_their_origin(site: tuple[str, Path, str, str], page: Any) -> None:
    from playwright.sync_api import expect

    base, out, ablation, data = site
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(base + "/index.html")
    expect(page.locator("#site-table tbody tr")).to_have_count(3)
    page.fill("#site-q", "half the learning rate")
    expect(page.locator("#site-table tbody tr:visible")).to_have_count(1)
    expect(page.locator("#site-count")).to_have_text("1 of 3")
    page.screenshot(path=str(ARTIFACTS / "index.png"), full_page=True)
    page.fill("#site-q", "")
    page.locator("a.exp-link", has_text=ablation).click()
    expect(page.locator("h1")).to_contain_text(ablation)
    expect(page.locator("svg#dag g.node")).not_to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "experiment.png"), full_page=True)
    page.locator("a", has_text="Compare with its baseline").first.click()
    expect(page.locator("svg").first).to_be_visible()
    assert "/compare/" in page.url
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    page.goto(base + "/predictions.html")
    expect(page.locator("main")).to_contain_text("1.4610")
    page.goto(base + "/data.html")
    expect(page.locator("section.card")).to_have_count(2)
    page.locator("section.card h2 a", has_text="tiny-tokens").click()
    expect(page.locator("h1")).to_contain_text("Data card: data/tiny-tokens")
    expect(page.locator("main table")).to_contain_text("python")
    page.screenshot(path=str(ARTIFACTS / "datacard.png"), full_page=True)
    forecast = next(out.glob("steps/eval/tiny-????????.html"))  # the baseline's eval holds the forecast
    page.goto(base + "/" + forecast.relative_to(out).as_posix())
    expect(page.locator("#fit-plot")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "forecast.png"), full_page=True)
    assert page.problems == []


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
