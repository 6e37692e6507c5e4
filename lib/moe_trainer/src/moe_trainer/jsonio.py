"""The trainer's files written whole: one atomic write and one JSON read, for every path fsspec opens.

``write_atomic`` writes so that no reader ever sees a partial file: a temporary file renamed into place on a
local disk, one object (made visible only when it is closed) on an object store. ``write_json_atomic``
writes a JSON document to a URL (indented, keys sorted, UTF-8); three files keep a form of their own: the
one-line ``wandb.json`` (metrics.py) and ``watch.json`` heartbeat (watch.py), written compact by
``write_atomic`` on the filesystem their writer holds open, and a Hugging Face ``config.json`` (hf.py reads
and writes it in that format). ``read_json`` is the one way it reads any other: ``None`` when the file does
not exist, ``JsonFileError`` naming the path when it is not JSON. The operators write their JSON outputs
through the same two functions.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


class JsonFileError(ValueError):
    """A file that should hold a JSON document does not (cut short, or overwritten by something else)."""


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` of ``fs`` so that a reader never sees a partial file."""
    if isinstance(fs, LocalFileSystem):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                for c in chunks:
                    f.write(c)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    else:  # an object store PUT (simple or resumable) only becomes visible when the file is closed
        with fs.open(path, "wb") as f:
            for c in chunks:
                f.write(c)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (any fsspec URL; its directory is made); no reader sees it half-written."""
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    write_atomic(fs, p, [data])


def write_json_atomic(path: str, obj: Any, *, default: Callable[[Any], Any] | None = None) -> None:
    """Write ``obj`` as a JSON document to ``path`` atomically (``default`` converts what JSON can't hold)."""
    text = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False, default=default)
    write_bytes_atomic(path, text.encode())


def read_json(path: str, fs: fsspec.AbstractFileSystem | None = None) -> Any:
    """The JSON document at ``path`` (an fsspec URL, or a path of ``fs``); None when no file is there."""
    fs, p = (fs, path) if fs is not None else fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    with fs.open(p, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise JsonFileError(
            f"{path} is not a JSON document ({e}); it was cut short or overwritten: remove it, or write it "
            "again from its source"
        ) from e
