"""`step.json` (what ran: identity inputs, resolved config, provenance) and the run's provenance facts."""

from __future__ import annotations

import functools
import getpass
import importlib.metadata
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from marin.definition.identity import to_jsonable
from marin.definition.source import fn_source_hash
from marin.definition.step import Step, fn_import_path
from marin.status.lock import (
    GIT_DIFF,
    GIT_UNTRACKED,
    MAX_UNTRACKED,
    UnreadableDiff,
    environment_lock,
    patch_record,
    untracked_diff,
)

GIT_STATUS = ("status", "--porcelain=v2", "--branch", "--untracked-files=no")


def _start_git(cwd: str, *args: str) -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(["git", "-C", cwd, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True, errors="surrogateescape")
    except OSError:  # no git here
        return None


def _finish_git(proc: subprocess.Popen[str] | None, strip: bool = True) -> str | None:
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    if proc.returncode != 0:
        return None
    return out.strip() if strip else out


def _git_state(status: str | None) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) from `git status --porcelain=v2 --branch` (one
    subprocess, ~3 ms); (None, None) outside a git checkout, without git, or before the first commit."""
    if status is None:
        return None, None
    commit: str | None = None
    dirty = False
    for line in status.splitlines():
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
    return provenance_started(script)()


def _source_diff(commit: str | None, dirty: bool | None, diff: str | None, root: str | None,
                 untracked: list[str]) -> str | None:
    """What the checkout holds beyond its commit (tracked changes and untracked files) as one patch; None
    for a clean checkout (or none)."""
    if not commit or root is None or (not dirty and not untracked):
        return None
    extra = untracked_diff(root, untracked) if untracked else ""
    if extra is None or (dirty and diff is None):  # recorded as left out, never silently partial
        raise UnreadableDiff(f"more than {MAX_UNTRACKED} untracked files, or git diff failed")
    return (diff or "") + extra


class _Provenance:
    """The run's provenance, with `git status` running as a subprocess until it is asked for (see
    `provenance_started`). If it never is (the run stopped before), the subprocess is reaped when this
    goes."""

    def __init__(self, script: str | None) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._value: dict[str, Any] | None = None
        self.patch: str | None = None  # the dirty tree's diff to write as source.patch (marin/status/lock.py)
        self._script = os.path.abspath(script) if script and os.path.exists(script) else None
        where = os.path.dirname(self._script) if self._script else os.getcwd()
        self._proc = _start_git(where, *GIT_STATUS)
        self._diff = _start_git(where, *GIT_DIFF)  # only read when the tree is dirty
        self._root = _start_git(where, "rev-parse", "--show-toplevel")
        self._untracked = _start_git(where, *GIT_UNTRACKED)

    def __call__(self) -> dict[str, Any]:
        if self._value is None:
            commit, dirty = _git_state(_finish_git(self._proc))
            diff, root = _finish_git(self._diff, strip=False), _finish_git(self._root)
            untracked = (_finish_git(self._untracked) or "").splitlines()
            self._proc = self._diff = self._root = self._untracked = None
            packages = {d: v for d in ("marin-openlab", "ray", "fsspec", "jax") if (v := _version(d))}
            try:
                patch, self.patch = patch_record(_source_diff(commit, dirty, diff, root, untracked))
            except UnreadableDiff as e:
                patch, self.patch = {"omitted": f"the checkout's diff could not be recorded ({e})"}, None
            script = os.path.relpath(self._script, root) if self._script and root and commit else None
            self._value = {"git_commit": commit, "git_dirty": bool(dirty) if commit else None,
                           "git_patch": patch, "script_path": script,
                           "packages": packages, "environment": environment_lock(),
                           "host": socket.gethostname(), "user": user_name()}
        return self._value

    def __del__(self) -> None:
        for proc in (self._proc, getattr(self, "_diff", None), getattr(self, "_root", None),
                     getattr(self, "_untracked", None)):
            if proc is not None:
                _finish_git(proc)


def provenance_started(script: str | None = None) -> Callable[[], dict[str, Any]]:
    """Start reading the run's provenance; calling the result finishes and returns it. git runs as a
    subprocess meanwhile, so the caller can plan the DAG instead of waiting for it (not on a thread: a thread
    would wait for the interpreter lock while the caller hashes)."""
    return _Provenance(script)


class StepNode(Protocol):
    """What step.json needs of a node of the DAG (`marin.graph.dag.Node` is one; status does not import graph,
    which reads status)."""

    @property
    def step(self) -> Step: ...
    @property
    def name(self) -> str: ...
    @property
    def hash(self) -> str: ...
    @property
    def identity(self) -> dict[str, Any]: ...
    @property
    def deps(self) -> Sequence[Any]: ...  # nodes of the same kind: each is given to `dep_path`


def step_info(node: StepNode, output_path: str, config: Any, dep_path: Callable[[Any], str],
              ctx: Any) -> dict[str, Any]:
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
        **({"raw_inputs": inputs.record()}
           if (inputs := getattr(node, "inputs", None)) and inputs.fingerprints else {}),
        **ctx.provenance,
        "created": time.time(),
    }
