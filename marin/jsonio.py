"""The engine's JSON: one canonical form (for hashes), one record text, one atomic write and one read.

Every layer may import this module (it imports nothing of the engine but `marin.errors`, like that module):
identity hashes and notebook / prediction hashes use `canonical_json`; status, manifest, step and
prediction files are written with `write_json` and read with `read_json`.

- `canonical_json(value)`: sorted keys, no whitespace, unicode kept as is; NaN and infinities refused
  (`ValueError`), since they have no JSON form. `canonical_sha256` is sha256 over that text.
- `write_json(store, path, data)`: replaces the file atomically through the store's `write_text` (every
  `marin.storage.Storage` promises readers see the old text or the new one: a temporary file plus
  `os.replace` locally, one PUT on an object store).
- `read_json(store, path)`: **None when the file does not exist**; a file that exists but is not JSON raises
  `marin.errors.CorruptFileError` naming the path. (`marin.status.files.read_json` is the lenient form for
  status records, which treats a corrupt file as absent.)

`store` is anything with `read_text(path) -> str | None` and `write_text(path, text)`: a `Storage`, e.g.
`marin.storage.fs.storage_for(path)` for a bare path or URL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from marin.errors import CorruptFileError


class TextStore(Protocol):
    """What reading and writing JSON needs of a store (`marin.storage.base.Storage` has both)."""

    def read_text(self, path: str) -> str | None: ...

    def write_text(self, path: str, text: str) -> None: ...


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, NaN refused, unicode kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_sha256(value: Any) -> str:
    """sha256 (hex) of `canonical_json(value)` in UTF-8."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def json_text(data: Any, *, pretty: bool = False) -> str:
    """The text of one JSON record file, newline-terminated: compact (the C encoder; indent is 10x slower),
    or with `pretty` indented by one and key-sorted, for records people read and diff."""
    if pretty:
        return json.dumps(data, indent=1, sort_keys=True) + "\n"
    return json.dumps(data, separators=(",", ":")) + "\n"


def parse_json(text: str | bytes, path: str) -> Any:
    """The JSON value of a file's text; `CorruptFileError` naming `path` when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e}); see docs/formats.md for its format") from e


def read_json(store: TextStore, path: str) -> Any:
    """The JSON value at `path`, or None when the file does not exist; `CorruptFileError` when it is not
    JSON."""
    text = store.read_text(path)
    return None if text is None else parse_json(text, path)


def write_json(store: TextStore, path: str, data: Any, *, pretty: bool = False) -> None:
    """Replace the file at `path` with `data`'s record text (`json_text`), atomically for readers."""
    store.write_text(path, json_text(data, pretty=pretty))
