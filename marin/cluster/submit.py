"""`marin submit SCRIPT [run flags] [submit flags]`: the experiment's driver as a Ray job on the cluster.

Order of work: learn the experiment's id and issue from the script (its `executor_main` in "describe" mode:
the DAG is built and hashed, nothing planned or written) -> check the code Ray would upload against its size
limit (`package.py`) -> attach to a live job of the same experiment, or, under a fresh submit id
(`jobs.new_submit_id`), submit `python -m marin.cluster.driver SCRIPT [run flags]` (`marin run` plus the check
that it started its plan: `driver.py`) (or, with `--resubmit-on-driver-loss`, the supervisor that keeps
starting such drivers: see `supervisor.py`) with the repository as `working_dir`, the credentials sealed
(`job_env.py`) and entrypoint resources that keep the driver off the head node -> print where everything is ->
follow this submit's drivers' output (never another submit's) until the last one ends (unless `--no-wait`),
exiting 0 on success, 1 when a step failed, 2 on bad input, 3 when the driver was lost and not replaced, 4
when the driver ended without starting its plan, 130 when the job was stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import runpy
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin.cluster import jobs
from marin.cluster.driver import EXPERIMENT_ENV_VAR
from marin.cluster.job_env import MODULE_ENV_VAR, collect, seal
from marin.cluster.package import ALWAYS_EXCLUDED, PackageTooLargeError, check_working_dir, repository_root

DEFAULT_DRIVER_CPUS = 1.0
"""A driver asks for one CPU by default: a head started with `--num-cpus=0` (as infra/ does) then never runs
it."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="marin submit",
        description=__doc__.split("\n\n")[0],
        epilog="Every other flag is a run flag, passed to `marin run` on the cluster.",
    )
    p.add_argument("script", help="the experiment script (inside the repository that becomes the job's code)")
    p.add_argument("--cluster", help="the head's Jobs API address, http://HEAD:8265 (default: $RAY_ADDRESS)")
    p.add_argument("--no-wait", action="store_true", help="return once the job is submitted")
    p.add_argument(
        "--entrypoint-num-cpus",
        type=float,
        metavar="N",
        default=DEFAULT_DRIVER_CPUS,
        help="CPUs the driver asks for (default 1; 0 lets Ray put it on the head node)",
    )
    p.add_argument("--entrypoint-num-gpus", type=float, default=None, metavar="N",
                   help="GPUs the driver asks for (default: none)")
    p.add_argument("--entrypoint-memory", type=int, default=None, metavar="BYTES",
                   help="memory (bytes) the driver asks for (default: no reservation)")
    p.add_argument(
        "--entrypoint-resources",
        type=json.loads,
        metavar="JSON",
        default=None,
        help="custom resources for the driver, JSON: '{\"driver_node\": 1}' keeps it on nodes that "
        "declare that resource (e.g. non-preemptible ones)",
    )
    p.add_argument(
        "--resubmit-on-driver-loss",
        type=int,
        nargs="?",
        const=10,
        default=0,
        metavar="N",
        help="start a new driver (up to N times, default 10) when the driver or its node dies",
    )
    p.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="NAME",
        help="also pass this variable sealed (never shown by Ray); tracker and W&B tokens always are",
    )
    p.add_argument("--env", action="append", default=[], metavar="NAME", help="also pass this variable as is")
    return p


def split_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our own flags, and the rest (run flags for the script)."""
    ns, rest = _parser().parse_known_args(list(argv))
    return ns, rest


def describe(script: Path, flags: list[str]) -> Any:
    """Run the script's `executor_main` in describe mode: its experiment id, issue and prefix."""
    from marin.execution.main import DESCRIBED, cli_mode

    sink: list[Any] = []
    token = DESCRIBED.set(sink)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *flags]
    sys.path[:0] = [str(script.resolve().parent), os.getcwd()]
    try:
        with cli_mode("describe"):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        DESCRIBED.reset(token)
    if len(sink) != 1:
        raise ValueError(
            f"{script} called executor_main {len(sink)} times; a submitted script must call it once "
            "(under `if __name__ == '__main__':`)"
        )
    return sink[0]


def run_entrypoint(script_rel: str, flags: Sequence[str]) -> str:
    driver = ["python", "-m", "marin.cluster.driver"]
    return " ".join([*driver, shlex.quote(script_rel), *map(shlex.quote, flags)])


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    options = {
        "entrypoint_num_cpus": ns.entrypoint_num_cpus,
        "entrypoint_num_gpus": ns.entrypoint_num_gpus,
        "entrypoint_memory": ns.entrypoint_memory,
        "entrypoint_resources": ns.entrypoint_resources,
    }
    return {k: v for k, v in options.items() if v}


def _runtime_env(root: Path, ns: argparse.Namespace) -> dict[str, Any]:
    secret, plain = collect(os.environ, ns.secret_env, ns.env)
    package = seal(secret)
    env_vars = {**plain, "MARIN_SUBMITTED": "1"}
    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": list(ALWAYS_EXCLUDED)}
    if package is not None:
        env_vars[MODULE_ENV_VAR] = package.name
        runtime_env["py_modules"] = [str(package)]
    runtime_env["env_vars"] = env_vars
    return runtime_env


def job_metadata(
    described: Any, submit: str, kind: str, script_rel: str, flags: Sequence[str]
) -> dict[str, str]:
    """What the job's record (Ray's job list and dashboard, `marin jobs list`) says about the run: the values
    the run itself uses (the issue `--issue` names, the resolved prefix), and every run flag as given."""
    return {
        "marin_experiment": described.experiment_id,
        "marin_kind": kind,
        "marin_submit": submit,
        "marin_driver": "1" if kind == jobs.RUN else "0",
        "marin_issue": described.issue or "",
        "marin_script": script_rel,
        "marin_prefix": described.prefix,
        "marin_flags": json.dumps(list(flags)),
    }


def _submit(
    client: Any, described: Any, script_rel: str, flags: list[str], root: Path, ns: argparse.Namespace
) -> tuple[str, str]:
    """Submit this submit's first driver (or its supervisor) under a fresh submit id; its submission id."""
    submit = jobs.new_submit_id()
    kind = jobs.SUPERVISOR if ns.resubmit_on_driver_loss else jobs.RUN
    metadata = job_metadata(described, submit, kind, script_rel, flags)
    entrypoint = run_entrypoint(script_rel, flags)
    if kind == jobs.SUPERVISOR:
        spec = {
            "experiment": described.experiment_id,
            "submit": submit,
            "entrypoint": entrypoint,
            "options": _options(ns),
            "metadata": {**metadata, "marin_kind": jobs.RUN},  # and marin_driver: n
            "max_resubmits": ns.resubmit_on_driver_loss,
        }
        entrypoint = f"python -m marin.cluster.supervisor {shlex.quote(json.dumps(spec, sort_keys=True))}"
        options: dict[
            str, Any
        ] = {}  # the supervisor is tiny: it may sit on the head (it pins its actor there)
    else:
        options = _options(ns)
    sid = jobs.submission_id(described.experiment_id, submit, 1, kind)
    runtime_env = _runtime_env(root, ns)
    runtime_env["env_vars"]["MARIN_JOB_SUBMISSION_ID"] = sid
    runtime_env["env_vars"][EXPERIMENT_ENV_VAR] = described.experiment_id
    client.submit_job(
        entrypoint=entrypoint, submission_id=sid, runtime_env=runtime_env, metadata=metadata, **options
    )
    return sid, submit


def _announce(row_or_id: str, described: Any, address: str, attached: bool) -> None:
    verb = "attached to the live job" if attached else "submitted job"
    print(f"marin submit: {verb} {row_or_id} for experiment {described.experiment_id}", flush=True)
    print(
        f"  status files: {described.prefix.rstrip('/')}/experiments/{described.experiment_id}.json "
        f"(marin status --prefix {described.prefix})"
    )
    print(f"  Ray dashboard: {address.rstrip('/')}/#/jobs/{row_or_id}")
    board = os.environ.get("MARIN_DASHBOARD_URL")
    if board:
        print(f"  marin dashboard: {board.rstrip('/')}/experiments/{described.experiment_id}")
    print(f"  issue: {described.issue or '(none linked)'}")
    print(f"  follow: marin jobs logs {described.experiment_id} --follow --cluster {address}", flush=True)


def _supervisor_end(client: Any, experiment_id: str, submit: str) -> int:
    """The exit code when a supervisor ended without (another) driver: its own, told with its last words."""
    sups = jobs.marin_jobs(client, experiment_id, jobs.SUPERVISOR, submit=submit)
    if not sups:
        print(f"marin submit: no driver job of submit {submit} appeared for this experiment", file=sys.stderr)
        return 3
    sup = sups[-1]
    log = client.get_job_logs(sup.submission_id)
    last = [line for line in log.splitlines() if "marin supervisor" in line]
    print(f"marin submit: supervisor {sup.submission_id} ended {sup.status}"
          + (f": {last[-1]}" if last else f": {sup.message}" if sup.message else ""), file=sys.stderr)
    return 3 if sup.status == "SUCCEEDED" else jobs.exit_code(sup)


def follow(client: Any, experiment_id: str, submit: str) -> int:
    """Follow this submit's drivers (its supervisor's replacement drivers too) until one ends for good; never
    a job of another submit of the same experiment."""
    row = jobs.wait_for_run(client, experiment_id, submit, after=0, timeout_s=300)
    while row is not None:
        jobs.follow_logs(client, row.submission_id)
        row = jobs.resolve(client, row.submission_id)
        while row.live:  # the log stream can end a moment before Ray records the job's end
            time.sleep(0.5)
            row = jobs.resolve(client, row.submission_id)
        sups = jobs.marin_jobs(client, experiment_id, jobs.SUPERVISOR, submit=submit)
        supervised = any(r.live for r in sups)
        if not (row.driver_lost and supervised):
            print(
                f"marin submit: job {row.submission_id} ended {row.status}"
                + (f": {row.message.splitlines()[0]}" if row.message and row.status != "SUCCEEDED" else "")
            )
            return jobs.exit_code(row)
        print(
            f"marin submit: the driver of {row.submission_id} was lost; waiting for its replacement",
            flush=True,
        )
        row = jobs.wait_for_run(client, experiment_id, submit, after=row.driver, timeout_s=300)
    return _supervisor_end(client, experiment_id, submit)


def main(argv: Sequence[str]) -> int:
    ns, flags = split_args(argv)
    script = Path(ns.script)
    if not script.is_file():
        print(f"marin submit: no such script {ns.script!r}", file=sys.stderr)
        return 2
    try:
        described = describe(script, flags)
        root = repository_root(script)
        check_working_dir(root)
        address = jobs.dashboard_address(ns.cluster)
        client = jobs.client(address)
    except (PackageTooLargeError, ValueError, ConnectionError) as e:
        print(f"marin submit: error: {e}", file=sys.stderr)
        return 2
    script_rel = str(script.resolve().relative_to(root))
    live = [r for r in jobs.marin_jobs(client, described.experiment_id) if r.live]
    if live:  # follow that submit's jobs: a second driver of one experiment is never started
        sid, submit = live[-1].submission_id, live[-1].submit
        _announce(sid, dataclasses.replace(described, issue=live[-1].issue or None), address, attached=True)
    else:
        sid, submit = _submit(client, described, script_rel, flags, root, ns)
        _announce(sid, described, address, attached=False)
    if ns.no_wait:
        return 0
    return follow(client, described.experiment_id, submit)
