"""Issue bodies and comments as HTML: markdown-it-py (CommonMark, GitHub tables, strikethrough, task lists).

Safety rules, on top of the parser:
- Raw HTML is off: `<b>`, `<img onerror=...>`, `<script>` in the text are shown as text, never as markup.
  Two exceptions, both matched inside one run of plain text and emitted as fixed tags: `<sub>...</sub>` and
  `<sup>...</sup>` (the publisher writes them), whose inside stays escaped. HTML comments (the status
  comment's hidden marker, `<!-- marin-status:... -->`) are dropped.
- Links and images are kept only for http(s) URLs and dashboard-relative paths (`/issues/...`); anything
  else (`javascript:`, `data:`, `//host`) stays plain text. Links get `rel="noreferrer noopener"`.
- `<details>` / `<summary>` (GitHub's collapsible sections) are recognised only as whole lines (`<details>`,
  `<details open>`, `<summary>TEXT</summary>`, `</details>`, outside fenced code) and emitted as fixed tags;
  the summary is rendered as inline Markdown (escaped) and the body as Markdown, nesting included; a section
  left open is closed at the end.
- Emoji shortcodes (`:tada:`, `:+1:`, `:white_check_mark:`...) become their characters, from a fixed table
  of the ones GitHub users type most (`EMOJI`); unknown ones stay as written. The stylesheet lists the emoji
  fonts of every platform, so the characters do not render as empty boxes.
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
_DETAILS = re.compile(r"^\s*<details(\s+open)?\s*>\s*(?:<summary>(.*?)</summary>)?\s*$", re.IGNORECASE)
_SUMMARY = re.compile(r"^\s*<summary>(.*?)</summary>\s*$", re.IGNORECASE)
_END = re.compile(r"^\s*</details>\s*$", re.IGNORECASE)
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_SHORTCODE = re.compile(r":([a-z0-9_+-]+):")
EMOJI = {
    "+1": "👍", "thumbsup": "👍", "-1": "👎", "thumbsdown": "👎", "tada": "🎉", "rocket": "🚀",
    "warning": "⚠️", "white_check_mark": "✅", "heavy_check_mark": "✔️", "x": "❌", "bug": "🐛",
    "fire": "🔥", "eyes": "👀", "sparkles": "✨", "memo": "📝", "bulb": "💡", "construction": "🚧",
    "hourglass": "⌛", "hourglass_flowing_sand": "⏳", "question": "❓", "exclamation": "❗", "star": "⭐",
    "heart": "❤️", "smile": "😄", "slightly_smiling_face": "🙂", "thinking": "🤔", "confused": "😕",
    "chart_with_upwards_trend": "📈", "chart_with_downwards_trend": "📉", "bar_chart": "📊",
    "mag": "🔍", "lock": "🔒", "wrench": "🔧", "hammer": "🔨", "gear": "⚙️", "zap": "⚡", "boom": "💥",
    "100": "💯", "ok_hand": "👌", "clap": "👏", "pray": "🙏", "muscle": "💪", "point_right": "👉",
    "arrow_right": "➡️", "arrow_up": "⬆️", "arrow_down": "⬇️", "red_circle": "🔴", "green_circle": "🟢",
    "yellow_circle": "🟡", "large_blue_circle": "🔵", "no_entry": "⛔", "stop_sign": "🛑",
    "checkered_flag": "🏁",
    "package": "📦", "books": "📚", "book": "📖", "link": "🔗", "pushpin": "📌", "calendar": "📅",
    "clock1": "🕐", "test_tube": "🧪", "microscope": "🔬", "robot": "🤖", "brain": "🧠", "cry": "😢",
    "sweat_smile": "😅", "joy": "😂", "laughing": "😆", "rotating_light": "🚨", "recycle": "♻️",
}
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
    token.content = _SHORTCODE.sub(lambda m: EMOJI.get(m.group(1), m.group(0)), content)
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


def _sections(lines: list[str]) -> list[tuple[str, str]]:
    """The document as ("md", text) runs and ("open", summary) / ("close", "") markers of <details>."""
    out: list[tuple[str, str]] = []
    run: list[str] = []
    depth, fenced = 0, False

    def flush() -> None:
        if run:
            out.append(("md", "\n".join(run)))
            run.clear()

    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
        details, summary = (None, None) if fenced else (_DETAILS.match(line), _SUMMARY.match(line))
        if details:
            flush()
            out.append(("open", details.group(2) or ""))
            depth += 1
        elif summary and depth and out and out[-1] == ("open", ""):
            out[-1] = ("open", summary.group(1))
        elif depth and not fenced and _END.match(line):
            flush()
            out.append(("close", ""))
            depth -= 1
        else:
            run.append(line)
    flush()
    return out + [("close", "")] * depth


def render(text: str) -> Markup:
    """Safe HTML for a Markdown document (an issue body or a comment)."""
    parts = []
    for kind, value in _sections(text.replace("\r\n", "\n").split("\n")):
        if kind == "open":
            summary = _MD.renderInline(value).strip() if value.strip() else "Details"
            parts.append(f"<details><summary>{summary}</summary>")
        elif kind == "close":
            parts.append("</details>")
        else:
            parts.append(_MD.render(value).strip())
    return Markup("\n".join(p for p in parts if p))
