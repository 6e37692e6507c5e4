"""Appending lines to a JSONL file on any fsspec store: ``metrics.jsonl`` and ``alerts.jsonl`` share it.

A local file is appended in place (a reader sees every line as soon as it is written). Object stores cannot
append: there the lines are kept in memory and the whole file is rewritten, after every ``batch`` appended
lines, on an append marked ``durable``, and on :meth:`JsonlFile.flush`. Rewriting from memory means the
object always holds every line written so far, in order, so a reader never sees a partial history.
"""

from __future__ import annotations

from collections.abc import Iterable

import fsspec


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (plain or ``file://``): appendable in place."""
    return "://" not in url or url.startswith("file://")


class JsonlFile:
    """One JSONL file written by appending lines (see the module docstring)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, *, local: bool,
                 lines: Iterable[str] = (), batch: int = 1) -> None:
        """``lines`` are those already in the file (an object store's rewrite must keep them); ``batch``
        is how many appended lines an object store buffers before rewriting."""
        self.fs, self.path, self.local, self.batch = fs, path, local, max(batch, 1)
        self._lines = list(lines)
        self._dirty = 0

    def append(self, line: str, *, durable: bool = False) -> None:
        """Write one line (ending in a newline)."""
        if self.local:
            with self.fs.open(self.path, "a") as f:
                f.write(line)
            return
        self._lines.append(line)
        self._dirty += 1
        if durable or self._dirty >= self.batch:
            self.flush()

    def flush(self) -> None:
        """Make every appended line durable (a no-op for local files, always written at once)."""
        if self.local or not self._dirty:
            return
        with self.fs.open(self.path, "w") as f:
            f.writelines(self._lines)
        self._dirty = 0
