"""Validation of the relative paths that URLs name under the prefix.

Every path a request names (a step's output path, a file to browse) is relative to the prefix. It is checked
here before it reaches fsspec: absolute paths, drive letters, URLs, backslashes, NUL bytes, `.`/`..` segments
and their percent-encoded forms (a second decoding pass catches `%2e%2e` that arrives after the first) are
refused with :class:`UnsafePathError`. Symlinks that point outside the prefix are refused later, by the store,
because only the filesystem knows where they point.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafePathError(ValueError):
    """A requested path would leave the prefix or is not a plain relative path."""


def clean_relpath(raw: str) -> str:
    """Return `raw` as a normalised relative path ("a/b/c", "" for the prefix itself), or raise.

    Empty segments (from "a//b" or a trailing slash) are dropped; nothing else is rewritten, so a path that is
    accepted names exactly one place under the prefix.
    """
    if "\x00" in raw or "\\" in raw:
        raise UnsafePathError(
            f"path {raw!r} contains a NUL byte or a backslash; use '/'-separated relative paths"
        )
    if raw.startswith("/") or _DRIVE.match(raw) or "://" in raw:
        raise UnsafePathError(f"path {raw!r} is absolute; give a path relative to the prefix")
    parts: list[str] = []
    for segment in raw.split("/"):
        if segment == "":
            continue
        decoded = segment
        # Decode repeatedly: a doubly-encoded "%252e%252e" must not survive as ".." one layer further down.
        for _ in range(3):
            decoded = unquote(decoded)
        if decoded in (".", "..") or "/" in decoded or "\\" in decoded or "\x00" in decoded:
            raise UnsafePathError(
                f"path {raw!r} has a forbidden segment {segment!r} ('.', '..' or an encoded separator)"
            )
        parts.append(segment)
    return "/".join(parts)


def join(root: str, rel: str) -> str:
    """Join a prefix root and a cleaned relative path with '/' (fsspec paths use '/' on every backend)."""
    return root.rstrip("/") + ("/" + rel if rel else "")
