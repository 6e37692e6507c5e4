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

from marin.definition.criterion import Criterion, Notebook, declare
from marin.definition.step import Resources, Step
from marin.errors import ExperimentFailedError, StepFailedError
from marin.execution import after_run, report
from marin.execution.argv import ExecutorMainConfig, parse_flags
from marin.execution.backend import Backend, Completions, Interrupted
from marin.execution.executor import Executor
from marin.execution.notebook import freeze, judge_run
from marin.execution.records import RunContextInfo
from marin.execution.start_method import refuse_while_spawning
from marin.execution.state import StepState
from marin.execution.views import RunViews, publisher_error_line, summary
from marin.graph.checks import check_configs
from marin.graph.dag import Graph, build_graph
from marin.graph.plan import BLOCKED, FAILED_ACTION, RUN, SKIP, Plan, make_plan
from marin.graph.raw_inputs import RawInputs
from marin.issue_ref import IssueRef
from marin.status import files as sf
from marin.status import interruptions, manifest, verdicts
from marin.status.console import ConsoleProgress
from marin.status.publisher import Publisher, PublisherSet, RunContext, publishers_for
from marin.status.stepinfo import provenance_started
from marin.storage.fs import Storage, normalize_prefix, storage_for
from marin.storage.lease import LeaseInfo

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
    config: ExecutorMainConfig | None = None,
    *,
    description: str = "",
    publishers: Sequence[Publisher] = (),
    script: str | None = None,
    args: Sequence[str] = (),
    verbose: bool = True,
    hypothesis: str | None = None,
    criterion: Criterion | Sequence[Criterion] | None = None,
    tags: Sequence[str] | None = None,
    script_doc: str | None = None,
) -> RunResult:
    """Plan and run `steps` (and everything they depend on) with the settings in `config` (the flags of
    `executor_main`; `ExecutorMainConfig()` when not given). Never raises for a failed step: see `.status`.

    `publishers` are added to the default ones; `script` (default: the running script) names the
    experiment, `args` are recorded in the manifest; `verbose` prints the plan and the summary.
    `hypothesis`, `criterion` and `tags` are the lab notebook's declaration (docs/notebook.md), each
    falling back to its form in `script_doc` (the script's module docstring); frozen by the first run."""
    refuse_while_spawning()
    config = config or ExecutorMainConfig()
    t0 = time.time()
    script = script or script_path()
    notebook = declare(hypothesis, criterion, tags, script_doc)  # checked before anything else
    after = after_run.hooks_for(config)  # e.g. --publish: its policy is checked before anything runs
    # git runs as a subprocess (~4 ms): let it work while the DAG is hashed and planned. It only reads.
    prov_of = None if config.dry_run else provenance_started(script)
    prefix = normalize_prefix(config.resolved_prefix())
    # definition errors surface here, before any I/O; then raw inputs are fingerprinted (graph/raw_inputs.py)
    graph = build_graph(steps, RawInputs(prefix, config.raw_inputs))
    frozen = freeze(notebook, graph)
    storage = storage_for(prefix)
    issue_ref = (IssueRef.parse(config.issue) if config.issue else None) or IssueRef.from_script(script)
    issue = str(issue_ref) if issue_ref else None
    run_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t0))}-{uuid.uuid4().hex[:6]}"
    experiment_id = f"{script_stem(script)}-{graph.experiment_hash[:8]}"
    run = RunContext(prefix, issue, experiment_id, script, run_id, description)
    check_configs(graph, prefix)  # what each worker would parse, parsed now (marin/graph/checks.py)
    plan = make_plan(graph, prefix, storage, run_only=config.run_only,
                     force_run_failed=config.force_run_failed, force_run=config.force_run)
    chatty = verbose and not config.quiet
    if chatty:
        _log(plan.table() if len(plan.entries) <= 200 else _short_plan(plan), verbose)
        _log(report.banner(run), verbose)
    if config.dry_run:
        return RunResult(run_id, experiment_id, prefix, "DRY_RUN", plan, {}, [], [],
                         "dry run: nothing written")
    assert prov_of is not None  # started above for every run that is not a dry run
    if chatty and not any(isinstance(p, ConsoleProgress) for p in publishers):
        publishers = [*publishers, ConsoleProgress()]  # live progress (marin/status/console.py)
    result = _execute(graph, plan, storage, config, run, t0, prov_of, publishers, args, frozen)
    _log(result.summary, verbose)
    _run_after_hooks(after, result, storage, verbose)
    if verbose:
        _log(report.results_text(storage, prefix, experiment_id,
                                 [(e.name, e.hash, e.output_path, e.node.step.config) for e in plan.entries
                                  if e.node is not None]), verbose)
    return result


def _cpu_requests(plan: Plan) -> list[float]:
    """The CPUs each step the plan runs asks for (the local backend's default concurrency follows them)."""
    return [float(Resources.coerce(e.node.step.resources).num_cpus) for e in plan.entries
            if e.action == RUN and e.node is not None]


def _run_after_hooks(hooks: list[after_run.Hook], result: RunResult, storage: Storage, verbose: bool) -> None:
    """The after-run hooks (e.g. --publish); their errors join the run's publisher errors in the result and
    the manifest, and are printed: they never fail the run."""
    late = after_run.run_hooks(hooks, result.prefix, verbose)
    if late:
        result.publisher_errors.extend(late)
        manifest.add_publisher_errors(storage, result.prefix, result.experiment_id, result.run_id, late)
        _log("\n".join(publisher_error_line(e) for e in late), verbose)


def _execute(graph: Graph, plan: Plan, storage: Storage, config: ExecutorMainConfig, run: RunContext,
             started: float, provenance: Callable[[], dict[str, Any]], publishers: Sequence[Publisher],
             args: Sequence[str], notebook: dict[str, Any] | None) -> RunResult:
    """Check resources, write the manifest, run the executor, publish and record the outcome."""
    completions: Completions = queue.SimpleQueue()
    # When every step is already settled nothing is ever submitted: do not start (or join) Ray just to skip.
    settled = all(e.action in (SKIP, BLOCKED, FAILED_ACTION) for e in plan.entries)
    be = _make_backend("local" if settled else config.backend, completions, config.ray_address)
    try:
        be.check_resources([(e.name, Resources.coerce(e.node.step.resources)) for e in plan.entries
                            if e.action == RUN and e.node is not None])
        prov = provenance()
        ctx = RunContextInfo(run.run_id, sf.new_executor_id(), run.experiment_id, run.issue, run.prefix,
                             prov, getattr(provenance, "patch", None))
        manifest_steps = _manifest_steps(graph, plan)
        can_amend = notebook is not None and verdicts.amendable(storage, run.prefix, run.experiment_id)
        manifest.start_run(storage, run.prefix, run.experiment_id, script=run.script,
                           description=run.description, issue=run.issue, provenance=prov,
                           steps=manifest_steps, run_id=run.run_id, args=list(args),
                           notebook=notebook, amendable=can_amend,
                           judged=notebook is not None and not can_amend,
                           executor=ctx.executor_id)
        pubs, factory_errors = publishers_for(run, publishers)
        pset = PublisherSet(pubs)
        pset.errors.extend(factory_errors)
        views = RunViews(pset, run, started, plan)
        executor = Executor(graph, plan, storage, be, completions, ctx,
                            max_concurrent=config.concurrency_limit(_cpu_requests(plan)),
                            lease_timeout_s=config.lease_timeout_s,
                            on_transition=views.changed, on_idle=views.due)
        views.states = executor.states
        status = "FAILED"
        previous_handler = _on_sigterm_raise()
        previous_sigint = _on_sigint_at_a_safe_point(completions)
        try:
            states = executor.run()
            status = "SUCCESS" if all(st.status == sf.SUCCESS for st in states.values()) else "FAILED"
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            if previous_sigint is not None:
                signal.signal(signal.SIGINT, previous_sigint)
            ended = time.time()
            judge_run(storage, run.prefix, run.experiment_id, run.run_id, pset.errors)
            views.final(status, ended)
            manifest.end_run(storage, run.prefix, run.experiment_id, run.run_id, status, pset.errors,
                             steps=manifest_steps)
    finally:
        be.shutdown()
    failures = [st.failure for st in states.values() if st.failure is not None]
    text = summary(states, pset.errors, ended - started, run.experiment_id, run.prefix)
    return RunResult(run.run_id, run.experiment_id, run.prefix, status, plan, states, failures,
                     pset.errors, text)


def _on_sigterm_raise() -> Any:
    """Turn SIGTERM (a cluster scheduler stopping the driver) into SystemExit, so running steps are recorded
    PREEMPTED and their leases released instead of going stale. Only possible on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _on_sigint_at_a_safe_point(completions: Completions) -> Any:
    """Ctrl-C during the run: the first posts an `Interrupted` message, raised by the executor's loop at a
    known point (an interrupt raised asynchronously inside a publisher holding a lock could deadlock the
    clean-up that takes it again); a second raises at once. Only possible on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pressed: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        completions.put(Interrupted())  # SimpleQueue.put is reentrant: safe in a signal handler

    return signal.signal(signal.SIGINT, handler)


def _make_backend(backend: str, completions: Completions, ray_address: str | None) -> Backend:
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
    hypothesis: str | None = None,
    criterion: Criterion | Sequence[Criterion] | None = None,
    tags: Sequence[str] | None = None,
) -> RunResult:
    """Entry point of an experiment script: parse the flags (`python SCRIPT --prefix ... --dry-run`), then
    plan and run. Raises ExperimentFailedError (chained to the first step's error) if any step failed.

    `hypothesis`, `criterion` (a Criterion or several) and `tags` declare what the experiment tests and how
    its verdict is decided (docs/notebook.md); each may instead be written in the script's docstring."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_flags(args)
    mode = CLI_MODE.get()
    doc = getattr(sys.modules.get("__main__"), "__doc__", None)
    if mode in ("plan", "status"):  # `marin plan` checks the notebook against the DAG too
        return _report(steps, cfg, mode, declare(hypothesis, criterion, tags, doc))
    if mode == "describe":
        return _describe(steps, cfg, issue)
    try:
        result = run_experiment(steps, dataclasses.replace(cfg, issue=cfg.issue or issue),
                                description=description, publishers=publishers, args=args,
                                hypothesis=hypothesis, criterion=criterion, tags=tags, script_doc=doc)
    except KeyboardInterrupt:  # the executor already recorded the running steps PREEMPTED: one line, no trace
        print("interrupted (Ctrl-C): running steps were recorded PREEMPTED and their leases released; run "
              "the same command again to resume them", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
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


DESCRIBED: contextvars.ContextVar[list[Described] | None] = contextvars.ContextVar(
    "marin_described", default=None)


def _describe(steps: Sequence[Step], cfg: ExecutorMainConfig, issue: str | None) -> RunResult:
    # no raw input is read: the experiment id leaves their fingerprints out (dag.Graph.experiment_hash), so
    # it is the one the run will have, and a submit never needs the driver's access to its inputs
    graph = build_graph(steps)
    script = script_path()
    experiment_id = f"{script_stem(script)}-{graph.experiment_hash[:8]}"
    issue = cfg.issue or issue  # the run's own rule (`executor_main`): the --issue flag wins
    ref = (IssueRef.parse(issue) if issue else None) or IssueRef.from_script(script)
    sink = DESCRIBED.get()
    if sink is not None:
        sink.append(Described(experiment_id, str(ref) if ref else None, cfg.resolved_prefix(),
                              len(graph.nodes)))
    empty = Plan(cfg.resolved_prefix(), [], [], 0)
    return RunResult("", experiment_id, cfg.resolved_prefix(), "DESCRIBE", empty, {}, [], [], "")


def _report(steps: Sequence[Step], cfg: ExecutorMainConfig, mode: str, notebook: Notebook) -> RunResult:
    prefix = normalize_prefix(cfg.resolved_prefix())
    graph = build_graph(steps, RawInputs(prefix, cfg.raw_inputs))
    freeze(notebook, graph)  # the definition errors `run` would raise
    check_configs(graph, prefix)
    storage = storage_for(prefix)
    plan = make_plan(graph, prefix, storage, run_only=cfg.run_only, force_run_failed=cfg.force_run_failed,
                     force_run=cfg.force_run)
    experiment_id = f"{script_stem(script_path())}-{graph.experiment_hash[:8]}"
    if mode == "plan":
        print(json.dumps({"experiment": experiment_id, **plan.to_json()}, indent=1) if cfg.format == "json"
              else plan.table())
    else:
        rows, spans = _status_rows(storage, plan)
        goodput = interruptions.experiment_goodput(spans)
        if cfg.format == "json":
            doc = {"experiment": experiment_id, "prefix": prefix, "steps": rows, "goodput": goodput}
            print(json.dumps(doc, indent=1))
        else:
            print(f"experiment {experiment_id} under {prefix}:")
            for r in rows:
                err = r["error"] or {}
                extra = f"  {err.get('type')}: {err.get('message')}" if err else ""
                print(f"  {str(r['status'] or 'NOT RUN'):<10} {r['name']} {r['hash'][:8]}{extra}")
                if r.get("damaged") or r.get("lost") or r.get("waiting"):
                    print(f"             {r['damaged'] or r['lost'] or r['waiting']}")
                for line in interruptions.ledger_lines({"interruptions": r["interruptions"]}):
                    print(f"             {line}")
            print(f"goodput {goodput['goodput']:.3f} ({goodput['time_lost_s']:.1f} s lost to interruptions "
                  f"of {goodput['wall_s']:.1f} s)")
            verdict = (verdicts.read_verdicts(storage, prefix, experiment_id) or {}).get("current")
            print(f"verdict: {verdicts.plain_words(verdict) if verdict else 'none recorded'}")
    return RunResult("", experiment_id, prefix, f"{mode.upper()}", plan, {}, [], [], "")


UNREADABLE = "UNREADABLE"  # `marin status` of a step whose status.json cannot be read (status/damaged.py)


def _status_rows(storage: Storage, plan: Plan) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """`marin status`'s row per step and its (wall, lost) span for goodput; a step whose status.json cannot
    be read is UNREADABLE with the message naming the file and the fix, never NOT RUN. The statuses are the
    ones the plan just read (each entry's `previous`, in one batch there): not read a second time."""
    rows: list[dict[str, Any]] = []
    spans = []
    for e in plan.entries:
        # a damaged step.json alone is named by the plan (its entry's warning): shown on the step's row too
        step_json = f"{sf.step_json_path(e.output_path)} cannot be read"
        damage = next((w for w in e.warnings if w.startswith(step_json)), None)
        current = e.previous or {}
        if current.get("_damaged"):  # plan.damaged_status: the message naming the file and the fix
            current, damage = {"status": UNREADABLE}, str(current["_damaged"])
        ledger: dict[str, Any] = {"interruptions": []}
        if interruptions.was_interrupted(current):
            ledger = interruptions.read_ledger(storage, e.output_path)
        spans.append(interruptions.step_wall_and_lost(current, ledger))
        rows.append({"name": e.name, "hash": e.hash, "output_path": e.output_path,
                     "status": current.get("status"), "attempt": current.get("attempt"),
                     "updated": current.get("updated"), "error": current.get("error"),
                     "interruptions": ledger["interruptions"], "damaged": damage,
                     "waiting": current.get("waiting"),
                     "lost": _executor_lost(storage, e.output_path) if current.get("status") == sf.RUNNING
                     else None})
    return rows, spans


def _executor_lost(storage: Storage, output_path: str) -> str | None:
    """For a step recorded RUNNING: why its executor is lost (its lease is gone or stale, or its process is
    provably gone), else None. `marin status` only says so; the next run records the interruption."""
    text = storage.read_text(sf.lease_path(output_path))
    lease = LeaseInfo.parse(text) if text else None
    why = lease.lost(time.time()) if lease is not None else "it holds no lease"
    if why is None:
        return None
    owner = lease.owner if lease is not None else "of this attempt"
    return (f"its executor {owner} is lost ({why}): the attempt is not running; the next run takes it over "
            "and records the interruption")
