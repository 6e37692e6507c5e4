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
import sys
import textwrap
from collections.abc import Sequence

import draccus
import draccus.utils

from marin.definition.step import RAW_INPUT_POLICIES

BACKENDS = ("ray", "local")
FORMATS = ("table", "json")


LOCAL_MAX_CONCURRENCY = 32  # the local default's most steps at once, for steps of a fraction of a CPU

@dataclasses.dataclass(frozen=True)
class ExecutorMainConfig:
    """Flags of `marin run|plan|status SCRIPT` and of `python SCRIPT`."""

    prefix: str | None = None
    """Where outputs and status live (local path, gs://, s3://)."""
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
    """Where steps run: 'ray' (embedded Ray, or the cluster at --ray-address) or 'local'."""
    ray_address: str | None = None
    """Address of a Ray cluster to submit to."""
    max_concurrent: int | None = None
    """Most steps running at once."""
    lease_timeout_s: float = 60.0
    """A lease whose heartbeat is older than this is stale and may be taken over by another executor."""
    format: str = "table"
    """Plan/status output: 'table' or 'json'."""
    issue: str | None = None
    """The experiment's issue, owner/repo#N."""
    raw_inputs: str = "rerun"
    """What a changed raw input does to steps without their own Step(raw_inputs=...): 'rerun' (its
    fingerprint is part of the identity) or 'warn' (the plan warns, the result is reused)."""
    quiet: bool = False
    """For run: print only the end (the summary line, each step's headline numbers, the verdict) and
    warnings; no plan table, start banner or live progress. plan and status print what they show either
    way."""
    publish: bool = False
    """After the run, re-publish the static site of the prefix incrementally (`marin publish`, only the
    pages that changed) under the visibility policy --publish-policy into --publish-out; a failed publish
    is reported in the summary, never fails the run (docs/publish.md)."""
    publish_out: str | None = None
    """Where --publish writes the site: a directory or a bucket path (gs://bucket/site)."""
    publish_policy: str = "publish.toml"
    """The visibility policy --publish applies, checked before the run starts."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} is not one of {BACKENDS}")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r} is not one of {FORMATS}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")
        if self.raw_inputs not in RAW_INPUT_POLICIES:
            raise ValueError(f"--raw-inputs {self.raw_inputs!r} is not one of {RAW_INPUT_POLICIES}")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"--lease-timeout-s must be > 0, got {self.lease_timeout_s}")

    def resolved_prefix(self) -> str:
        """--prefix, else $MARIN_PREFIX, else ./marin-out (the one place this default is written)."""
        return self.prefix or os.environ.get("MARIN_PREFIX") or "./marin-out"

    def concurrency_limit(self, cpu_requests: Sequence[float] = ()) -> int:
        """--max-concurrent, else (in effect) unbounded for 'ray' and, for 'local', the number of CPUs, or
        more when the steps to run ask for a fraction of a CPU (`cpu_requests`): as many of the smallest as
        the CPUs hold (1/16 CPU: 16 a CPU), at most LOCAL_MAX_CONCURRENCY. The backend then packs steps by
        what they ask, as Ray does; steps of the default 1 CPU keep the number of CPUs."""
        if self.max_concurrent:
            return self.max_concurrent
        if self.backend != "local":
            return 100_000
        cpus = os.cpu_count() or 1
        smallest = min(cpu_requests, default=1.0)
        fit = LOCAL_MAX_CONCURRENCY if smallest <= 0 else int(cpus / smallest)
        return max(cpus, min(fit, LOCAL_MAX_CONCURRENCY))


# What a field left at None means, for the help (the dataclass default alone would print "None").
HELP_DEFAULTS = {
    "prefix": "$MARIN_PREFIX, else ./marin-out",
    "run_only": "every step",
    "ray_address": "$RAY_ADDRESS, else an embedded Ray",
    "max_concurrent": "the number of CPUs for local (more for steps of a fraction of a CPU, up to 32); "
                      "unbounded for ray",
    "issue": "from a script named exp<N>_<slug>.py and $MARIN_ISSUE_REPO",
    "force_run": "none",
    "publish_out": "PREFIX/site (the site folder under the prefix)",
}
SHORT_FLAGS = {"-q": "--quiet"}
METAVARS = {"prefix": "PATH", "run_only": "REGEX...", "backend": "ray|local", "ray_address": "ADDRESS",
            "max_concurrent": "N", "lease_timeout_s": "SECONDS", "format": "table|json",
            "issue": "OWNER/REPO#N", "raw_inputs": "rerun|warn",
            "force_run": "STEP...", "publish_out": "PATH", "publish_policy": "FILE"}


def _flag_default(f: dataclasses.Field[object]) -> str:
    if f.name in HELP_DEFAULTS:
        return HELP_DEFAULTS[f.name]
    value = f.default
    return str(value).lower() if isinstance(value, bool) else str(value)


def flags_help() -> str:
    """The flags of `marin run|plan|status` as people type them (dashes), with their real defaults."""
    from draccus.wrappers.docstring import get_attribute_docstring

    lines = []
    for f in dataclasses.fields(ExecutorMainConfig):
        doc = get_attribute_docstring(ExecutorMainConfig, f.name)
        text = " ".join((doc.docstring_below or doc.comment_inline or doc.comment_above).split())
        flag = "--" + f.name.replace("_", "-")
        meta = "" if f.name in _BOOL else f" {METAVARS.get(f.name, f.name.upper())}"
        short = "-q, " if f.name == "quiet" else ""
        lines.append(f"  {short}{flag}{meta}")
        lines += textwrap.wrap(f"{text} (default: {_flag_default(f)})", width=104, initial_indent=" " * 6,
                               subsequent_indent=" " * 6, break_on_hyphens=False)
    return "\n".join(lines)


_BOOL = {f.name for f in dataclasses.fields(ExecutorMainConfig) if f.type in ("bool", bool)}
_LIST = {"run_only", "force_run"}
_TEXT = {f.name for f in dataclasses.fields(ExecutorMainConfig) if f.type in ("str", "str | None", str)}
"""Flags whose value is taken literally. draccus reads every value as YAML, which would cut a prefix at ` #`
(a comment), strip its trailing spaces, make `a: b` a mapping and refuse a value starting with `-`; such a
value is handed to it as a JSON string, which YAML reads back exactly."""


def normalize_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    argv = [SHORT_FLAGS.get(a, a) for a in argv]
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


def _literal_text(args: list[str]) -> list[str]:
    """Normalized flags with the one value of each text flag (`_TEXT`) written as a JSON string."""
    out = list(args)
    for i, arg in enumerate(args[:-1]):
        single = i + 2 >= len(args) or args[i + 2].startswith("--")
        if arg.startswith("--") and arg[2:] in _TEXT and not args[i + 1].startswith("--") and single:
            out[i + 1] = json.dumps(args[i + 1], ensure_ascii=False)
    return out


def parse_flags(argv: list[str]) -> ExecutorMainConfig:
    """Parse flags; an invalid value raises ValueError naming the flag and the valid choices, an unknown flag
    exits with status 2 after naming the closest valid one."""
    unknown = _did_you_mean(argv)
    if unknown:  # as argparse does for an unknown flag: the message on stderr and exit status 2
        print(f"error: unknown flag in {' '.join(argv)}{unknown}", file=sys.stderr)
        raise SystemExit(2)
    try:
        return draccus.parse(ExecutorMainConfig, args=_literal_text(normalize_argv(argv)))
    except draccus.utils.ParsingError as e:
        cause = e.__cause__
        if isinstance(cause, ValueError):
            raise ValueError(str(cause)) from e
        raise ValueError(f"invalid flags {argv}: {e}") from e


def _did_you_mean(argv: list[str]) -> str:
    """`; did you mean --dry-run?` for the first flag that is not one of ExecutorMainConfig's fields."""
    import difflib

    known = [f.name for f in dataclasses.fields(ExecutorMainConfig)]
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0].replace("-", "_")
        if name not in known and name not in ("help", "config_path"):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            valid = ", ".join("--" + k.replace("_", "-") for k in known)
            hint = f"did you mean --{close[0].replace('_', '-')}? " if close else ""
            return f". Fix: --{name.replace('_', '-')} is not a flag; {hint}(valid flags: {valid})"
    return ""
