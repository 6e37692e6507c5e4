"""A step that cannot read an input another step wrote: the failure names that step and the fix.

Protocol (operators never import marin, so it is an attribute, like the `marin.runtime` field metadata): an
exception raised by a step's function with an `input_path` attribute says "this input I was given cannot be
read" (moe_trainer's `UnreadableCheckpointError`, raised by `load_checkpoint` for a damaged checkpoint).
When that path is, or lies under, the output path of one of the step's dependencies, the executor adds to
the failure's message the dependency that wrote it and the fix: `--force-run` of that dependency, which
re-runs it (a train step resumes and rewrites its checkpoint) and every step that uses it. The producer's
own status stays SUCCESS - its output was damaged afterwards - so without this the failure would point at
the consumer only.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any


def unreadable_input(exc_pickle: bytes | None) -> str | None:
    """The `input_path` of a step's pickled exception, or None (no such attribute, or it does not unpickle
    here)."""
    if not exc_pickle:
        return None
    try:
        exc = pickle.loads(exc_pickle)
    except Exception:  # the exception's class is not importable in the driver: no hint, the error stands
        return None
    path = getattr(exc, "input_path", None)
    return path if isinstance(path, str) and path else None


def producer_of(path: str, dependencies: Sequence[tuple[str, str]]) -> str | None:
    """The name of the dependency (name, output path) whose output path is `path` or holds it."""
    norm = path.rstrip("/")
    for name, output_path in dependencies:
        out = output_path.rstrip("/")
        if norm == out or norm.startswith(out + "/"):
            return name
    return None


def name_producer(error: dict[str, Any], exc_pickle: bytes | None,
                  dependencies: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """`error` (status.json's `error`), its message extended with the producing step and the fix when the
    step failed on an unreadable input another step of the DAG wrote; unchanged otherwise."""
    path = unreadable_input(exc_pickle)
    producer = producer_of(path, dependencies) if path else None
    if producer is None:
        return error
    fix = (f"; it is the output of step {producer}, which succeeded earlier: re-run it with "
           f"`marin run SCRIPT --force-run {producer}` (it and the steps that use it run again)")
    return {**error, "message": f"{error.get('message', '')}{fix}", "producer": producer}
