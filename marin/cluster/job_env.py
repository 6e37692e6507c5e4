"""Credentials for a submitted driver, sealed so that Ray never shows them.

Ray keeps a job's `runtime_env` (its `env_vars` included) and `metadata` in the job's record, which the Jobs
API, `ray job list` and the Ray dashboard show to anyone who can reach the cluster. A secret passed that way
is published. Instead `seal` writes the secrets into a one-off Python package directory (`env.json` inside
`marin_job_env_<random>/`) that the job carries as a `py_modules` entry: Ray stores it content-addressed in
the cluster's internal storage and shows only its `gcs://_ray_pkg_<hash>.zip` URI. Only the package's name
travels in the visible env var `MARIN_JOB_ENV_MODULE`; `apply_job_env` (called by `marin run` at start) reads
the file, sets the variables in the driver's own process environment and registers them for redaction. The
extracted copy stays in Ray's per-node runtime-resources directory while the job's package is referenced (a
replacement driver on the same node reuses it); it is never under the prefix, in a log or in job metadata.

Non-secret settings (`MARIN_ISSUE_REPO`, `WANDB_PROJECT`, `WANDB_MODE`, ...) go as plain `env_vars`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets as _random
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

MODULE_ENV_VAR = "MARIN_JOB_ENV_MODULE"
SECRET_VARS = (
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "MARIN_GITHUB_TOKEN",
    "WANDB_API_KEY",
    "HF_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
"""Passed sealed when set in the submitter's environment (and `--secret-env NAME` adds more)."""
PLAIN_VARS = (
    "MARIN_ISSUE_REPO",
    "MARIN_TRACKER",
    "MARIN_DASHBOARD_URL",
    "MARIN_TRACKER_MIN_INTERVAL",
    "GITHUB_API_URL",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_MODE",
    "WANDB_BASE_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "STORAGE_EMULATOR_HOST",
)
"""Passed as visible `env_vars` when set in the submitter's environment (`--env NAME` adds more)."""


def collect(
    environ: Mapping[str, str], extra_secret: Iterable[str] = (), extra_plain: Iterable[str] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """(secret, plain) variables to pass, taken from `environ`. A name asked for but unset is an error."""
    missing = [n for n in [*extra_secret, *extra_plain] if n not in environ]
    if missing:
        raise ValueError(
            f"--secret-env/--env name variables that are not set here: {', '.join(missing)}; "
            "export them before `marin submit`, or drop the flag"
        )
    secret = {n: environ[n] for n in dict.fromkeys([*SECRET_VARS, *extra_secret]) if n in environ}
    plain = {
        n: environ[n] for n in dict.fromkeys([*PLAIN_VARS, *extra_plain]) if n in environ and n not in secret
    }
    return secret, plain


def seal(secret: Mapping[str, str], parent: Path | None = None) -> Path | None:
    """Write `secret` into a fresh package directory (mode 0700/0600); None when there is nothing to seal."""
    if not secret:
        return None
    parent = parent or Path(tempfile.mkdtemp(prefix="marin-submit-"))
    package = parent / f"marin_job_env_{_random.token_hex(8)}"
    package.mkdir(mode=0o700)
    # The name goes into the content too: Ray addresses a py_module by its files' contents, not its directory
    # name, so two jobs sealed with the same secrets would otherwise share one stored zip, and the second
    # job's driver would find only the first job's package name on its path.
    doc = f'"""Sealed job environment {package.name}, written by `marin submit`."""\n'
    (package / "__init__.py").write_text(doc)
    target = package / "env.json"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(secret), f)
    return package


def apply_job_env() -> list[str]:
    """In a submitted driver: load the sealed variables into os.environ (not overriding any already set).

    Returns the names loaded. A no-op outside a submitted job."""
    name = os.environ.get(MODULE_ENV_VAR)
    if not name:
        return []
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise RuntimeError(
            f"{MODULE_ENV_VAR}={name} but no such package is on this node's path: the job was "
            "submitted without its sealed environment (resubmit with `marin submit`)"
        )
    path = Path(locations[0]) / "env.json"
    values = json.loads(path.read_text())
    from marin.tracking.redact import register_secret

    for key, value in values.items():
        register_secret(value)
        os.environ.setdefault(key, value)
    return sorted(values)
