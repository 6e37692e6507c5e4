"""The experiment's code as Ray will package it: which files, how big, and a refusal before any upload.

Ray zips a job's `working_dir` (respecting `.gitignore` and `.rayignore` at every level, as
`ray._private.runtime_env.packaging` does) and refuses a package of `GCS_STORAGE_MAX_SIZE` bytes or more
(512 MiB: the gRPC message limit, overridable with `RAY_max_grpc_message_size`) only after zipping, with a
message that does not say which files made it big. `inspect_working_dir` walks the tree with Ray's own ignore
rules, so what it counts is what Ray would upload, and `check_working_dir` names the largest files while
nothing has left the machine yet.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from pathlib import Path

ALWAYS_EXCLUDED = (
    ".git",
    ".venv",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
)
"""Never part of an experiment's code, even where no ignore file says so (Ray's own default excludes .git only
when it is told to)."""


class PackageTooLargeError(ValueError):
    """The working directory is larger than Ray's package limit; the message lists the largest files."""


@dataclasses.dataclass(frozen=True)
class PackageInfo:
    root: Path
    files: int
    bytes: int
    largest: tuple[tuple[str, int], ...]
    """The biggest files, (path relative to root, bytes), largest first."""


def repository_root(script: Path) -> Path:
    """The git repository holding `script`, else the script's own directory."""
    here = script.resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return here
    top = out.stdout.strip()
    return Path(top) if out.returncode == 0 and top else here


def package_limit_bytes() -> int:
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    return int(GCS_STORAGE_MAX_SIZE)


def inspect_working_dir(root: Path, top: int = 5) -> PackageInfo:
    """Every file Ray would pack from `root` (its default excludes and ignore files, plus ALWAYS_EXCLUDED,
    which `submit` passes to Ray as the runtime env's `excludes`)."""
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    excludes = [*ray_constants.get_runtime_env_default_excludes(), *ALWAYS_EXCLUDED]
    sizes: list[tuple[str, int]] = []

    def visit(path: Path) -> None:
        if path.is_file():
            sizes.append((str(path.relative_to(root)), path.stat().st_size))

    _dir_travel(
        root,
        [_get_excludes(root, excludes)],
        visit,
        include_gitignore=True,
        logger=logging.getLogger("marin.cluster"),
    )
    sizes.sort(key=lambda item: -item[1])
    return PackageInfo(root, len(sizes), sum(s for _, s in sizes), tuple(sizes[:top]))


def check_working_dir(root: Path, limit: int | None = None) -> PackageInfo:
    """Raise PackageTooLargeError when what Ray would upload from `root` reaches its limit."""
    info = inspect_working_dir(root)
    limit = package_limit_bytes() if limit is None else limit
    if info.bytes >= limit:
        biggest = "\n".join(f"    {size / 2**20:9.1f} MiB  {name}" for name, size in info.largest)
        raise PackageTooLargeError(
            f"the experiment's code at {root} is {info.bytes / 2**20:.1f} MiB in {info.files} files, over "
            f"Ray's package limit of {limit / 2**20:.1f} MiB; nothing was uploaded. The largest files:\n"
            f"{biggest}\n"
            "Fix: add data, checkpoints and outputs to .gitignore or a .rayignore at the repository root "
            "(they "
            "belong under the prefix, not in the code), then submit again."
        )
    return info
