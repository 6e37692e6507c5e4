"""`marin verify [SCRIPT|PREFIX] [--prefix P] [--format table|json]`: re-read every output byte and check it.

The steps checked are those of the experiment manifests under the prefix (`experiments/*.json`): all of them
for a prefix, or those of a script's experiments (`{script stem}-*.json`) for a script. For every step that
succeeded, its output manifest (marin/storage/outputs.py) is compared with a fresh listing, and every file
whose checksum is a content digest is read again and its digest recomputed (sha256 on local disk, MD5 for a
single-part S3 ETag or a GCS md5Hash; a multipart ETag or a CRC32C is checked by size and the store's own
checksum). Steps recorded before output manifests are listed as unchecked. Exit status: 1 when any step's
outputs differ from its manifest, else 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from marin.status.files import SUCCESS, read_status
from marin.status.manifest import list_manifests
from marin.storage.base import Storage
from marin.storage.fs import normalize_prefix, storage_for
from marin.storage.outputs import compare, read_manifest, scan_outputs

OK, DIFFERS, UNCHECKED, NOT_SUCCEEDED = "ok", "differs", "unchecked", "not succeeded"


@dataclasses.dataclass(frozen=True)
class StepVerdict:
    name: str
    output_path: str
    result: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def verify_step(storage: Storage, name: str, output_path: str) -> StepVerdict:
    """Deep check of one step's outputs against its manifest."""
    status = read_status(storage, output_path) or {}
    if status.get("status") != SUCCESS:
        return StepVerdict(name, output_path, NOT_SUCCEEDED, f"status {status.get('status')}")
    recorded = read_manifest(storage, output_path, status.get("outputs"))
    if recorded is None:
        if isinstance(status.get("outputs"), dict):
            return StepVerdict(name, output_path, DIFFERS,
                               "its output manifest (.marin/outputs.json) is gone")
        return StepVerdict(name, output_path, UNCHECKED, "recorded before output manifests: nothing to check")
    check = compare(storage, output_path, recorded, scan_outputs(storage, output_path) or {}, deep=True)
    n = len(recorded["entries"])
    if not check.ok:
        return StepVerdict(name, output_path, DIFFERS, check.describe())
    extra = f"; {len(check.added)} file(s) added since" if check.added else ""
    return StepVerdict(name, output_path, OK, f"{n} file(s) re-read, digests match{extra}")


def steps_of(storage: Storage, prefix: str, script: str | None) -> list[tuple[str, str]]:
    """(name, output path) of every step of the experiments under `prefix` (of `script`'s only, if given)."""
    stem = os.path.splitext(os.path.basename(script))[0] if script else None
    seen: dict[str, str] = {}
    for m in list_manifests(storage, prefix):
        if stem is not None and not str(m.get("id", "")).startswith(f"{stem}-"):
            continue
        for s in m.get("steps") or []:
            seen.setdefault(str(s.get("output_path")), str(s.get("name")))
    return [(name, path) for path, name in seen.items()]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="marin verify", description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?", help="an experiment script, or a prefix (default: --prefix)")
    parser.add_argument("--prefix", default=None, help="the prefix (default: $MARIN_PREFIX, ./marin-out)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(list(argv))
    script = args.target if args.target and args.target.endswith(".py") else None
    raw = args.prefix or (args.target if args.target and script is None else None)
    prefix = normalize_prefix(raw or os.environ.get("MARIN_PREFIX") or "./marin-out")
    storage = storage_for(prefix)
    steps = steps_of(storage, prefix, script)
    if not steps:
        print(f"marin verify: no experiment{' of ' + script if script else ''} under {prefix} "
              "(experiments/*.json); check --prefix")
        return 2
    verdicts = [verify_step(storage, name, path) for name, path in steps]
    if args.format == "json":
        print(json.dumps({"prefix": prefix, "steps": [v.to_json() for v in verdicts]}, indent=1))
    else:
        print(f"verify under {prefix}:")
        width = max(len(v.name) for v in verdicts)
        for v in verdicts:
            print(f"  {v.result:<13} {v.name:<{width}}  {v.detail}")
        counts = {r: sum(v.result == r for v in verdicts) for r in (OK, DIFFERS, UNCHECKED, NOT_SUCCEEDED)}
        print("  " + ", ".join(f"{k}: {c}" for k, c in counts.items() if c))
    return 1 if any(v.result == DIFFERS for v in verdicts) else 0
