"""Hostile content: every string from storage is escaped, and file access cannot leave the prefix."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from marin.dashboard.paths import UnsafePathError, clean_relpath

from .conftest import HOSTILE_STEP, IMG, XSS

RAW_MARKUP = ("<script>alert", "<img src=x", "<b>x</b>")


def _assert_escaped(html: str) -> None:
    for raw in RAW_MARKUP:
        assert raw not in html, f"unescaped {raw!r} in the page"


def test_experiment_list_escapes_every_string(hostile_client: TestClient) -> None:
    r = hostile_client.get("/")
    assert r.status_code == 200
    _assert_escaped(r.text)
    assert "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;" in r.text  # the description is shown, as text


def test_experiment_page_escapes_every_string(
    hostile_client: TestClient, hostile_prefix: tuple[Path, dict[str, str]]
) -> None:
    exp_id = hostile_prefix[1]["experiment"]
    r = hostile_client.get("/experiments/" + quote(exp_id, safe=""))
    assert r.status_code == 200
    _assert_escaped(r.text)
    assert "&lt;img src=x onerror=alert(1)&gt;" in r.text
    api = hostile_client.get("/api/experiments/" + quote(exp_id, safe="")).json()
    assert api["description"] == f"description {XSS}"  # the API returns data as-is (JSON, not HTML)
    assert api["issue"]["url"] is None  # not a well-formed owner/repo#N reference: shown, never linked


def test_step_page_escapes_config_log_error_and_events(
    hostile_client: TestClient, hostile_prefix: tuple[Path, dict[str, str]]
) -> None:
    rel = hostile_prefix[1]["step"]
    r = hostile_client.get("/steps/" + quote(rel))
    assert r.status_code == 200, r.text
    _assert_escaped(r.text)
    assert "&lt;/pre&gt;" in r.text  # the config value that tries to close the <pre>
    step = hostile_client.get("/api/steps/" + quote(rel)).json()
    assert step["name"] == HOSTILE_STEP
    assert step["status"]["error"]["message"] == f"bad {XSS}"
    tail = hostile_client.get("/api/logs/" + quote(rel)).json()
    assert XSS in tail["text"]  # served as JSON; the page inserts it with textContent


def test_file_pages_escape_names_and_contents(
    hostile_client: TestClient, hostile_prefix: tuple[Path, dict[str, str]]
) -> None:
    rel = hostile_prefix[1]["step"]
    listing = hostile_client.get("/files/" + quote(rel))
    assert listing.status_code == 200
    _assert_escaped(listing.text)
    preview = hostile_client.get("/files/" + quote(f"{rel}/{IMG}.txt"))
    assert preview.status_code == 200
    _assert_escaped(preview.text)
    raw = hostile_client.get("/raw/" + quote(f"{rel}/{IMG}.txt"))
    assert raw.status_code == 200
    assert raw.content == f"file {XSS}".encode()
    assert raw.headers["content-type"] == "application/octet-stream"
    assert raw.headers["content-disposition"].startswith("attachment")
    assert raw.headers["x-content-type-options"] == "nosniff"


def test_pages_forbid_inline_and_external_scripts(hostile_client: TestClient) -> None:
    csp = hostile_client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp


@pytest.mark.parametrize(
    "url",
    [
        "/api/files/%2e%2e/%2e%2e/etc/passwd",
        "/api/files/..%2f..%2fetc%2fpasswd",
        "/api/files/%252e%252e/%252e%252e/etc/passwd",
        "/api/files//etc/passwd",
        "/api/files/a/%2e%2e/%2e%2e/etc/passwd",
        "/api/files/..%5c..%5cetc%5cpasswd",
        "/api/files/%00",
        "/raw/%2e%2e/%2e%2e/etc/passwd",
        "/raw//etc/passwd",
        "/files/%2e%2e/",
        "/api/steps/%2e%2e/%2e%2e/etc",
        "/api/logs/%2e%2e/x",
        "/api/metrics/%2e%2e/x",
        "/api/files/secret-link.txt",
        "/raw/secret-link.txt",
        "/api/files/outside-dir",
        "/api/files/outside-dir/secret.txt",
        "/raw/outside-dir/secret.txt",
        "/api/files/file:%2f%2f%2fetc%2fpasswd",
    ],
    ids=lambda u: u,
)
def test_traversal_is_refused(hostile_client: TestClient, url: str) -> None:
    r = hostile_client.get(url)
    assert r.status_code in (400, 404), (url, r.status_code, r.text[:200])
    assert "TOP-SECRET" not in r.text and "root:" not in r.text


def test_plain_dotdot_in_url_never_reaches_outside(hostile_client: TestClient) -> None:
    # Clients normalise "../" themselves; whatever arrives must still not be served from outside.
    r = hostile_client.get("/raw/../../../../etc/passwd")
    assert r.status_code in (400, 404)
    assert "root:" not in r.text


def test_symlink_inside_the_prefix_is_served(hostile_client: TestClient) -> None:
    r = hostile_client.get("/raw/inside-link.txt")
    assert r.status_code == 200
    assert r.content == f"file {XSS}".encode()


def test_listing_shows_links_without_following_them(hostile_client: TestClient) -> None:
    listing = hostile_client.get("/api/files").json()
    kinds = {e["name"]: e["type"] for e in listing["entries"]}
    assert kinds["secret-link.txt"] == "link"
    assert kinds["outside-dir"] == "link"


@pytest.mark.parametrize(
    "raw",
    [
        "../x",
        "a/../../b",
        "/etc",
        "a/./b",
        "%2e%2e/x",
        "%252e%252e",
        "a\\b",
        "C:/x",
        "gs://b/x",
        "a\x00b",
        "..%2fx",
    ],
)
def test_clean_relpath_refuses(raw: str) -> None:
    with pytest.raises(UnsafePathError):
        clean_relpath(raw)


@pytest.mark.parametrize(
    ("raw", "clean"), [("a/b", "a/b"), ("a//b/", "a/b"), ("", ""), ("x..y/z", "x..y/z"), ("<b>", "<b>")]
)
def test_clean_relpath_accepts(raw: str, clean: str) -> None:
    assert clean_relpath(raw) == clean


def test_markdown_escapes_and_keeps_only_safe_links() -> None:
    from marin.dashboard.markdown import render

    html = str(
        render(
            "<!-- marin-status:x:1 -->\n## Run <b>x</b>\n| step | state |\n|---|---|\n"
            f"| {XSS} | [run](https://wandb.ai/a?b=1&c=2) [bad](javascript:alert(1)) |\n\n"
            '```\n<img src=x onerror=alert(1)>\n```\n[x](/issues/local/experiments/1) "q" [y](https://a.b/"onmouseover=alert(1))'
            # CommonMark (and GitHub) continue a quote onto the next line: a blank line ends it
            "\n> quoted <b>q</b>\n\n<sub>small <img src=x></sub>"
        )
    )
    _assert_escaped(html)
    assert "marin-status" not in html  # the hidden marker stays hidden
    assert "<table" in html and "<h3>Run &lt;b&gt;x&lt;/b&gt;</h3>" in html
    assert '<a href="https://wandb.ai/a?b=1&amp;c=2"' in html
    assert '<a href="/issues/local/experiments/1"' in html
    assert "<blockquote>quoted &lt;b&gt;q&lt;/b&gt;</blockquote>" in html and "<sub>small &lt;img" in html
    tags = _tags(html)
    assert {t for t, _ in tags} <= {
        "h3",
        "blockquote",
        "sub",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "a",
        "pre",
        "code",
        "p",
        "br",
    }
    for _, attrs in tags:
        assert not any(k.startswith("on") for k, _ in attrs)
        assert all(v.startswith(("https://", "/")) for k, v in attrs if k == "href")


def test_markdown_renders_what_github_issues_contain() -> None:
    from marin.dashboard.markdown import render

    html = str(render(
        "- [ ] todo\n- [x] done\n  - nested `<b>`\n\n"
        "| a | **b** |\n|---|---|\n| `x\\|y` | [l](https://e.org) |\n\n"
        "![plot](https://e.org/p.png) ![bad](javascript:alert(1)) ![proto](//evil.org/x.png)\n\n"
        "```html\n<!-- kept in code -->\n```\nline one\nline two ~~old~~ <sup>2</sup>"
    ))
    assert 'type="checkbox"' in html and 'checked="checked"' in html and html.count("<ul") == 2
    assert "<li>nested <code>&lt;b&gt;</code></li>" in html
    assert "<td><code>x|y</code></td>" in html  # an escaped pipe stays in its cell, as on GitHub
    assert "<th><strong>b</strong></th>" in html
    assert '<img src="https://e.org/p.png" alt="plot">' in html
    assert "![bad](javascript:alert(1))" in html and '<img src="//' not in html  # kept as text
    assert "&lt;!-- kept in code --&gt;" in html  # only comments in the text are dropped
    assert "line one<br>\nline two <s>old</s> <sup>2</sup>" in html
    for _, attrs in _tags(html):
        assert not any(k.startswith("on") for k, _ in attrs)
        urls = [v for k, v in attrs if k in ("href", "src")]
        assert all(v.startswith(("https://", "/")) and not v.startswith("//") for v in urls)


def _tags(html: str) -> list[tuple[str, list[tuple[str, str]]]]:
    from html.parser import HTMLParser

    found: list[tuple[str, list[tuple[str, str]]]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, [(k, v or "") for k, v in attrs]))

    Collect().feed(html)
    return found


def test_markdown_renders_details_summary_and_emoji_like_github() -> None:
    from marin.dashboard.markdown import render

    html = str(render(
        "Done :tada: :+1: but :not_an_emoji: stays\n\n"
        "<details>\n<summary>Logs **bold** <img src=x onerror=alert(1)></summary>\n\n- a\n- b\n\n"
        "```\n<details>\n</details>\n```\n</details>\n\n"
        "<details><summary>left open</summary>\n\n<script>alert(1)</script>\n"
    ))
    assert "<p>Done 🎉 👍 but :not_an_emoji: stays</p>" in html
    assert "<details><summary>Logs <strong>bold</strong> &lt;img src=x onerror=alert(1)&gt;</summary>" in html
    assert "<ul>\n<li>a</li>" in html
    assert "<pre><code>&lt;details&gt;\n&lt;/details&gt;\n</code></pre>\n</details>" in html  # code is code
    assert html.count("<details>") == html.count("</details>") == 2  # the open one is closed at the end
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert {tag for tag, _ in _tags(html)} <= {"p", "details", "summary", "strong", "ul", "li", "pre", "code"}


def test_records_read_through_a_symlink_out_of_the_prefix_are_refused(tmp_path: Path) -> None:
    """The store's own reads (status.json, step.json, logs) are confined by the file actually opened, as the
    file routes are: a record symlinked to a file outside the prefix is refused, one inside is read."""
    from marin.dashboard.store import PrefixStore

    prefix, outside = tmp_path / "prefix", tmp_path / "outside"
    (prefix / "step" / ".marin").mkdir(parents=True)
    outside.mkdir()
    (outside / "status.json").write_text('{"status": "TOP-SECRET"}')
    (outside / "attempt-1.log").write_text("TOP-SECRET log\n")
    (prefix / "real.json").write_text('{"status": "SUCCESS"}')
    (prefix / "step" / ".marin" / "status.json").symlink_to(outside / "status.json")
    (prefix / "step" / "inside.json").symlink_to(prefix / "real.json")
    (prefix / "step" / "attempt-1.log").symlink_to(outside / "attempt-1.log")
    store = PrefixStore(str(prefix))
    with pytest.raises(UnsafePathError, match="resolves outside the prefix"):
        store.read_json("step/.marin/status.json")
    with pytest.raises(UnsafePathError, match="resolves outside the prefix"):
        store.read_range("step/attempt-1.log", None, 1 << 10)
    assert store.read_json("step/inside.json") == {"status": "SUCCESS"}
    assert store.read_json("step/absent.json") is None
