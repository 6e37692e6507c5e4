"""The driver-loss supervisor: a detached Ray actor that keeps an experiment's driver alive across its loss.

Ray Jobs never restart a driver: when the driver process or its node dies, the job is FAILED and the
experiment stops until someone resubmits it. `marin submit --resubmit-on-driver-loss N` therefore submits this
module as a small job of its own. Its driver creates (or finds, after a restart) the actor
`marin-supervisor-{experiment}-{submit}`: detached, `max_restarts=-1` (Ray restarts it elsewhere if its node
dies), needing no CPU and pinned to the head node, which is the one node whose loss ends the cluster anyway.
The actor submits the experiment's run job (`python -m marin.cluster.driver ...`, with the supervisor job's
own `working_dir` and sealed environment, already uploaded, so nothing is uploaded again), and watches it. It
knows its drivers by their submit id (`marin_submit` in their metadata; see `jobs.py`): a run job of the same
experiment from any other submit (an ended one, say, from an earlier submit to another prefix) is never taken
for its own.
- the job SUCCEEDED, FAILED because a step failed or no plan ran (the driver exited 1, 2 or 4), or was
  STOPPED: done;
- the job FAILED because its driver was lost (killed by a signal, or Ray's job supervisor died with its node):
  the loss is recorded in the experiment's manifest (`interruptions`, cause `driver_lost`; its run
  DRIVER_LOST), the lost driver's attempts in flight are closed in the steps' records (PREEMPTED with cause
  `driver_lost`, a ledger entry; execution/lost_attempts.py: under each step's lease, taken over from that
  driver by the lease protocol's rule) and a new run job is submitted, up to N times. The new driver
  replans: finished steps are skipped, and the steps the lost driver was running are free and re-run as
  their next attempts. When the N resubmits are spent, the interruptions no attempt will follow are closed
  in the ledgers with their work lost (`not_resumed`: lost_attempts.close_given_up), so goodput counts them.
The supervisor job exits with the last run job's exit code (see `jobs.exit_code`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from marin.cluster import jobs

POLL_S = 1.0


def _dashboard_url() -> str:
    """The head's Jobs API address, as the cluster itself records it (readable from any process of the job,
    actors included; `ray.worker.get_dashboard_url` works in drivers only)."""
    from ray._private.services import get_webui_url_from_internal_kv

    url = get_webui_url_from_internal_kv()  # type: ignore[no-untyped-call]
    if not url:
        raise RuntimeError("this Ray cluster runs no dashboard, so it has no Jobs API for the supervisor to "
                           "submit drivers through: start the head with --include-dashboard=true")
    return str(url) if "://" in str(url) else f"http://{url}"


def _record_driver_loss(prefix: str, experiment_id: str, row: jobs.JobRow) -> None:
    from marin.status import manifest
    from marin.storage import storage_for

    storage = storage_for(prefix)
    manifest.record_driver_loss(
        storage,
        prefix,
        experiment_id,
        job=row.submission_id,
        ended=row.end_time,
        message=row.message.splitlines()[0] if row.message else "",
    )


def _close_driver_attempts(prefix: str, experiment_id: str, row: jobs.JobRow, by: str) -> None:
    """The lost driver's attempts in flight closed in the steps' records (execution/lost_attempts.py); a
    failure is reported and left to the next executor, which closes them when it takes their leases over."""
    from marin.execution.lost_attempts import close_driver_attempts
    from marin.storage import storage_for

    try:
        closed = close_driver_attempts(storage_for(prefix), prefix, experiment_id, row.submission_id, by=by)
    except Exception as e:
        print(f"marin supervisor: closing the attempts of the lost driver {row.submission_id} failed "
              f"({type(e).__name__}: {e}); the next driver closes them", file=sys.stderr, flush=True)
        return
    if closed:
        print(f"marin supervisor: driver {row.submission_id} lost; closed its attempts of "
              f"{', '.join(closed)} (PREEMPTED, driver_lost)", flush=True)


def _close_given_up(prefix: str, experiment_id: str, *, by: str, why: str) -> None:
    """No driver follows: the ledger entries still open are closed with their work lost
    (execution/lost_attempts.py), so goodput counts them; a failure is reported, never raised."""
    from marin.execution.lost_attempts import close_given_up
    from marin.storage import storage_for

    try:
        closed = close_given_up(storage_for(prefix), prefix, experiment_id, by=by, why=why)
    except Exception as e:
        print(f"marin supervisor: closing the open interruptions failed ({type(e).__name__}: {e}); "
              "`marin status` counts their work lost all the same", file=sys.stderr, flush=True)
        return
    if closed:
        print(f"marin supervisor: {why}; closed the open interruptions of {', '.join(closed)}", flush=True)


class Supervisor:
    """The loop, apart from Ray so that it can be read (and tested) on its own."""

    def __init__(self, spec: dict[str, Any], client: Any, runtime_env: dict[str, Any]) -> None:
        self.spec, self.client = spec, client
        self.runtime_env = {k: v for k, v in runtime_env.items() if k != "excludes"}
        self.experiment: str = spec["experiment"]
        self.submit: str = spec["submit"]
        self.result: dict[str, Any] | None = None

    def _drivers(self) -> list[jobs.JobRow]:
        """The run jobs this supervisor submitted (after a restart: before it, too), oldest first."""
        return jobs.marin_jobs(self.client, self.experiment, jobs.RUN, submit=self.submit)

    def _current(self) -> jobs.JobRow | None:
        runs = self._drivers()
        return max(runs, key=lambda r: r.driver) if runs else None

    def _submit(self, n: int) -> None:
        sid = jobs.submission_id(self.experiment, self.submit, n)
        env = dict(self.runtime_env)
        env["env_vars"] = {**env.get("env_vars", {}), "MARIN_JOB_SUBMISSION_ID": sid}
        try:
            self.client.submit_job(
                entrypoint=self.spec["entrypoint"],
                submission_id=sid,
                runtime_env=env,
                metadata={**self.spec["metadata"], "marin_driver": str(n)},
                **self.spec["options"],
            )
        except RuntimeError as e:
            if "already exists" not in str(e):  # a restarted supervisor racing its own earlier submission
                raise

    def run(self) -> dict[str, Any]:
        resubmits = 0
        current = self._current()
        if current is None:
            self._submit(1)
        while True:
            current = self._current()
            if current is None or current.live:
                time.sleep(POLL_S)
                continue
            if not current.driver_lost:
                self.result = {
                    "job": current.submission_id,
                    "status": current.status,
                    "exit_code": jobs.exit_code(current),
                    "resubmits": resubmits,
                }
                return self.result
            lost_before = sum(1 for r in self._drivers() if r.driver_lost)
            prefix = self.spec["metadata"]["marin_prefix"]
            by = f"marin-supervisor-{self.experiment}-{self.submit}"
            _record_driver_loss(prefix, self.experiment, current)
            _close_driver_attempts(prefix, self.experiment, current, by=by)
            if lost_before > int(self.spec["max_resubmits"]):
                _close_given_up(prefix, self.experiment, by=by,
                                why=f"the supervisor gave up after {resubmits} resubmission(s): "
                                    f"--resubmit-on-driver-loss {self.spec['max_resubmits']} spent")
                self.result = {
                    "job": current.submission_id,
                    "status": "DRIVER_LOST",
                    "exit_code": 3,
                    "resubmits": resubmits,
                }
                return self.result
            resubmits += 1
            self._submit(current.driver + 1)


def _actor_class() -> Any:
    import ray

    remote: Any = ray.remote  # its overloads do not know actor options such as lifetime

    @remote(
        num_cpus=0,
        max_restarts=-1,
        max_task_retries=-1,
        max_concurrency=4,
        lifetime="detached",
        resources={"node:__internal_head__": 0.001},
    )
    class SupervisorActor:
        def __init__(self, spec: dict[str, Any]) -> None:
            from ray.job_submission import JobSubmissionClient

            runtime_env = dict(ray.get_runtime_context().runtime_env or {})
            self.loop = Supervisor(spec, JobSubmissionClient(_dashboard_url()), runtime_env)
            self.done = threading.Event()
            threading.Thread(target=self._run, name="marin-supervisor", daemon=True).start()

        def _run(self) -> None:
            try:
                self.loop.run()
            except Exception as e:  # reported by the supervisor job (exit 3), never a silent hang
                self.loop.result = {"status": "SUPERVISOR_ERROR", "exit_code": 3, "resubmits": 0,
                                    "job": None, "error": f"{type(e).__name__}: {e}"}
            finally:
                self.done.set()

        def wait(self) -> dict[str, Any]:
            self.done.wait()
            return dict(self.loop.result or {})  # the supervisor job kills the actor once it has this

    return SupervisorActor


def main(argv: list[str]) -> int:
    import ray

    spec = json.loads(argv[0])
    ray.init(address="auto", namespace="marin", log_to_driver=False)
    name = f"marin-supervisor-{spec['experiment']}-{spec['submit']}"
    actor = _actor_class().options(name=name, get_if_exists=True).remote(spec)
    result = ray.get(actor.wait.remote())
    ray.kill(actor)
    if result.get("error"):
        print(f"marin supervisor: error: {result['error']}", flush=True)
    print(
        f"marin supervisor: experiment {spec['experiment']}: last driver job {result.get('job')} ended "
        f"{result.get('status')} after {result.get('resubmits')} resubmission(s)",
        flush=True,
    )
    return int(result.get("exit_code", 3))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
