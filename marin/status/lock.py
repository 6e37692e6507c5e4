"""What a run needs to be rebuilt from its record: the diff of a dirty checkout and the environment lock.

- `environment_lock()`: the Python version and every installed distribution with its version (what
  `importlib.metadata` sees in this interpreter), recorded in step.json's `environment`.
- The dirty tree's diff: `git diff HEAD --binary` of the script's checkout (tracked files, staged or not),
  plus every untracked file that is not ignored, as a new file (`git diff --no-index`; at most
  `MAX_UNTRACKED` of them: a new module an experiment imports is part of what ran), written next to
  step.json as `.marin/source.patch` when it is at most `PATCH_CAP_BYTES`; step.json's `git_patch` records
  its size and sha256 either way, and says when it was left out (such a run cannot be reproduced).
`marin reproduce` (marin/execution/reproduce.py) reads both back.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import subprocess
import sys
from typing import Any

PATCH_CAP_BYTES = 4 << 20  # a dirty tree's diff up to 4 MiB is kept next to step.json
PATCH_FILE = "source.patch"  # under the step's .marin/
GIT_DIFF = ("diff", "HEAD", "--binary", "--no-color", "--no-ext-diff")
GIT_UNTRACKED = ("ls-files", "--others", "--exclude-standard", "--full-name", "--", ":/")
MAX_UNTRACKED = 200


class UnreadableDiff(Exception):
    """The checkout's diff could not be read whole (git failed, too many untracked files)."""


def untracked_diff(root: str, names: list[str]) -> str | None:
    """The untracked files `names` (relative to the checkout's `root`) as one patch adding them; None when
    there are more than MAX_UNTRACKED (the record then says the diff was left out)."""
    if len(names) > MAX_UNTRACKED:
        return None
    parts = []
    for name in names:
        done = subprocess.run(["git", "-C", root, "diff", "--no-index", "--binary", "--no-color", "--",
                               "/dev/null", name], capture_output=True, text=True, errors="surrogateescape",
                              check=False)
        if done.returncode not in (0, 1):  # 1: "they differ", which a new file always does
            return None
        parts.append(done.stdout)
    return "".join(parts)


@functools.cache  # the interpreter's installed distributions do not change while a run plans and submits
def environment_lock() -> dict[str, Any]:
    """{"python": "3.11.7", "implementation": "CPython", "distributions": {name: version}} (names as the
    distributions spell them, sorted case-insensitively; the first of duplicates on sys.path wins)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name and name not in found:
            found[name] = dist.version
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": sys.platform,
            "distributions": dict(sorted(found.items(), key=lambda kv: kv[0].lower()))}


def patch_record(patch: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(step.json's `git_patch`, the text to write as source.patch or None) for a dirty tree's diff."""
    if patch is None:
        return None, None
    data = patch.encode("utf-8", "surrogateescape")
    record: dict[str, Any] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                              "cap_bytes": PATCH_CAP_BYTES}
    try:
        patch.encode("utf-8")
    except UnicodeEncodeError:  # read with surrogateescape: bytes that are not UTF-8
        record["omitted"] = "the diff is not UTF-8 text (a file in another encoding): commit the work"
        return record, None
    if len(data) > PATCH_CAP_BYTES:
        record["omitted"] = (f"the diff is larger than the {PATCH_CAP_BYTES >> 20} MiB cap: commit the work "
                             "to make the run reproducible")
        return record, None
    record["file"] = PATCH_FILE
    return record, patch


def differences(lock: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a recorded environment lock and another (the current one), in words."""
    out = [f"python {lock.get('python')} -> {current.get('python')}"] \
        if lock.get("python") != current.get("python") else []
    old, new = lock.get("distributions") or {}, current.get("distributions") or {}
    for name in sorted(set(old) | set(new), key=str.lower):
        if old.get(name) != new.get(name):
            out.append(f"{name} {old.get(name, '(absent)')} -> {new.get(name, '(absent)')}")
    return out
