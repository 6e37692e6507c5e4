"""Issue bodies and comments as HTML: markdown-it-py (CommonMark, GitHub tables, strikethrough, task lists).

Safety rules, on top of the parser:
- Raw HTML is off: `<b>`, `<img onerror=...>`, `<script>` in the text are shown as text, never as markup.
  Two exceptions, both matched inside one run of plain text and emitted as fixed tags: `<sub>...</sub>` and
  `<sup>...</sup>` (the publisher writes them), whose inside stays escaped. HTML comments (the status
  comment's hidden marker, `<!-- marin-status:... -->`) are dropped.
- Links and images are kept only for http(s) URLs and dashboard-relative paths (`/issues/...`); anything
  else (`javascript:`, `data:`, `//host`) stays plain text. Links get `rel="noreferrer noopener"`.
Presentation: a new line inside a paragraph is a line break (as on GitHub), headings are one level lower
than written (the page owns `h1`/`h2`), a quote holding one paragraph renders without the inner `<p>`, and
tables get the page's table classes. nh3 (an HTML sanitiser) is not needed: no HTML from the text is ever
emitted, so there is nothing to clean.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markupsafe import Markup
from mdit_py_plugins.tasklists import tasklists_plugin

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_SUB_SUP = re.compile(r"<(sub|sup)>(.*?)</\1>", re.DOTALL)
_SAFE_URL = re.compile(r"^(https?://|/(?!/))", re.IGNORECASE)


def _safe_link(url: str) -> bool:
    return bool(_SAFE_URL.match(url.strip()))


def _split_text(token: Token) -> list[Token]:
    """A text token without HTML comments, with <sub>/<sup> pairs as fixed tags around escaped text."""
    text = _COMMENT.sub("", token.content)
    out: list[Token] = []
    pos = 0
    for m in _SUB_SUP.finditer(text):
        out.append(_text(text[pos : m.start()]))
        out.extend([_tag(f"<{m.group(1)}>"), _text(m.group(2)), _tag(f"</{m.group(1)}>")])
        pos = m.end()
    out.append(_text(text[pos:]))
    return [t for t in out if t.content]


def _text(content: str) -> Token:
    token = Token("text", "", 0)
    token.content = content
    return token


def _tag(html: str) -> Token:
    token = Token("html_inline", "", 0)
    token.content = html  # one of four fixed strings, never text from the document
    return token


def _inline_text(state: StateCore) -> None:
    """Comments out, sub/sup in; paragraphs left empty (a paragraph that was only a comment) removed."""
    for token in state.tokens:
        if token.type == "inline" and token.children:
            token.children = [
                t for c in token.children for t in (_split_text(c) if c.type == "text" else [c])
            ]
    tokens = state.tokens
    keep: list[Token] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type == "paragraph_open" and i + 2 < len(tokens) and not tokens[i + 1].children:
            i += 3
            continue
        keep.append(t)
        i += 1
    state.tokens = keep


def _layout(state: StateCore) -> None:
    """Headings one level down, table classes, quotes of one paragraph without the inner <p>."""
    tokens = state.tokens
    for i, t in enumerate(tokens):
        if t.type in ("heading_open", "heading_close"):
            t.tag = f"h{min(int(t.tag[1]) + 1, 6)}"
        elif t.type == "table_open":
            t.attrSet("class", "list md")
        elif t.type == "blockquote_open":
            _tighten_quote(tokens, i)


def _tighten_quote(tokens: Sequence[Token], start: int) -> None:
    inner = []
    depth = 0
    for t in tokens[start + 1 :]:
        if t.type == "blockquote_close" and depth == 0:
            break
        depth += t.nesting if t.type.startswith("blockquote") else 0
        inner.append(t)
    if len(inner) == 3 and inner[0].type == "paragraph_open":
        inner[0].hidden = inner[2].hidden = True


def _render_link_open(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    tokens[idx].attrSet("rel", "noreferrer noopener")
    return str(self.renderToken(tokens, idx, options, env))


def _render_quote_open(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    return "<blockquote>"


def _render_quote_close(self: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    return "</blockquote>\n"


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "xhtmlOut": False})
    md.enable(["table", "strikethrough"]).use(tasklists_plugin)
    md.validateLink = _safe_link  # type: ignore[method-assign]
    md.core.ruler.push("marin_inline_text", _inline_text)
    md.core.ruler.push("marin_layout", _layout)
    md.add_render_rule("link_open", _render_link_open)
    md.add_render_rule("blockquote_open", _render_quote_open)
    md.add_render_rule("blockquote_close", _render_quote_close)
    return md


_MD = _parser()


def render(text: str) -> Markup:
    """Safe HTML for a Markdown document (an issue body or a comment)."""
    return Markup(_MD.render(text.replace("\r\n", "\n")).strip())
