"""Output manifests: what a step wrote, recorded at its SUCCESS and checked before its result is reused.

At success the worker lists the step's output path once (everything except `.marin/`) and computes a content
digest where the store keeps none (local files: sha256). The SUCCESS status carries a summary: `{"files",
"bytes", "listing"}`. `listing` is sha256 over the listing as the store returns it (name, size, and the
store's checksum, or the local mtime), so a plan compares one fresh listing with the status it already read,
and reads the manifest only when they differ, to say what changed. The manifest itself (every file's size,
checksum and version) is:
- for a step with at most `INLINE_ENTRIES` files, inside that summary (`entries`, and `nondeterministic`
  when declared): written in the same single-object write as SUCCESS, so status and manifest cannot part,
  and one object and one round trip fewer per step;
- otherwise (or when an earlier success of the step left one) `.marin/outputs.json`, written *before* the
  SUCCESS status (a SUCCESS always has its manifest).
`read_manifest` reads either. Steps recorded with `outputs.json` before inline manifests read as before.

A missing or changed file (size, the store's checksum, or on local disk a changed mtime whose re-read content
digest differs) means the outputs are not the ones that succeeded: the plan re-runs the step and says why
(`outputs changed since success: 2 files missing (a.txt, b.txt)`). A file added since is reported, never a
reason to re-run. On local disk a symbolic link that leads out of the output path is recorded by its target's
name (`link:<target>`), not by the bytes it points at, which are not the step's to keep.
`marin verify` (`verify.py`) re-reads every byte and recomputes the digests.
The step's `nondeterministic` declarations are recorded here for `marin reproduce` (execution/reproduce.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import time
from typing import Any

from marin import jsonio
from marin.errors import CorruptFileError
from marin.storage.base import Storage
from marin.storage.listing import FileInfo, digest_chunks, recomputable

SCHEMA = "marin-outputs/v1"
INLINE_ENTRIES = 8
"""A manifest of at most this many files is carried in the SUCCESS status (`outputs.entries`) instead of a
file of its own; about 150 bytes of status.json a file (docs/formats.md)."""
META = ".marin"
STEP_JSON = ".marin/step.json"  # relative to the output path (marin/status/files.py names it too)
MANIFEST = ".marin/outputs.json"


def join(base: str, name: str) -> str:
    return posixpath.join(base.rstrip("/"), name)


def manifest_path(output_path: str) -> str:
    return join(output_path, MANIFEST)


def scan_outputs(storage: Storage, output_path: str) -> dict[str, FileInfo] | None:
    """The step's files (one listing), `.marin/` left out; None when the output path does not exist."""
    return step_files(storage.list_files(output_path), storage, output_path)


def step_files(listing: dict[str, FileInfo] | None, storage: Storage | None = None,
               output_path: str = "") -> dict[str, FileInfo] | None:
    """A listing of an output path without the engine's own records (`.marin/`); on local disk (`storage`
    given) a symbolic link that leads out of the output path is taken as the link, not what it points at."""
    if listing is None:
        return None
    files = {k: v for k, v in listing.items() if k != META and not k.startswith(META + "/")}
    return _links_as_links(output_path, files) if storage is not None and storage.is_local else files


def _links_as_links(output_path: str, files: dict[str, FileInfo]) -> dict[str, FileInfo]:
    """A link out of the output path is not the step's output: what it points at belongs to someone else and
    may change after success (W&B links `logs/debug-core.log` to a log in ~/.cache that its service keeps
    writing). Such a link is recorded and checked by its target's name (`link:` checksum), never its bytes."""
    root = os.path.realpath(output_path)
    out = dict(files)
    for name in files:
        path = os.path.join(output_path, name)
        if not os.path.islink(path):
            continue
        target = os.path.realpath(path)
        if target != root and not target.startswith(root + os.sep):
            link = os.readlink(path)
            out[name] = FileInfo(len(link.encode()), "link:" + link)
    return out


def listing_digest(files: dict[str, FileInfo]) -> str:
    """sha256 over (name, size, the store's checksum or else the version) of a listing, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        info = files[name]
        h.update(f"{name}\0{info.size}\0{info.checksum or info.version}\n".encode())
    return h.hexdigest()


def _with_digest(storage: Storage, path: str, info: FileInfo) -> FileInfo:
    """`info` with a content checksum: the store's, or sha256 of the bytes where the store keeps none."""
    if info.checksum is not None:
        return info
    return dataclasses.replace(info, checksum=digest_chunks("sha256", storage.iter_bytes(path)))


def record_outputs(storage: Storage, output_path: str, nondeterministic: tuple[str, ...] = ()) -> dict[str,
                                                                                                     Any]:
    """Write the output manifest of a step that just succeeded; returns the summary for its status.json.
    Where the store lists a checksum for `.marin/step.json`, the summary carries it (`step_json`): a later
    plan whose listing shows the same checksum knows step.json unchanged without reading it (plan.py)."""
    return record_listed_outputs(storage, output_path, storage.list_files(output_path), nondeterministic)


def record_listed_outputs(storage: Storage, output_path: str, listing: dict[str, FileInfo] | None,
                          nondeterministic: tuple[str, ...] = ()) -> dict[str, Any]:
    """`record_outputs` with the output path's listing already made (by the worker, at the same time as its
    lease check)."""
    files = step_files(listing, storage, output_path) or {}
    summary: dict[str, Any] = {"files": len(files), "bytes": sum(f.size for f in files.values()),
                               "listing": listing_digest(files)}
    step_json = (listing or {}).get(STEP_JSON)
    if step_json is not None and step_json.checksum is not None:
        summary["step_json"] = step_json.checksum
    entries = {name: _with_digest(storage, join(output_path, name), info).to_json()
               for name, info in sorted(files.items())}
    # written with SUCCESS, in the same object (see the module docstring); a step whose earlier success left
    # an outputs.json keeps its manifest there (rewritten now), so no stale manifest stays beside the status
    if len(entries) <= INLINE_ENTRIES and MANIFEST not in (listing or {}):
        summary["entries"] = entries
        if nondeterministic:
            summary["nondeterministic"] = list(nondeterministic)
        return summary
    jsonio.write_json(storage, manifest_path(output_path), {
        "schema": SCHEMA, "output_path": output_path, "created": time.time(),
        **{k: v for k, v in summary.items() if k != "step_json"},
        "nondeterministic": list(nondeterministic), "entries": entries})
    return summary


def inline_manifest(summary: Any) -> dict[str, Any] | None:
    """The manifest a SUCCESS status's `outputs` summary carries itself (a step of few files), else None."""
    if not isinstance(summary, dict) or not isinstance(summary.get("entries"), dict):
        return None
    return {"schema": SCHEMA, **{k: v for k, v in summary.items() if k != "step_json"},
            "nondeterministic": list(summary.get("nondeterministic") or ())}


_UNGIVEN: Any = object()


def read_manifest(storage: Storage, output_path: str, summary: Any = _UNGIVEN) -> dict[str, Any] | None:
    """The step's output manifest: the one its status's `outputs` summary carries (`summary`, read from the
    step's status.json when not given; None: the status has none), else `.marin/outputs.json`; None when
    neither is there (or a file cannot be read)."""
    if summary is _UNGIVEN:
        try:
            status = jsonio.read_json(storage, join(output_path, ".marin/status.json"))
        except CorruptFileError:
            status = None
        summary = status.get("outputs") if isinstance(status, dict) else None
    inline = inline_manifest(summary)
    if inline is not None:
        return inline
    try:
        data = jsonio.read_json(storage, manifest_path(output_path))
    except CorruptFileError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else None


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """How a step's outputs compare with its manifest (names relative to the output path)."""

    missing: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    no_manifest: bool = False

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed or self.no_manifest)

    def describe(self) -> str:
        if self.no_manifest:
            return ("outputs cannot be checked since success: its output manifest (.marin/outputs.json) is "
                    "gone")
        parts = [f"{len(names)} file{'s' if len(names) != 1 else ''} {what} ({_names(names)})"
                 for what, names in (("missing", self.missing), ("changed", self.changed),
                                     ("added", self.added)) if names]
        return "outputs changed since success: " + ", ".join(parts) if parts else "outputs as at success"


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names[:3]) + (f", ... ({len(names) - 3} more)" if len(names) > 3 else "")


def compare(storage: Storage, output_path: str, recorded: dict[str, Any], files: dict[str, FileInfo],
            deep: bool = False) -> OutputCheck:
    """Compare a listing with a manifest. A local file whose mtime moved is re-read (its digest decides);
    `deep` re-reads every file whose checksum can be recomputed."""
    entries = {k: FileInfo.from_json(v) for k, v in recorded["entries"].items()}
    missing = tuple(n for n in entries if n not in files)
    changed = tuple(n for n, want in entries.items() if n in files
                    and _differs(storage, join(output_path, n), want, files[n], deep))
    added = tuple(n for n in files if n not in entries)
    return OutputCheck(missing, changed, added)


def _differs(storage: Storage, path: str, want: FileInfo, got: FileInfo, deep: bool) -> bool:
    if got.size != want.size:
        return True
    if got.checksum is not None and want.checksum is not None and got.checksum != want.checksum:
        return True
    reread = deep or (got.checksum is None and got.version != want.version)
    algorithm = recomputable(want.checksum)
    if reread and algorithm is not None:
        return digest_chunks(algorithm, storage.iter_bytes(path)) != want.checksum
    return False


def check_outputs(storage: Storage, output_path: str, summary: dict[str, Any]) -> OutputCheck:
    """One listing against the summary in status.json; the manifest is read only when they differ."""
    return check_listed(storage, output_path, summary, storage.list_files(output_path))


def check_listed(storage: Storage, output_path: str, summary: dict[str, Any],
                 listing: dict[str, FileInfo] | None) -> OutputCheck:
    """`check_outputs` with the output path's listing already made (a batch: `Storage.list_many`)."""
    files = step_files(listing, storage, output_path) or {}
    if listing_digest(files) == summary.get("listing"):
        return OutputCheck()
    recorded = read_manifest(storage, output_path, summary)
    if recorded is None:
        return OutputCheck(no_manifest=True)
    return compare(storage, output_path, recorded, files)


def recorded_step_facts(summary: dict[str, Any],
                        listing: dict[str, FileInfo] | None) -> dict[str, Any] | None:
    """What the SUCCESS status recorded of step.json (`step_json`: its checksum and `fn_source_hash`), when
    the output path's listing shows step.json with that very checksum: the file is unchanged, so a plan need
    not read it. None otherwise (a local listing has no checksum: the plan reads the file)."""
    recorded = summary.get("step_json")
    found = (listing or {}).get(STEP_JSON)
    if not isinstance(recorded, dict) or found is None or found.checksum is None:
        return None
    return recorded if found.checksum == recorded.get("checksum") else None
