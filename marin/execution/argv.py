"""Command-line flags for experiment scripts, parsed by draccus into `ExecutorMainConfig`.

draccus wants `--dry_run true` and `--run_only '["a","b"]'`; people type `--dry-run` and `--run-only a b`.
`normalize_argv` accepts both spellings: dashes become underscores, a bare boolean flag means true, and
several values after a list flag become one JSON list. Unknown flags are errors (draccus lists the valid
ones).
"""

from __future__ import annotations

import dataclasses
import json
import os

import draccus
import draccus.utils

BACKENDS = ("ray", "local")
FORMATS = ("table", "json")


@dataclasses.dataclass(frozen=True)
class ExecutorMainConfig:
    """Flags of `marin run|plan|status SCRIPT` and of `python SCRIPT`."""

    prefix: str | None = None
    """Where outputs and status live (local path, gs://, s3://). Default: $MARIN_PREFIX, else ./marin-out."""
    dry_run: bool = False
    """Print the plan and write nothing."""
    run_only: list[str] | None = None
    """Regexes (re.search on step names): run only the matching steps and their dependencies."""
    force_run_failed: bool = False
    """Re-run steps that failed in an earlier run (otherwise they stay failed and block their dependents)."""
    force_run: list[str] | None = None
    """Step names (exact) to re-run although they succeeded (an output damaged since, e.g. a checkpoint an
    evaluation cannot read), with every step that depends on them; new attempts, earlier logs kept."""
    backend: str = "ray"
    """Where steps run: 'ray' (embedded Ray, or the cluster at --ray_address / $RAY_ADDRESS) or 'local'."""
    ray_address: str | None = None
    """Address of a Ray cluster to submit to; default $RAY_ADDRESS, else an embedded Ray."""
    max_concurrent: int | None = None
    """Most steps running at once (default: the number of CPUs for 'local', unbounded for 'ray')."""
    lease_timeout_s: float = 60.0
    """A lease whose heartbeat is older than this is stale and may be taken over by another executor."""
    format: str = "table"
    """Plan/status output: 'table' or 'json'."""
    issue: str | None = None
    """The experiment's issue, owner/repo#N (default: from a script named exp<N>_<slug>.py and
    $MARIN_ISSUE_REPO)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} is not one of {BACKENDS}")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r} is not one of {FORMATS}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"--lease-timeout-s must be > 0, got {self.lease_timeout_s}")

    def resolved_prefix(self) -> str:
        """--prefix, else $MARIN_PREFIX, else ./marin-out (the one place this default is written)."""
        return self.prefix or os.environ.get("MARIN_PREFIX") or "./marin-out"

    def concurrency_limit(self) -> int:
        """--max-concurrent, else the number of CPUs for 'local' and (in effect) unbounded for 'ray'."""
        return self.max_concurrent or ((os.cpu_count() or 1) if self.backend == "local" else 100_000)


_BOOL = {f.name for f in dataclasses.fields(ExecutorMainConfig) if f.type in ("bool", bool)}
_LIST = {"run_only", "force_run"}


def normalize_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            out.append(arg)
            i += 1
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if eq:
            if name in _LIST and not value.startswith("["):
                value = json.dumps([value])
            out += [f"--{name}", value]
            i += 1
            continue
        values = []
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            values.append(argv[j])
            j += 1
        if name in _BOOL and not values:
            values = ["true"]
        if name in _LIST and (len(values) != 1 or not values[0].startswith("[")):
            values = [json.dumps(values)]
        out += [f"--{name}", *values]
        i = j
    return out


def parse_flags(argv: list[str]) -> ExecutorMainConfig:
    """Parse flags; an invalid value raises ValueError naming the flag and the valid choices."""
    try:
        return draccus.parse(ExecutorMainConfig, args=normalize_argv(argv))
    except draccus.utils.ParsingError as e:
        cause = e.__cause__
        if isinstance(cause, ValueError):
            raise ValueError(str(cause)) from e
        raise ValueError(f"invalid flags {argv}: {e}") from e
