"""An experiment's Ray jobs: naming, finding, classifying their ends, and `marin jobs list|logs|stop`.

Every `marin submit` gets a fresh submit id (`20261206-064100-1a2b3c4d`: UTC time and 32 random bits), so
that, like Ray's own job ids, no submission id is ever used twice, not even after `ray job delete` (which
frees an id for reuse): a job id always names one driver and its log. Its jobs are
`marin-{experiment}-{submit}-{n}` for the n-th driver (n > 1 only under a supervisor, which replaces lost
drivers) and `marin-{experiment}-{submit}-supervisor` for the supervisor. Each carries metadata:
`marin_experiment`, `marin_kind` (`run` or `supervisor`), `marin_submit` (the submit id), `marin_driver` (n),
`marin_issue`, `marin_script`, `marin_prefix` and `marin_flags` (the run flags, as a JSON list). A supervisor
follows only the drivers of its own submit id and `marin submit` only its own jobs; a live job of the
experiment is attached to instead of starting a second driver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

RUN, SUPERVISOR = "run", "supervisor"
LIVE = ("PENDING", "RUNNING")
NO_PLAN_EXIT = 4
"""A submitted driver that ended without having started the plan it was given (`driver.py`)."""
DRIVER_EXIT_CODES_OF_USER_ERRORS = (0, 1, 2, NO_PLAN_EXIT)
"""`marin run` exits 0 (all steps succeeded), 1 (a step failed) or 2 (a definition or flag error), and the
submitted driver 4 when it ran no plan; any other exit (a signal: 137 for SIGKILL, 143 for SIGTERM; a
vanished supervisor) means the driver itself was lost."""


def dashboard_address(address: str | None) -> str:
    """The Jobs API address: `--cluster`, else $RAY_ADDRESS; `host:port` gets `http://`."""
    address = address or os.environ.get("RAY_ADDRESS") or ""
    if not address:
        raise ValueError(
            "no cluster given: pass --cluster http://HEAD:8265 (the head's dashboard address) or set "
            "RAY_ADDRESS"
        )
    return address if "://" in address else f"http://{address}"


def client(address: str | None) -> Any:
    from ray.job_submission import JobSubmissionClient

    url = dashboard_address(address)
    try:
        return JobSubmissionClient(url)
    except Exception as e:  # ConnectionError, or a RuntimeError from Ray naming the address
        raise ConnectionError(
            f"cannot reach the Ray Jobs API at {url}: {e}. Fix: give the head's dashboard "
            "address (ray start --head --include-dashboard=true --dashboard-port=8265)"
        ) from e


def new_submit_id(now: float | None = None) -> str:
    """A fresh id for one `marin submit`: its UTC time (jobs sort by it) and 32 random bits."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(4)}"


def submission_id(experiment_id: str, submit: str, n: int = 1, kind: str = RUN) -> str:
    """The Ray submission id of a submit's n-th driver, or of its supervisor."""
    return f"marin-{experiment_id}-{submit}-{n}" if kind == RUN else f"marin-{experiment_id}-{submit}-{kind}"


@dataclasses.dataclass(frozen=True)
class JobRow:
    submission_id: str
    experiment: str
    kind: str
    submit: str  # the `marin submit` that made it ("" for jobs of older versions)
    driver: int  # n of the submit's n-th driver (0 for a supervisor)
    status: str
    issue: str
    script: str
    prefix: str
    start_time: float | None  # seconds since the epoch
    end_time: float | None
    error_type: str | None
    message: str
    driver_exit_code: int | None
    runtime_env: dict[str, Any]

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def driver_lost(self) -> bool:
        """Ended because the driver (or its node, or the job's supervisor actor) died, not because steps
        failed."""
        if self.status != "FAILED":
            return False
        if self.error_type == "JOB_SUPERVISOR_ACTOR_DIED":
            return True
        return (
            self.driver_exit_code is not None
            and self.driver_exit_code not in DRIVER_EXIT_CODES_OF_USER_ERRORS
        )


def _row(job: Any) -> JobRow:
    meta = dict(job.metadata or {})
    status = getattr(job.status, "value", str(job.status))

    def ms(v: float | None) -> float | None:
        return v / 1000.0 if v else None

    number = meta.get("marin_driver") or ""
    if not number.isdigit():  # a job of an older version: the n at the end of its id
        m = re.search(r"-(\d+)$", str(job.submission_id))
        number = m.group(1) if m and meta.get("marin_kind") == RUN else "0"
    return JobRow(
        str(job.submission_id),
        meta.get("marin_experiment", ""),
        meta.get("marin_kind", ""),
        meta.get("marin_submit", ""),
        int(number),
        status,
        meta.get("marin_issue", ""),
        meta.get("marin_script", ""),
        meta.get("marin_prefix", ""),
        ms(job.start_time),
        ms(job.end_time),
        job.error_type,
        job.message or "",
        job.driver_exit_code,
        dict(job.runtime_env or {}),
    )


def marin_jobs(
    jobs_client: Any, experiment_id: str | None = None, kind: str | None = None, submit: str | None = None
) -> list[JobRow]:
    """Jobs made by `marin submit` (of one experiment / kind / submit id), oldest first."""
    rows = [_row(j) for j in jobs_client.list_jobs() if (j.metadata or {}).get("marin_experiment")]
    rows = [
        r
        for r in rows
        if (experiment_id is None or r.experiment == experiment_id)
        and (kind is None or r.kind == kind)
        and (submit is None or r.submit == submit)
    ]
    return sorted(rows, key=lambda r: (r.start_time or 0.0, r.submit, r.driver))


def resolve(jobs_client: Any, name: str) -> JobRow:
    """A job by submission id, or an experiment id's newest run job."""
    rows = [_row(j) for j in jobs_client.list_jobs()]
    for r in rows:
        if r.submission_id == name:
            return r
    runs = [r for r in rows if r.experiment == name and r.kind == RUN]
    if runs:
        return max(runs, key=lambda r: (r.start_time or 0.0, r.submit, r.driver))
    known = ", ".join(sorted(r.submission_id for r in rows if r.experiment)) or "none"
    raise KeyError(f"no job or experiment named {name!r} on this cluster; marin jobs: {known}")


def wait_for_run(
    jobs_client: Any, experiment_id: str, submit: str, after: int, timeout_s: float
) -> JobRow | None:
    """The first driver of this submit numbered above `after` (a supervisor's next driver); None once the
    submit's supervisor ended without starting one, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = marin_jobs(jobs_client, experiment_id, submit=submit)
        runs = [r for r in rows if r.kind == RUN and r.driver > after]
        if runs:
            return runs[0]
        if not any(r.live for r in rows if r.kind == SUPERVISOR):
            rows = marin_jobs(jobs_client, experiment_id, submit=submit)  # it may have submitted, then ended
            runs = [r for r in rows if r.kind == RUN and r.driver > after]
            return runs[0] if runs else None
        time.sleep(0.5)
    return None


def follow_logs(jobs_client: Any, submission: str, write: Callable[[str], object] = sys.stdout.write) -> None:
    """Stream a job's driver output until the job ends, then print whatever the stream missed (a job that
    ended before the stream connected sends nothing over it)."""
    shown: list[str] = []

    async def tail() -> None:
        async for chunk in jobs_client.tail_job_logs(submission):
            shown.append(chunk)
            write(chunk)
            sys.stdout.flush()

    asyncio.run(tail())
    streamed, full = "".join(shown), jobs_client.get_job_logs(submission)
    if full.startswith(streamed):
        write(full[len(streamed) :])
    elif not streamed:
        write(full)
    sys.stdout.flush()


def exit_code(row: JobRow) -> int:
    """What `marin submit` exits with once the job ended: the driver's own code where Ray knows it."""
    if row.status == "SUCCEEDED":
        return 0
    if row.status == "STOPPED":
        return 130
    if row.driver_exit_code is not None and row.driver_exit_code in DRIVER_EXIT_CODES_OF_USER_ERRORS:
        return row.driver_exit_code or 1  # a FAILED job whose driver exited 0: a failure all the same
    return 3  # the driver was lost


def format_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"
