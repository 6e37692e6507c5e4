"""`step.json` (what ran: identity inputs, resolved config, provenance) and the run's provenance facts."""

from __future__ import annotations

import functools
import getpass
import importlib.metadata
import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

from marin.definition.identity import to_jsonable
from marin.definition.step import fn_import_path
from marin.graph.dag import Node
from marin.graph.plan import fn_source_hash


def _git(cwd: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _git_state(cwd: str) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) with one `git status` (a subprocess is ~3 ms);
    (None, None) outside a git checkout, without git, or before the first commit."""
    out = _git(cwd, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if out is None:
        return None, None
    commit: str | None = None
    dirty = False
    for line in out.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.split(" ", 2)[2]
            commit = oid if oid != "(initial)" else None
        elif not line.startswith("#"):
            dirty = True
    return (commit, dirty) if commit else (None, None)


@functools.cache  # what this process imported does not change while it runs
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def provenance(script: str | None = None) -> dict[str, Any]:
    """Facts recorded once per run: git commit and dirtiness (of the script's checkout), package versions,
    host and user."""
    where = os.path.dirname(os.path.abspath(script)) if script and os.path.exists(script) else os.getcwd()
    commit, dirty = _git_state(where)
    packages = {d: v for d in ("marin-openlab", "ray", "fsspec", "jax") if (v := _version(d))}
    return {"git_commit": commit, "git_dirty": bool(dirty) if commit else None, "packages": packages,
            "host": socket.gethostname(), "user": user_name()}


def step_info(node: Node, output_path: str, config: Any, dep_path: Callable[[Node], str], ctx: Any) -> dict[str, Any]:
    """The step.json record of `node` about to run at `output_path` with its resolved `config`."""
    step = node.step
    return {
        "name": step.name,
        "hash": node.hash,
        "output_path": output_path,
        "fn": step.fn_path,
        "fn_source_hash": fn_source_hash(step.fn),
        "version": step.version,
        "description": step.description,
        "config": to_jsonable(config),
        "identity": node.identity,
        "config_class": fn_import_path(type(step.config)),
        "dependencies": [{"name": d.name, "hash": d.hash, "output_path": dep_path(d)} for d in node.deps],
        "resources": step.resources.to_json(),  # type: ignore[union-attr]
        "issue": ctx.issue,
        "experiment": ctx.experiment_id,
        **ctx.provenance,
        "created": time.time(),
    }
