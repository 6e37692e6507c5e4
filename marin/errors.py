"""The engine's error taxonomy: definition errors (raised before anything runs), step failures (user code,
wrapped with the step's name, hash, output path and log path), storage errors, and internal errors (a broken
invariant of the engine itself: a bug).

Every message names what was wrong, where (step, field path, storage path) and how to fix it.
"""

from __future__ import annotations


class MarinError(Exception):
    """Base class of every error the engine raises on purpose."""


class StepDefinitionError(MarinError, ValueError):
    """A step, its config or the DAG is malformed; raised while building or checking, before anything runs."""


class CorruptFileError(MarinError, ValueError):
    """A status, manifest or record file exists but is not the JSON its format (docs/formats.md) describes."""


class StorageError(MarinError):
    """Storage refused an operation the engine needs (a lease, a status write, a listing)."""


class InfeasibleResourcesError(MarinError):
    """A step asks for resources that no node of the cluster can ever provide."""


class NoExperimentsError(MarinError, ValueError):
    """A read command (status, catalogue, verdict, issue, predictions, compare) was pointed at a prefix that
    holds no experiment manifest: almost always a wrong or missing ``--prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        super().__init__(
            f"no experiments under {prefix} (there is no {prefix.rstrip('/')}/experiments/*.json). Fix: pass "
            "--prefix with the prefix your runs wrote to (every run prints it: 'experiment ... under "
            "PREFIX'), or set MARIN_PREFIX; the default is ./marin-out"
        )


class InternalError(MarinError, RuntimeError):
    """An invariant of the engine itself failed (a bug to report, never a mistake in the experiment)."""


class StepFailedError(MarinError):
    """A step's function raised (or its worker died). Chained (``raise ... from``) to the original error."""

    def __init__(self, name: str, hash: str, output_path: str, log_path: str | None, summary: str) -> None:
        self.name = name
        self.hash = hash
        self.output_path = output_path
        self.log_path = log_path
        self.summary = summary
        super().__init__(
            f"step {name} ({hash[:8]}) failed: {summary}\n  output path: {output_path}\n  log: {log_path}"
        )


class ExperimentFailedError(MarinError):
    """At least one step failed (or could not run); the message lists each one with its log file."""

    def __init__(self, message: str, failures: list[StepFailedError]) -> None:
        self.failures = failures
        super().__init__(message)
