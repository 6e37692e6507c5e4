"""End-to-end in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

The dashboard is served by uvicorn in a subprocess on 127.0.0.1, as `marin dashboard` serves it. Run inside the
private network namespace: `scripts/netns /tmp/venvA/bin/python -m pytest tests/dashboard/test_browser.py`.
Screenshots are saved under test-artifacts/dashboard/.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.dashboard.synthetic import write_prefix

from .conftest import write_hostile_prefix

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install -y chromium)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    prefix = tmp_path_factory.mktemp("browser") / "prefix"
    prefix.mkdir()
    write_prefix(str(prefix), experiments=3, metrics_rows=80, groups=3)
    hostile = write_hostile_prefix(prefix)
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marin.dashboard.cli",
            "--prefix",
            str(prefix),
            "--port",
            str(port),
            "--cache-ttl",
            "0.2",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/api/experiments", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    raise RuntimeError(f"the dashboard did not start on {url}: {out}") from None
                time.sleep(0.2)
        yield url, prefix, hostile
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
    pg = ctx.new_page()
    pg.errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)  # type: ignore[attr-defined]
    pg.on("response", lambda r: pg.errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)  # type: ignore[attr-defined]
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))  # type: ignore[attr-defined]
    pg.on("dialog", lambda d: (pg.errors.append("dialog: " + d.message), d.dismiss()))  # type: ignore[attr-defined]
    yield pg
    ctx.close()


def test_navigate_experiment_to_step_with_dag_and_charts(
    served: tuple[str, Path, dict[str, str]], page: object
) -> None:
    from playwright.sync_api import expect

    url, _, _ = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg = page  # type: ignore[assignment]
    pg.goto(url + "/")
    expect(pg.locator("tr[data-id]")).to_have_count(4)
    pg.screenshot(path=str(ARTIFACTS / "experiments.png"), full_page=True)

    pg.locator("a.exp-link", has_text="sweep-00000000").click()
    expect(pg.locator("h1")).to_contain_text("sweep-00000000")
    expect(pg.locator("svg#dag g.node")).to_have_count(20)
    expect(pg.locator("svg#dag path.edge")).to_have_count(19)
    expect(pg.locator("svg#dag g.node.state-FAILED")).to_have_count(1)
    expect(pg.locator("svg#dag g.node.state-DEP_FAILED")).to_have_count(2)
    pg.screenshot(path=str(ARTIFACTS / "experiment.png"), full_page=True)

    pg.locator("svg#dag a.node-link", has=pg.locator("title", has_text="sweep00/train/model1 ")).click()
    expect(pg.locator("h1")).to_contain_text("sweep00/train/model1")
    expect(pg.locator("#chart-loss svg path.series")).to_have_count(1)
    expect(pg.locator("#chart-lr svg path.series")).to_have_count(1)
    expect(pg.locator("#chart-norms svg path.series")).to_have_count(2)
    expect(pg.locator("#chart-expert-load svg rect.cell")).to_have_count(4 * 8)
    expect(pg.locator("#chart-eval-history svg path.series")).to_have_count(3)
    expect(pg.locator("#log")).to_contain_text("[train] line 39 of step sweep00/train/model1")
    expect(pg.locator("#events tbody tr")).to_have_count(3)
    pg.screenshot(path=str(ARTIFACTS / "step.png"), full_page=True)
    assert pg.errors == []  # type: ignore[attr-defined]  # no script error, no CSP violation


def test_running_pages_refresh(served: tuple[str, Path, dict[str, str]], page: object) -> None:
    from playwright.sync_api import expect

    url, prefix, _ = served
    pg = page  # type: ignore[assignment]
    pg.goto(url + "/")
    pg.locator("a.exp-link", has_text="sweep-00000001").click()
    running = pg.locator("svg#dag g.node.state-RUNNING")
    expect(running).to_have_count(5)
    step_hash = running.first.get_attribute("data-hash")
    manifest = next((prefix / "experiments").glob("*-00000001.json"))
    entry = next(s for s in json.loads(manifest.read_text())["steps"] if s["hash"] == step_hash)
    status_path = Path(entry["output_path"]) / ".marin/status.json"
    status = json.loads(status_path.read_text())
    status.update(status="SUCCESS", ended=status["started"] + 2.0)
    status_path.write_text(json.dumps(status))
    expect(pg.locator(f'svg#dag g.node[data-hash="{step_hash}"]')).to_have_class(
        "node state-SUCCESS", timeout=15000
    )
    expect(running).to_have_count(4)

    # A running step's log is followed while it grows.
    other = running.first.get_attribute("data-hash")
    entry = next(s for s in json.loads(manifest.read_text())["steps"] if s["hash"] == other)
    pg.locator(f'svg#dag g.node[data-hash="{other}"]').click()
    expect(pg.locator("#step-state")).to_have_text("RUNNING")
    with (Path(entry["output_path"]) / ".marin/logs/attempt-1.log").open("a") as f:
        f.write("appended while the page was open\n")
    expect(pg.locator("#log")).to_contain_text("appended while the page was open", timeout=15000)
    pg.screenshot(path=str(ARTIFACTS / "step-running.png"), full_page=True)
    assert pg.errors == []  # type: ignore[attr-defined]


def test_hostile_content_is_inert(served: tuple[str, Path, dict[str, str]], page: object) -> None:
    from urllib.parse import quote

    from playwright.sync_api import expect

    url, _, hostile = served
    pg = page  # type: ignore[assignment]
    pg.goto(url + "/experiments/" + quote(hostile["experiment"], safe=""))
    expect(pg.locator("p.description")).to_have_text("description <script>alert('xss')</script>")
    expect(pg.locator("svg#dag g.node")).to_have_count(1)
    pg.goto(url + "/steps/" + quote(hostile["step"]))
    expect(pg.locator("#log")).to_contain_text("<img src=x onerror=alert(1)>")
    expect(pg.locator("#error-message")).to_have_text("bad <script>alert('xss')</script>")
    pg.screenshot(path=str(ARTIFACTS / "hostile-step.png"), full_page=True)
    assert pg.locator("img").count() == 0
    assert pg.errors == []  # type: ignore[attr-defined]  # no alert dialog ran
