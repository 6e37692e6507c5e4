"""Dashboard URLs -> the static site's files, and the HTML rewrite that makes every link relative.

A page of the site is the dashboard page at the same URL; its file is `pages.file_of(url)`:
`/` -> index.html, `/experiments/ID` -> experiments/ID.html, `/steps/a/b-1234` -> steps/a/b-1234.html,
`/compare?runs=A&runs=B` -> compare/<digest of the query>.html, `/catalogue` -> catalogue.html, `/static/x`
-> static/x. A segment that is not a plain file name (or that redaction would change) becomes a digest, so no
file name or URL carries a hidden name. :func:`rewrite` turns every `href`/`src`/`action` into a path
relative to the page (so the tree works from file:// and any static host), drops the link of any target the
site does not publish (the text stays), and keeps only the scripts that need no server.
"""

from __future__ import annotations

import hashlib
import html
import posixpath
import re
from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_ATTR = re.compile(r'\s(href|src|action)="([^"]*)"')
_SCRIPT = re.compile(r'<script src="/static/([a-z_]+\.js)" defer></script>')
SITE_PAGES = ("catalogue", "predictions", "alerts", "timeline", "data")
STATIC_SCRIPTS = ("app.js", "charts.js", "compare.js", "publish.js")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_of(url: str, safe: Callable[[str], str]) -> str | None:
    """The site file that holds the page at `url` (None: the site has no such kind of page)."""
    parts = urlsplit(html.unescape(url))
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return None
    path = unquote(parts.path)
    if path == "/compare" and parts.query:
        runs = [v for k, v in parse_qsl(parts.query) if k == "runs"]
        return f"compare/{_digest(chr(0).join(runs))}.html" if runs else None
    if parts.query:
        return None
    if path == "/":
        return "index.html"
    if path.startswith("/static/"):
        return path[1:]
    if path.strip("/") in SITE_PAGES:
        return path.strip("/") + ".html"
    for kind in ("experiments", "steps", "data"):
        if path.startswith(f"/{kind}/"):
            segs = [s for s in path[len(kind) + 2:].split("/") if s]
            names = [s if _PLAIN.match(s) and safe(s) == s else "h-" + _digest(s) for s in segs]
            return f"{kind}/{'/'.join(names)}.html" if names else None
    return None


def relative(target: str, page: str) -> str:
    """posixpath.relpath(target, the page's folder), without its two getcwd calls per link (site files are
    relative paths; one holding an empty, `.` or `..` segment goes through relpath)."""
    start = posixpath.dirname(page)
    to, here = target.split("/"), start.split("/") if start else []
    if any(s in ("", ".", "..") for s in (*to, *here)):
        return posixpath.relpath(target, start or ".")
    n = 0
    while n < min(len(to), len(here)) and to[n] == here[n]:
        n += 1
    return "/".join([".."] * (len(here) - n) + to[n:]) or "."


def rewrite(text: str, page: str, published: Callable[[str], bool], safe: Callable[[str], str],
            targets: set[str] | None = None) -> str:
    """`text` (a page rendered at a dashboard URL, to be written at `page`) with relative links only;
    `targets` collects every site file a link pointed at (published or not: what the page's bytes depend
    on beyond its records)."""
    text = _SCRIPT.sub(lambda m: m.group(0) if m.group(1) in STATIC_SCRIPTS else "", text)

    def one(m: re.Match[str]) -> str:
        attr, url = m.group(1), html.unescape(m.group(2))
        if url.startswith("#") or url.startswith(("http://", "https://", "mailto:")) and attr == "href":
            return m.group(0)
        path, _, fragment = url.partition("#")
        target = file_of(path, safe)
        if target is not None and targets is not None:
            targets.add(target)
        if target is None or not published(target):
            return "" if attr != "action" else ' action=""'
        rel = relative(target, page) + (f"#{fragment}" if fragment else "")
        return f' {attr}="{html.escape(rel)}"'

    return _ATTR.sub(one, text)
