"""Browsing the files under the prefix: directory listings and size-capped previews.

Paths are cleaned by :func:`marin.dashboard.paths.clean_relpath` and checked against symlinks by the store.
A listing shows symlinks as `link` entries without following them; opening one that points outside the prefix
is refused. Previews read the first `max_bytes` only; the raw endpoint streams the file in chunks.
"""

from __future__ import annotations

from typing import Any

from marin.dashboard.schemas import FileEntry, FileListing, FilePreview
from marin.dashboard.store import PrefixStore


class FileNotFound(LookupError):
    pass


def _parent(rel: str) -> str | None:
    return None if not rel else rel.rpartition("/")[0]


def _mtime(info: dict[str, Any]) -> float | None:
    m = info.get("mtime")
    return float(m) if isinstance(m, int | float) else None


def browse(store: PrefixStore, rel: str, max_bytes: int = 64 << 10) -> FileListing | FilePreview:
    store.check_inside(rel)
    info = store.info(rel) if rel else {"type": "directory"}
    if info is None:
        raise FileNotFound(f"no file or directory {rel!r} under the prefix")
    if info.get("type") == "directory":
        entries = []
        for e in store.ls(rel):
            child = f"{rel}/{e['name']}" if rel else e["name"]
            kind = "link" if e["info"].get("islink") else e["type"]
            entries.append(
                FileEntry(name=e["name"], path=child, type=kind, size=e["size"], mtime=_mtime(e["info"]))
            )
        entries.sort(key=lambda e: (e.type != "directory", e.name))
        return FileListing(path=rel, parent=_parent(rel), entries=entries)
    data, _, size = store.read_range(rel, 0, max_bytes, jump=False)
    binary = b"\x00" in data[:8192]
    text = None
    if not binary:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            # A window cut in the middle of a character is still text; anything else is binary.
            if e.start >= len(data) - 3:
                text = data[: e.start].decode("utf-8")
            else:
                binary = True
    return FilePreview(
        path=rel, parent=_parent(rel), size=size, text=text, truncated=size > len(data), binary=binary
    )
