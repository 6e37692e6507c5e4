"""The entrypoint of a submitted driver: `python -m marin.cluster.driver SCRIPT [run flags]`.

It is `marin run SCRIPT [run flags]` with one check after it: that the driver started the plan it was given.
The record of that is the driver's own: when `marin run` starts executing a plan it adds a run to the
experiment's manifest carrying this job's submission id (`runs[].job`, from `MARIN_JOB_SUBMISSION_ID`; see
docs/formats.md). A driver that ends 0 or 1 without such a run in the manifest of the experiment it was
submitted for (`MARIN_SUBMIT_EXPERIMENT`) ran nothing it was asked to - the script exited before its
`executor_main`, or built another DAG on the cluster than the one `marin submit` described - and exits
`jobs.NO_PLAN_EXIT` (4) with a message naming the manifest and the fix, so that neither the supervisor nor
`marin submit` reports it as a success. A dry run (`--dry-run`) is exempt: it writes nothing by design.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from marin.cluster.jobs import NO_PLAN_EXIT

EXPERIMENT_ENV_VAR = "MARIN_SUBMIT_EXPERIMENT"


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def ran_plan(prefix: str, experiment_id: str, job: str) -> bool:
    """Whether the experiment's manifest under `prefix` holds a run started by the driver of `job`."""
    from marin.status.files import read_record
    from marin.status.manifest import manifest_path
    from marin.storage import storage_for

    data = read_record(storage_for(prefix), manifest_path(prefix, experiment_id)) or {}
    return any(run.get("job") == job for run in data.get("runs") or [])


def main(argv: Sequence[str]) -> int:
    from marin import cli
    from marin.execution.argv import parse_flags
    from marin.storage.fs import normalize_prefix

    args = list(argv)
    try:
        code = cli.main(["run", *args])
    except SystemExit as e:  # a script may exit on its own, before or instead of its executor_main
        code = _exit_code(e.code)
    job = os.environ.get("MARIN_JOB_SUBMISSION_ID", "")
    experiment = os.environ.get(EXPERIMENT_ENV_VAR, "")
    if code not in (0, 1) or not job or not experiment or not args:
        return code
    cfg = parse_flags(args[1:])
    if cfg.dry_run:
        return code
    prefix = normalize_prefix(cfg.resolved_prefix())
    if ran_plan(prefix, experiment, job):
        return code
    print(
        f"marin driver: error: job {job} exited {code} without starting the plan of experiment {experiment} "
        f"under {prefix}: its manifest ({prefix.rstrip('/')}/experiments/{experiment}.json) records no run "
        f"of this job. The script {args[0]} exited before its executor_main ran, or built another DAG here "
        "than `marin submit` described. Fix: make the script reach executor_main([...]) unconditionally "
        "under `if __name__ == '__main__':`, with a DAG that does not depend on where it runs, and submit "
        "again.",
        file=sys.stderr,
        flush=True,
    )
    return NO_PLAN_EXIT


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
