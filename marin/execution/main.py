"""`executor_main` (what experiment scripts call) and `run_experiment` (the same, from Python).

Order of work: build and check the DAG (no I/O) -> plan (reads only) -> print the plan -> stop here for a dry
run -> check resources with the backend -> write the manifest -> execute -> write the final status -> print a
summary naming every failed step and its log file.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import json
import os
import queue
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import marin.tracking  # noqa: F401  (registers the issue-tracker publisher factory)
from marin.definition.step import Step
from marin.errors import ExperimentFailedError, StepFailedError
from marin.execution.argv import ExecutorMainConfig, parse_flags
from marin.execution.executor import Executor, RunContextInfo, StepState
from marin.graph.dag import Graph, build_graph
from marin.graph.plan import BLOCKED, FAILED_ACTION, RUN, SKIP, Plan, make_plan
from marin.issue_ref import IssueRef
from marin.status import files as sf
from marin.status import manifest
from marin.status.publisher import Publisher, PublisherSet, RunContext, RunView, StepView, publishers_for
from marin.status.stepinfo import provenance_started
from marin.storage.fs import normalize_prefix, storage_for

# Set by `marin plan` / `marin status`: the script's executor_main then plans or reports instead of running.
CLI_MODE: contextvars.ContextVar[str] = contextvars.ContextVar("marin_cli_mode", default="run")


@dataclasses.dataclass
class RunResult:
    """The outcome of one run (or dry run) of an experiment."""

    run_id: str
    experiment_id: str
    prefix: str
    status: str  # SUCCESS, FAILED or DRY_RUN
    plan: Plan
    steps: dict[str, StepState]
    failures: list[StepFailedError]
    publisher_errors: list[dict[str, Any]]
    summary: str

    def status_of(self, name: str) -> str | None:
        for st in self.steps.values():
            if st.node.name == name:
                return st.status
        return None

    def output_path(self, name: str) -> str:
        for e in self.plan.entries:
            if e.name == name:
                return e.output_path
        raise KeyError(f"no step named {name!r} in this run; steps: {[e.name for e in self.plan.entries]}")


def script_path() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or "interactive"
    if path != "interactive":
        with contextlib.suppress(ValueError):
            rel = os.path.relpath(path)
            path = rel if not rel.startswith("..") else path
    return path


def script_stem(script: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "", os.path.splitext(os.path.basename(script))[0])
    return stem or "experiment"


# A view lists every step, so one per transition makes a run quadratic in its size (2,000 transitions x 1,000
# steps for a 1,000-step fan-out). Runs of up to VIEW_EVERY_TRANSITION_MAX_STEPS steps publish every transition
# (the terminal progress shows each RUNNING and SUCCESS); larger runs publish at most every VIEW_INTERVAL_S.
VIEW_EVERY_TRANSITION_MAX_STEPS = 100
VIEW_INTERVAL_S = 0.2


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        print(msg, file=sys.stderr, flush=True)


F = TypeVar("F", bound=Callable[..., Any])


def _old_objects_frozen(fn: F) -> F:
    """Keep the objects that existed before a run out of the garbage collector's full collections during it.

    A run allocates per step (states, records, results), which triggers full collections; each one walks every
    tracked object of the process - on a driver that imported Ray, ~120k objects, ~85 ms a time, several times
    in a thousand-step run. `gc.freeze()` moves the objects that exist at the start into a permanent
    generation that collections skip, and `gc.unfreeze()` at the end hands them back, so nothing the caller
    owns escapes collection for longer than the run (plain reference counting frees non-cyclic garbage
    throughout). It also keeps forked local workers from touching, and so copying, the parent's pages.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gc.freeze()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.unfreeze()

    return wrapper  # type: ignore[return-value]


@_old_objects_frozen
def run_experiment(
    steps: Sequence[Step],
    *,
    prefix: str | None = None,
    description: str = "",
    backend: str = "local",
    dry_run: bool = False,
    run_only: Sequence[str] | None = None,
    force_run_failed: bool = False,
    max_concurrent: int | None = None,
    ray_address: str | None = None,
    lease_timeout_s: float = 60.0,
    issue: str | IssueRef | None = None,
    publishers: Sequence[Publisher] = (),
    script: str | None = None,
    args: Sequence[str] = (),
    verbose: bool = True,
) -> RunResult:
    """Plan and run `steps` (and everything they depend on). Never raises for a failed step: see `.status`."""
    t0 = time.time()
    script = script or script_path()
    # git runs as a subprocess (~4 ms): let it work while the DAG is hashed and planned. It only reads.
    prov_of = None if dry_run else provenance_started(script)
    graph = build_graph(steps)  # definition errors surface here, before any I/O
    prefix = normalize_prefix(prefix or os.environ.get("MARIN_PREFIX") or "./marin-out")
    storage = storage_for(prefix)
    issue_ref = (IssueRef.parse(issue) if isinstance(issue, str) else issue) or IssueRef.from_script(script)
    experiment_id = f"{script_stem(script)}-{graph.experiment_hash[:8]}"
    run_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t0))}-{uuid.uuid4().hex[:6]}"
    plan = make_plan(graph, prefix, storage, run_only=run_only, force_run_failed=force_run_failed)
    if verbose:
        _log(plan.table() if len(plan.entries) <= 200 else _short_plan(plan), verbose)
    if dry_run:
        return RunResult(run_id, experiment_id, prefix, "DRY_RUN", plan, {}, [], [], "dry run: nothing written")

    completions: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    runnable = [e for e in plan.entries if e.action == RUN]
    # When every step is already settled nothing is ever submitted: do not start (or join) Ray just to skip.
    settled = all(e.action in (SKIP, BLOCKED, FAILED_ACTION) for e in plan.entries)
    be = _make_backend("local" if settled else backend, completions, ray_address)
    try:
        be.check_resources([(e.name, e.node.step.resources) for e in runnable if e.node is not None])
        assert prov_of is not None  # started above for every run that is not a dry run
        prov = prov_of()
        ctx = RunContextInfo(run_id, sf.new_executor_id(), experiment_id, str(issue_ref) if issue_ref else None,
                             prefix, prov)
        manifest.start_run(storage, prefix, experiment_id, script=script, description=description, issue=ctx.issue,
                           provenance=prov, steps=_manifest_steps(graph, plan), run_id=run_id, args=list(args))
        pubs, factory_errors = publishers_for(
            RunContext(prefix, ctx.issue, experiment_id, script, run_id, description), publishers)
        pset = PublisherSet(pubs)
        pset.errors.extend(factory_errors)
        limit = max_concurrent or ((os.cpu_count() or 1) if backend == "local" else 100_000)
        executor: Executor | None = None

        def view(status: str, ended: float | None) -> RunView:
            states = executor.states if executor else {}
            return _run_view(experiment_id, run_id, script, description, ctx.issue, prefix, status, t0, ended,
                             plan, states)

        # Coalesced views (see VIEW_INTERVAL_S): a newer state not yet published is published once the interval
        # has passed, even if the executor is then only waiting (it wakes up for it).
        interval = 0.0 if len(plan.entries) <= VIEW_EVERY_TRANSITION_MAX_STEPS else VIEW_INTERVAL_S
        published = {"at": float("-inf"), "dirty": False}

        def on_transition() -> None:
            published["dirty"] = bool(pset)
            on_idle()

        def on_idle() -> float | None:
            if not published["dirty"]:
                return None
            wait = published["at"] + interval - time.monotonic()
            if wait > 0:
                return wait
            published["at"], published["dirty"] = time.monotonic(), False
            pset.publish(view("RUNNING", None), final=False)
            return None

        executor = Executor(graph, plan, storage, be, completions, ctx, max_concurrent=limit,
                            lease_timeout_s=lease_timeout_s, on_transition=on_transition, on_idle=on_idle)
        status = "FAILED"
        previous_handler = _on_sigterm_raise()
        try:
            states = executor.run()
            failures = [st.failure for st in states.values() if st.failure is not None]
            unfinished = [st for st in states.values() if st.status != sf.SUCCESS]
            status = "SUCCESS" if not unfinished else "FAILED"
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            ended = time.time()
            if pset:
                pset.publish(view(status, ended), final=True)
            manifest.end_run(storage, prefix, experiment_id, run_id, status, pset.errors)
    finally:
        be.shutdown()
    summary = _summary(plan, states, pset.errors, ended - t0, experiment_id, prefix)
    _log(summary, verbose)
    return RunResult(run_id, experiment_id, prefix, status, plan, states, failures, pset.errors, summary)


def _on_sigterm_raise() -> Any:
    """Turn SIGTERM (a cluster scheduler stopping the driver) into SystemExit, so running steps are recorded
    PREEMPTED and their leases released instead of going stale. Only possible on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _make_backend(backend: str, completions: queue.SimpleQueue[tuple[Any, ...]], ray_address: str | None) -> Any:
    if backend == "local":
        from marin.execution.local_backend import LocalBackend

        return LocalBackend(completions)
    if backend == "ray":
        from marin.execution.ray_backend import RayBackend

        return RayBackend(completions, ray_address)
    raise ValueError(f"unknown backend {backend!r}: use 'ray' or 'local'")


def _short_plan(plan: Plan) -> str:
    counts = Counter(e.action for e in plan.entries)
    return f"plan under {plan.prefix}: {len(plan.entries)} steps (" + ", ".join(
        f"{k}: {v}" for k, v in sorted(counts.items())) + "); use `marin plan` for the full table"


def _manifest_steps(graph: Graph, plan: Plan) -> list[dict[str, Any]]:
    paths = {e.hash: e.output_path for e in plan.entries}
    return [{"name": n.name, "hash": n.hash, "output_path": paths.get(n.hash) or n.output_path(plan.prefix),
             "dependencies": [d.hash for d in n.deps]} for n in graph.nodes]


def _run_view(experiment_id: str, run_id: str, script: str, description: str, issue: str | None, prefix: str,
              status: str, started: float, ended: float | None, plan: Plan, states: dict[str, StepState]) -> RunView:
    views = []
    for e in plan.entries:
        st = states.get(e.hash)
        step_status = (st.status if st and not st.queued else None) or sf.WAITING
        attempt = st.attempt if st else 0
        err = st.error if st else None
        views.append(StepView(
            name=e.name, hash=e.hash, output_path=e.output_path, status=step_status, attempt=attempt,
            started=st.started if st else None, ended=st.ended if st else None,
            error_summary=f"{err.get('type')}: {err.get('message')}" if err else (st.note if st and st.status in (
                sf.FAILED, sf.DEP_FAILED) else None),
            log_path=sf.log_path(e.output_path, attempt) if attempt else None,
            dependencies=tuple(e.dependencies)))
    return RunView(experiment_id, run_id, script, description, issue, prefix, status, started, ended, tuple(views))


def _summary(plan: Plan, states: dict[str, StepState], publisher_errors: list[dict[str, Any]], wall_s: float,
             experiment_id: str, prefix: str) -> str:
    counts: dict[str, int] = {}
    for st in states.values():
        key = f"{st.status}({st.note})" if st.status == sf.SUCCESS and st.note != "ran" else str(st.status)
        counts[key] = counts.get(key, 0) + 1
    lines = [f"experiment {experiment_id} under {prefix}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
             + f" in {wall_s:.2f} s"]
    for st in states.values():
        if st.status in (sf.FAILED, sf.PREEMPTED) and st.failure is not None:
            lines.append(f"  {st.status} {st.node.name} ({st.entry.hash[:8]}): {st.failure.summary}")
            lines.append(f"      log: {st.failure.log_path}")
        elif st.status == sf.FAILED:
            lines.append(f"  FAILED {st.node.name} ({st.entry.hash[:8]}): {st.note}")
            prev_log = (st.previous or {}).get("log")
            if prev_log:
                lines.append(f"      log: {sf.meta_dir(st.path)}/{prev_log}")
        elif st.status == sf.DEP_FAILED:
            lines.append(f"  DEP_FAILED {st.node.name} ({st.entry.hash[:8]}): {st.note}")
        elif st.status not in (sf.SUCCESS,):
            lines.append(f"  {st.status} {st.node.name} ({st.entry.hash[:8]}): {st.note}")
    for err in publisher_errors:
        lines.append(f"  publisher {err['publisher']} failed (the run is unaffected): {err['error']}")
    return "\n".join(lines)


@contextlib.contextmanager
def cli_mode(mode: str) -> Iterator[None]:
    token = CLI_MODE.set(mode)
    try:
        yield
    finally:
        CLI_MODE.reset(token)


def executor_main(
    steps: Sequence[Step],
    description: str = "",
    *,
    issue: str | None = None,
    publishers: Sequence[Publisher] = (),
    argv: Sequence[str] | None = None,
) -> RunResult:
    """Entry point of an experiment script: parse the flags (`python SCRIPT --prefix ... --dry-run`), then
    plan and run. Raises ExperimentFailedError (chained to the first step's error) if any step failed."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_flags(args)
    issue = cfg.issue or issue
    mode = CLI_MODE.get()
    if mode in ("plan", "status"):
        return _report(steps, cfg, mode)
    if mode == "describe":
        return _describe(steps, cfg, issue)
    result = run_experiment(
        steps, prefix=cfg.resolved_prefix(), description=description, backend=cfg.backend, dry_run=cfg.dry_run,
        run_only=cfg.run_only, force_run_failed=cfg.force_run_failed, max_concurrent=cfg.max_concurrent,
        ray_address=cfg.ray_address, lease_timeout_s=cfg.lease_timeout_s, issue=issue, publishers=publishers,
        args=args,
    )
    if result.status == "FAILED":
        error = ExperimentFailedError(result.summary, result.failures)
        first = result.failures[0] if result.failures else None
        raise error from first
    return result


@dataclasses.dataclass(frozen=True)
class Described:
    """What `marin submit` learns from a script without planning or touching storage."""

    experiment_id: str
    issue: str | None
    prefix: str
    steps: int


DESCRIBED: contextvars.ContextVar[list[Described] | None] = contextvars.ContextVar("marin_described", default=None)


def _describe(steps: Sequence[Step], cfg: ExecutorMainConfig, issue: str | None) -> RunResult:
    graph = build_graph(steps)
    script = script_path()
    experiment_id = f"{script_stem(script)}-{graph.experiment_hash[:8]}"
    ref = IssueRef.parse(issue) if issue else IssueRef.from_script(script)
    sink = DESCRIBED.get()
    if sink is not None:
        sink.append(Described(experiment_id, str(ref) if ref else None, cfg.resolved_prefix(), len(graph.nodes)))
    empty = Plan(cfg.resolved_prefix(), [], [], 0)
    return RunResult("", experiment_id, cfg.resolved_prefix(), "DESCRIBE", empty, {}, [], [], "")


def _report(steps: Sequence[Step], cfg: ExecutorMainConfig, mode: str) -> RunResult:
    graph = build_graph(steps)
    prefix = normalize_prefix(cfg.resolved_prefix())
    storage = storage_for(prefix)
    plan = make_plan(graph, prefix, storage, run_only=cfg.run_only, force_run_failed=cfg.force_run_failed)
    experiment_id = f"{script_stem(script_path())}-{graph.experiment_hash[:8]}"
    if mode == "plan":
        print(json.dumps({"experiment": experiment_id, **plan.to_json()}, indent=1) if cfg.format == "json"
              else plan.table())
    else:
        rows: list[dict[str, Any]] = []
        for e in plan.entries:
            current = sf.read_status(storage, e.output_path) or {}
            rows.append({"name": e.name, "hash": e.hash, "output_path": e.output_path,
                         "status": current.get("status"), "attempt": current.get("attempt"),
                         "updated": current.get("updated"), "error": current.get("error")})
        if cfg.format == "json":
            print(json.dumps({"experiment": experiment_id, "prefix": prefix, "steps": rows}, indent=1))
        else:
            print(f"experiment {experiment_id} under {prefix}:")
            for r in rows:
                err = r["error"] or {}
                extra = f"  {err.get('type')}: {err.get('message')}" if err else ""
                print(f"  {str(r['status'] or 'NOT RUN'):<10} {r['name']} {r['hash'][:8]}{extra}")
    return RunResult("", experiment_id, prefix, f"{mode.upper()}", plan, {}, [], [], "")
