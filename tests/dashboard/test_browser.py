"""End-to-end in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

The dashboard is served by uvicorn in a subprocess on 127.0.0.1, as `marin dashboard` serves it. Run inside
the private network namespace: `scripts/netns /tmp/venvA/bin/python -m pytest
tests/dashboard/test_browser.py`. Screenshots are saved under test-artifacts/dashboard/.
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
from typing import Any

import pytest

from .conftest import write_hostile_prefix

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
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


def _wait(
    predicate: Any, what: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"process exited while waiting for {what}: {out[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _status(prefix: Path, name: str) -> str | None:
    for path in prefix.glob(f"{name}-*/.marin/status.json"):
        return str(json.loads(path.read_text())["status"])
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str], Path]]:
    """A real executor run left in every state (tests/dashboard/live_run.py), plus hostile files, served by
    `marin dashboard` in a subprocess."""
    base = tmp_path_factory.mktemp("browser")
    prefix, workdir = base / "prefix", base / "work"
    prefix.mkdir()
    workdir.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen(
        [sys.executable, "-m", "tests.dashboard.live_run", str(prefix), str(workdir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    port = _free_port()
    server = None
    try:
        _wait(
            lambda: (
                (workdir / "started").exists()
                and _status(prefix, "live/child") == "DEP_FAILED"
                and _status(prefix, "eval/tiny") == "SUCCESS"
            ),
            "the run to reach every state",
            run,
        )
        hostile = write_hostile_prefix(prefix)
        server = subprocess.Popen(
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

        def up() -> bool:
            try:
                urllib.request.urlopen(url + "/api/experiments", timeout=2).read()
                return True
            except OSError:
                return False

        _wait(up, f"the dashboard on {url}", server, timeout=30)
        yield url, prefix, hostile, workdir
    finally:
        (workdir / "release").write_text("go\n")
        run.wait(timeout=60)
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("response", lambda r: pg.errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.errors.append("dialog: " + d.message), d.dismiss()))
    yield pg
    ctx.close()


def test_navigate_experiment_to_step_with_dag_and_charts(
    served: tuple[str, Path, dict[str, str], Path], page: Any
) -> None:
    from playwright.sync_api import expect

    url = served[0]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg = page
    pg.goto(url + "/")
    expect(pg.locator("tr[data-id]")).to_have_count(2)
    pg.screenshot(path=str(ARTIFACTS / "experiments.png"), full_page=True)

    pg.locator("a.exp-link", has_text="exp5_dashboard_live-").click()
    expect(pg.locator("h1")).to_contain_text("exp5_dashboard_live-")
    expect(pg.locator("svg#dag g.node")).to_have_count(5)
    expect(pg.locator("svg#dag path.edge")).to_have_count(2)
    for state, n in (("SUCCESS", 2), ("FAILED", 1), ("DEP_FAILED", 1), ("RUNNING", 1)):
        expect(pg.locator(f"svg#dag g.node.state-{state}")).to_have_count(n)
    pg.screenshot(path=str(ARTIFACTS / "experiment.png"), full_page=True)

    pg.locator("svg#dag a.node-link", has=pg.locator("title", has_text="train/tiny ")).click()
    expect(pg.locator("h1")).to_contain_text("train/tiny")
    expect(pg.locator("#chart-loss svg path.series")).to_have_count(1)
    expect(pg.locator("#chart-lr svg path.series")).to_have_count(1)
    expect(pg.locator("#chart-norms svg path.series")).to_have_count(2)
    expect(pg.locator("#chart-expert-load svg rect.cell")).to_have_count(2 * 4)
    expect(pg.locator("#chart-eval-history svg path.series")).to_have_count(2)
    expect(pg.locator("#log")).to_contain_text("step 79 loss")
    assert pg.locator("#events tbody tr").count() >= 2
    pg.screenshot(path=str(ARTIFACTS / "step.png"), full_page=True)

    pg.goto(url + "/")
    pg.locator("a.exp-link", has_text="exp5_dashboard_live-").click()
    pg.locator("svg#dag a.node-link", has=pg.locator("title", has_text="eval/tiny ")).click()
    expect(pg.locator("#chart-eval svg rect.bar")).to_have_count(4)
    assert pg.errors == []  # no script error, no failed request, no CSP violation


def test_running_pages_refresh(served: tuple[str, Path, dict[str, str], Path], page: Any) -> None:
    from playwright.sync_api import expect

    url, _, _, workdir = served
    pg = page
    pg.goto(url + "/")
    pg.locator("a.exp-link", has_text="exp5_dashboard_live-").click()
    running = pg.locator("svg#dag g.node.state-RUNNING")
    expect(running).to_have_count(1)
    expect(pg.locator("#exp-state")).to_have_text("RUNNING")
    step_hash = running.get_attribute("data-hash")

    # The running step's log is followed while it grows (it prints a line every 0.1 s).
    running.click()
    expect(pg.locator("#step-state")).to_have_text("RUNNING")
    expect(pg.locator("#log")).to_contain_text("tick 5")
    first = pg.locator("#log").text_content() or ""
    expect(pg.locator("#log")).not_to_have_text(first, timeout=15000)
    assert len(pg.locator("#log").text_content() or "") > len(first)
    pg.screenshot(path=str(ARTIFACTS / "step-running.png"), full_page=True)
    expect(pg.locator("#attempts tbody tr")).to_have_count(1)
    expect(pg.locator("#attempts tbody")).to_contain_text("RUNNING")

    pg.go_back()
    (workdir / "release").write_text("go\n")
    node = pg.locator(f'svg#dag g.node[data-hash="{step_hash}"]')
    expect(node).to_have_class("node state-SUCCESS", timeout=20000)
    expect(pg.locator("#exp-state")).to_have_text("FAILED", timeout=20000)  # live/bad failed
    assert pg.errors == []


def test_local_issue_shows_the_status_comment(
    served: tuple[str, Path, dict[str, str], Path], page: Any
) -> None:
    from playwright.sync_api import expect

    pg = page
    pg.goto(served[0] + "/issues")
    pg.locator("a", has_text="openlab/demo#5").first.click()
    expect(pg.locator("h1")).to_contain_text("openlab/demo#5")
    comment = pg.locator("article.comment", has_text="live/slow")
    expect(comment.locator("table.md").first).to_be_visible(timeout=20000)
    expect(comment).to_contain_text("live/bad")
    expect(pg.locator("a", has_text="exp5_dashboard_live-").first).to_be_visible()
    pg.screenshot(path=str(ARTIFACTS / "issue.png"), full_page=True)
    assert pg.errors == []


def test_hostile_content_is_inert(served: tuple[str, Path, dict[str, str], Path], page: Any) -> None:
    from urllib.parse import quote

    from playwright.sync_api import expect

    url, _, hostile, _ = served
    pg = page
    pg.goto(url + "/experiments/" + quote(hostile["experiment"], safe=""))
    expect(pg.locator("p.description")).to_have_text("description <script>alert('xss')</script>")
    expect(pg.locator("svg#dag g.node")).to_have_count(1)
    pg.goto(url + "/steps/" + quote(hostile["step"]))
    expect(pg.locator("#log")).to_contain_text("<img src=x onerror=alert(1)>")
    expect(pg.locator("#error-message")).to_have_text("bad <script>alert('xss')</script>")
    pg.screenshot(path=str(ARTIFACTS / "hostile-step.png"), full_page=True)
    assert pg.locator("img").count() == 0
    assert pg.errors == []  # no alert dialog ran


def test_list_says_when_new_experiments_appear(
    served: tuple[str, Path, dict[str, str], Path], page: Any
) -> None:
    from playwright.sync_api import expect

    from tests.fakes.synthetic_prefix import write_experiment

    url, prefix, _, _ = served
    pg = page
    pg.goto(url + "/")
    expect(pg.locator("#list-changed")).to_be_hidden()
    write_experiment(str(prefix), 3, metrics_rows=2)  # created in 2025: sorted last, but on this page
    expect(pg.locator("#list-changed")).to_be_visible(timeout=25000)
    pg.locator("#list-changed a").click()
    expect(pg.locator("tr[data-id]")).to_have_count(3)
    assert pg.errors == []


def test_progress_bars_in_a_log_show_their_latest_state(
    served: tuple[str, Path, dict[str, str], Path], page: Any
) -> None:
    """tqdm redraws its line with carriage returns: the viewer shows each line's last state, not every redraw
    glued into one long line (a step directory of its own, written through the status writers)."""
    from playwright.sync_api import expect

    from marin.status import files as sf
    from marin.storage import storage_for

    url, prefix, _, _ = served
    out = str(prefix / "progress" / "bars-0123abcd")
    storage = storage_for(out)
    sf.write_status(storage, out, name="progress/bars", hash="0123abcd" * 8, status=sf.SUCCESS, attempt=1,
                    run_id="r", executor="e", previous=None, started=1.0, ended=2.0)
    bars = "".join(f"\rtrain {p:3d}%|{'#' * (p // 10):<10}|" for p in range(0, 101, 10))
    storage.write_text(sf.log_path(out, 1), f"epoch 1\n{bars}\nwindows line\r\nhalf\rdone 50%\r\nend\n")
    page.goto(url + "/steps/progress/bars-0123abcd")
    expect(page.locator("#log")).to_contain_text("end")
    shown = page.locator("#log").text_content()
    assert shown == "epoch 1\ntrain 100%|##########|\nwindows line\ndone 50%\nend\n", shown
    assert page.errors == []


@pytest.fixture(scope="module")
def notebook_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The catalogue prefix (one experiment per outcome, and hostile text: tests/fakes/notebook_prefix.py)
    served by `marin dashboard` in a subprocess."""
    from tests.fakes.notebook_prefix import write_notebook_prefix

    prefix = tmp_path_factory.mktemp("notebook")
    ids = write_notebook_prefix(str(prefix))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "marin.dashboard.cli", "--prefix", str(prefix), "--port",
                               str(port), "--log-level", "warning"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            urllib.request.urlopen(url + "/api/catalogue", timeout=2).read()
            return True
        except OSError:
            return False

    try:
        _wait(up, f"the dashboard on {url}", server, timeout=30)
        yield url, ids
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_catalogue_filters_and_hostile_hypotheses_stay_text(notebook_served: tuple[str, dict[str, str]],
                                                            page: Any) -> None:
    from urllib.parse import quote

    from playwright.sync_api import expect

    url, ids = notebook_served
    page.goto(url + "/catalogue")
    expect(page.locator("#headline")).to_have_text(
        "7 ideas: 2 worked, 1 did not work, 1 mixed, 1 inconclusive, 1 not evaluated, 1 infra failure")
    expect(page.locator("#catalogue tbody tr")).to_have_count(7)
    expect(page.locator(f"tr:has-text('{ids['hostile']}') td.desc").first).to_contain_text(
        "hostile <script>alert('xss')</script> and <img src=x onerror=alert(1)> | pipe")
    page.select_option("select[name=outcome]", "worked")
    page.locator("form.filters button").click()
    expect(page.locator("#catalogue tbody tr")).to_have_count(2)
    page.screenshot(path=str(ARTIFACTS / "catalogue-worked.png"), full_page=True)
    page.goto(url + "/experiments/" + quote(ids["hostile"], safe=""))
    expect(page.locator("#notebook .note")).to_have_text("note <script>alert('xss')</script> "
                                                         "<img src=x onerror=alert(1)>")
    assert page.locator("img").count() == 0
    assert page.errors == []  # no alert dialog ran, no failed request
