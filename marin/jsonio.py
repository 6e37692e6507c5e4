"""The engine's JSON: one canonical form (for hashes), one record text, one atomic write and one read.

Every layer may import this module (of the engine it imports only `marin.errors`; of the project only
`openlab_records.sealed`): identity hashes and notebook hashes use `canonical_json`; status, step, manifest,
ledger, alert and log-state files are written with `write_json` and read with `read_json`. The prediction
records (prediction.json, verdict.json, ...) are the records package's: `openlab_records` reads, writes and
seals them, and the engine uses its helpers for them.

- `canonical_json(value)`: sorted keys, no whitespace, unicode kept as is; NaN and infinities refused
  (`ValueError`), since they have no JSON form. It *is* `openlab_records.sealed.canonical_json` (one canonical
  form in the project: a record's `record_sha256` and a step's identity hash are computed over the same
  text). `canonical_sha256` is sha256 over that text.
- `write_json(store, path, data)`: replaces the file atomically through the store's `write_text` (every
  `marin.storage.Storage` promises readers see the old text or the new one: a temporary file plus
  `os.replace` locally, one PUT on an object store).
- `read_json(store, path)`: **None when the file does not exist**; a file that exists but is not JSON raises
  `marin.errors.CorruptFileError` naming the path. (`marin.status.files.read_record` is the lenient form for
  the engine's own records, which treats a corrupt file or one that is not an object as absent.)
- `parse_json(text, path)`: the same error for text read some other way (a byte range, a compare-and-swap
  read, a batch `cat`).

`store` is anything with `read_text(path) -> str | None` and `write_text(path, text)`: a `Storage`, e.g.
`marin.storage.fs.storage_for(path)` for a bare path or URL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from marin.errors import CorruptFileError
from openlab_records.sealed import canonical_json

__all__ = [
    "TextStore", "canonical_json", "canonical_sha256", "json_text", "parse_json", "read_json", "write_json",
]


class TextStore(Protocol):
    """What reading and writing JSON needs of a store (`marin.storage.base.Storage` has both)."""

    def read_text(self, path: str) -> str | None: ...

    def write_text(self, path: str, text: str) -> None: ...


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
    try:
        text = store.read_text(path)
    except UnicodeDecodeError as e:  # the store decodes UTF-8; bytes that are not are not JSON either
        raise CorruptFileError(f"{path} is not valid JSON ({e}); see docs/formats.md for its format") from e
    return None if text is None else parse_json(text, path)


def write_json(store: TextStore, path: str, data: Any, *, pretty: bool = False) -> None:
    """Replace the file at `path` with `data`'s record text (`json_text`), atomically for readers."""
    store.write_text(path, json_text(data, pretty=pretty))
