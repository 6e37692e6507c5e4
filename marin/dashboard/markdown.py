"""A small, safe Markdown renderer for issue bodies and status comments (the subset the publisher writes).

Safety comes from the order of operations: every line is HTML-escaped first, and markup is only ever added by
the fixed patterns below, so no character from the text can open a tag or an attribute. Links are kept only
for http(s) URLs and dashboard-relative paths; anything else (`javascript:`, `data:`) stays plain text. HTML
comments (the status comment's hidden marker) are dropped. Supported: headings, paragraphs, `-`/`*` lists,
pipe tables, `>` quotes, fenced code blocks, inline code, **bold**, <sub>/<sup> and [links](https://...).
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

_FENCE = re.compile(r"^(`{3,}|~{3,})")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_LIST = re.compile(r"^\s*[-*]\s+(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_LINK = re.compile(r"\[([^\]]+)\]\(((?:https?://|/)[^\s()\"'<>]*)\)")
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
_QUOTE = re.compile(r"^\s*>\s?(.*)$")
_SUB = re.compile(r"&lt;(sub|sup)&gt;(.*?)&lt;/\1&gt;")  # matched on escaped text: the inside stays escaped


def inline(text: str) -> str:
    """Escape one line of text, then add code, bold and link markup."""
    codes: list[str] = []

    def keep(m: re.Match[str]) -> str:
        codes.append(f"<code>{m.group(1)}</code>")
        return f"\x00{len(codes) - 1}\x00"

    out = _CODE.sub(keep, str(escape(text)))
    out = _LINK.sub(lambda m: f'<a href="{m.group(2)}" rel="noreferrer noopener">{m.group(1)}</a>', out)
    out = _BOLD.sub(r"<strong>\1</strong>", out)
    out = _SUB.sub(r"<\1>\2</\1>", out)
    return re.sub(r"\x00(\d+)\x00", lambda m: codes[int(m.group(1))], out)


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def render(text: str) -> Markup:
    lines = text.replace("\r\n", "\n").split("\n")
    html: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            html.append("<p>" + "<br>".join(inline(p) for p in para) + "</p>")
            para.clear()
        if items:
            html.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line.strip())
        if fence:
            flush()
            marker, body = fence.group(1), []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            html.append(f"<pre><code>{escape(chr(10).join(body))}</code></pre>")
        elif _COMMENT.match(line):
            pass
        elif line.strip().startswith("|") and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]):
            flush()
            head = "".join(f"<th>{inline(c)}</th>" for c in _cells(line))
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in _cells(lines[i])) + "</tr>")
                i += 1
            html.append(
                f'<table class="list md"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            )
            continue
        elif m := _QUOTE.match(line):
            flush()
            quoted = [m.group(1)]
            while i + 1 < len(lines) and (q := _QUOTE.match(lines[i + 1])):
                quoted.append(q.group(1))
                i += 1
            html.append("<blockquote>" + "<br>".join(inline(x) for x in quoted) + "</blockquote>")
        elif m := _HEADING.match(line):
            flush()
            level = min(len(m.group(1)) + 1, 6)
            html.append(f"<h{level}>{inline(m.group(2))}</h{level}>")
        elif m := _LIST.match(line):
            if para:
                flush()
            items.append(m.group(1))
        elif not line.strip():
            flush()
        else:
            if items:
                flush()
            para.append(line)
        i += 1
    flush()
    return Markup("\n".join(html))
