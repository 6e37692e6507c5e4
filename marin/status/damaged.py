"""One policy for every state file the engine keeps: a file that cannot be read is named, never overwritten,
never silently rebuilt.

The state files are a step's `status.json`, `events.jsonl`, `lease.json`, `step.json`, `interruptions.json`
and `progress.json`, and the prefix's experiment manifests and verdicts (docs/formats.md). Any of them can be
damaged: a torn write on a store without atomic PUT, a disk error, a person's editor, a copy cut short.

- **Named.** A record that exists but is not its JSON object (truncated, binary, not an object) reads as
  `CorruptFileError` through `read_checked`, whose message names the path, what is wrong and the fix. The
  plan, `marin status`, `marin run` and the dashboard show that message (one warning, row or banner); none
  of them treats the step as never run without saying so.
- **Never overwritten.** A writer about to replace a damaged record moves it aside first (`move_aside`:
  `{path}.corrupt-{UTC time}`), so its bytes stay for inspection. A step whose status is unreadable and that
  is run again continues its attempt numbers from what is left (`files.attempts_on_record`: the events and the
  log files present), and the files of its earlier outputs are copied to `.marin/earlier-{N}/`
  (`keep_outputs`) before the new attempt writes; so are those of a step that succeeded and runs again
  (`--force-run`, outputs changed since): no log and no result of an earlier attempt is overwritten.
  Directories (checkpoints) stay in place, so a resumable step continues from them.
- **Rebuilt with a warning.** A damaged experiment manifest is moved aside and rebuilt from the steps' own
  records (status/manifest.py); a damaged interruption ledger is moved aside and a new one notes it.
- **JSONL.** A line that is not a JSON object (cut by a crash, binary bytes, not UTF-8) is skipped and
  counted (`parse_jsonl`); the rest of the file is read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar, overload

from marin import jsonio
from marin.definition.placeholders import join
from marin.errors import CorruptFileError
from marin.storage.base import Storage, aside_name

FIX = ("Fix: look at it (it is left as it is) and restore it from a copy if you have one; otherwise run "
       "again: it is moved aside, and every earlier attempt's log and outputs are kept")


_MANIFEST = re.compile(r"(^|/)experiments/[^/]+\.json$")
MANIFEST_FIX = ("Fix: look at it (it is left as it is) and restore it from a copy if you have one; otherwise "
                "the next run of the experiment moves it aside and rebuilds it from the steps' own records")


def damaged_message(path: str, why: str) -> str:
    """The one wording for a damaged state file: the path, what is wrong, the fix (an experiment manifest's
    differs: it is rebuilt, not re-run)."""
    fix = MANIFEST_FIX if _MANIFEST.search(path) else FIX
    return f"{path} cannot be read ({why}). {fix}"


def read_checked(storage: Storage, path: str) -> dict[str, Any] | None:
    """The JSON object at `path`; None when the file does not exist; `CorruptFileError` (see
    `damaged_message`) when it exists but is not a JSON object."""
    try:
        data = jsonio.read_json(storage, path)
    except CorruptFileError as e:
        raise _damaged(path, e) from e
    return _object(path, data)


def parse_checked(path: str, data: bytes | None) -> dict[str, Any] | None:
    """`read_checked` of bytes already read (a batch read: `Storage.read_many`), with the same answers."""
    try:
        value = None if data is None else jsonio.parse_json(data, path)
    except CorruptFileError as e:
        raise _damaged(path, e) from e
    return _object(path, value)


_T = TypeVar("_T")


@overload
def parse_lenient(path: str, data: bytes | None) -> dict[str, Any] | None: ...
@overload
def parse_lenient(path: str, data: bytes | None,
                  on_damage: Callable[[str], _T]) -> dict[str, Any] | _T | None: ...
def parse_lenient(path: str, data: bytes | None,
                  on_damage: Callable[[str], Any] | None = None) -> Any:
    """`parse_checked` for a reader that goes on past a damaged file: what `on_damage` makes of the message
    naming it (the file and the fix), or None without one."""
    try:
        return parse_checked(path, data)
    except CorruptFileError as e:
        return on_damage(str(e)) if on_damage is not None else None


def _damaged(path: str, e: CorruptFileError) -> CorruptFileError:
    cause = e.__cause__
    why = f"{type(cause).__name__}: {cause}" if cause is not None else str(e)
    return CorruptFileError(damaged_message(path, why))


def _object(path: str, data: Any) -> dict[str, Any] | None:
    if data is not None and not isinstance(data, dict):
        raise CorruptFileError(damaged_message(path, f"a JSON {type(data).__name__}, not an object"))
    return data


def move_aside(storage: Storage, path: str, now: float | None = None) -> str | None:
    """Move the damaged file at `path` to `aside_name(path)` (a number is added if that exists); returns
    where it went, or None when it is gone already."""
    target = aside_name(path, now)
    n = 1
    while storage.exists(target):
        n += 1
        target = f"{aside_name(path, now)}.{n}"
    try:
        storage.move(path, target)
    except FileNotFoundError:
        return None
    return target


def parse_jsonl(data: bytes | str | None) -> tuple[list[dict[str, Any]], int]:
    """(the JSON objects of a JSONL file's lines, how many non-blank lines were skipped): a line cut by a
    crash, one of binary bytes and one that is not an object are all skipped and counted."""
    if not data:
        return [], 0
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    rows: list[dict[str, Any]] = []
    skipped = 0
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            skipped += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def skipped_message(path: str, skipped: int) -> str:
    return (f"{path}: {skipped} line(s) skipped (cut short, binary or not a JSON object); the other lines "
            "are shown. The file is append-only and is never rewritten")


def keep_outputs(storage: Storage, output_path: str, attempt: int) -> str | None:
    """Copy every file a step wrote at the top of its output path (its results and records:
    `train_result.json`, `eval.json`, `metrics.jsonl`, ...) to `.marin/earlier-{attempt}/`, so a new attempt
    cannot overwrite an earlier attempt's results. Directories (`checkpoints/`, shards) stay where they are:
    they are the working state a re-run continues from, as a retry after a failure does (a train step
    resumes from its checkpoints). Returns that directory, or None when there was no file to keep."""
    names = [n for n in storage.listdir(output_path) or [] if n != ".marin"]
    files = [n for n in names if storage.file_info(join(output_path, n)) is not None]
    if not files:
        return None
    kept = join(output_path, f".marin/earlier-{attempt}")
    n = 1
    while storage.exists(kept):
        n += 1
        kept = join(output_path, f".marin/earlier-{attempt}.{n}")
    storage.makedirs(kept)
    for name in files:
        _copy(storage, join(output_path, name), join(kept, name))
    return kept


def _copy(storage: Storage, src: str, dst: str) -> None:
    """Copy one file within a store (local disk: a plain copy; an object store: streamed through a local
    temporary file, which `upload_file` sends)."""
    if "://" not in src:
        shutil.copyfile(src, dst)
        return
    with tempfile.NamedTemporaryFile(delete=False) as f:
        for chunk in storage.iter_bytes(src):
            f.write(chunk)
    try:
        storage.upload_file(f.name, dst)
    finally:
        if os.path.exists(f.name):
            os.unlink(f.name)
