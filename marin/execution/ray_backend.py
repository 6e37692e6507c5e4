"""The `ray` backend: each attempt is a Ray task carrying the step's resources and env.

Without an address (`--ray-address` / `RAY_ADDRESS`) it starts an embedded Ray (no dashboard, a bounded
object store); with one, it joins that cluster. Before anything is submitted, every request is compared with
the nodes' total resources: a request that no single node can satisfy is an error naming the step and the
missing resource, instead of a task pending forever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from marin.definition.step import Resources
from marin.execution import causes
from marin.execution.attempt import HOST, AttemptResult, Outcome, Task, Wire, results_from_wire
from marin.execution.attempt_pickle import dumps_with_table, from_main, loads_with_table, table_for
from marin.execution.backend import AttemptDone, Completions, Waiting
from marin.execution.gang import _KV, GangPlan, submit_gang
from marin.execution.gang_wait import GangWaits
from marin.execution.resources import check_feasible, ray_task_options
from marin.execution.worker import execute_step

OBJECT_STORE_BYTES = int(os.environ.get("MARIN_RAY_OBJECT_STORE_MB", "256")) * 2**20


def _code_paths() -> list[str]:
    """Directories on this driver's sys.path that hold project code (not the standard library or packages)."""
    out = []
    for p in [os.getcwd(), *sys.path]:
        p = os.path.abspath(p or os.getcwd())
        if (os.path.isdir(p) and "site-packages" not in p and not p.startswith(sys.base_prefix)
                and p not in out):
            out.append(p)
    return out


def ensure_ray(address: str | None = None) -> bool:
    """Connect to (or start) Ray. Returns True if this call started it (so the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    pythonpath = os.pathsep.join([*_code_paths(), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if os.environ.get("MARIN_SUBMITTED") and os.environ.get("RAY_ADDRESS"):
        # A driver started by `marin submit`: the job's runtime env (working_dir, sealed environment) already
        # reaches every worker; a runtime_env here would replace it.
        ray.init(address=os.environ["RAY_ADDRESS"], namespace="marin", log_to_driver=False)
        return True
    if address:
        # Workers of a cluster do not inherit this process's environment: ship the code paths with the job.
        ray.init(address=address, namespace="marin", runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
                 log_to_driver=False)
    else:
        # An embedded Ray's workers inherit our environment; a job-level runtime_env would slow every worker
        # start (it goes through the runtime-env agent), so set PYTHONPATH directly instead.
        os.environ["PYTHONPATH"] = pythonpath
        # address="local": without it ray.init joins whatever cluster `ray start` last recorded in
        # /tmp/ray/ray_current_cluster (a stale or someone else's), instead of starting the embedded one.
        with _loopback_node():
            ray.init(address="local", include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                     namespace="marin", log_to_driver=False, configure_logging=False)
        from marin.execution import ray_watchdog

        ray_watchdog.start()  # ends Ray's agents too if this process is killed (they outlived it by minutes)
    return True


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
    """An embedded Ray is one node on this machine: give it the loopback address, as Ray itself does on macOS
    and Windows, instead of letting it probe 8.8.8.8 for the address other hosts would reach it on (on a
    machine without a route out, that probe fails and logs a `network_util.cc ... Failed to determine local
    IP via external connectivity` warning at every start). Ray decides this in `get_node_ip_address` from
    `ray_constants.ENABLE_RAY_CLUSTER`, read at call time; it is switched off only while this node starts
    (then the started node's address answers), and nothing is done on a Ray without that constant."""
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


ACCELERATORS = ("GPU", "TPU")


def uses_accelerator(resources: Resources) -> bool:
    """A GPU or TPU request: its worker process must not be reused for another step (`max_calls=1`), since
    JAX in it already holds the device (and a process cannot initialise jax.distributed twice)."""
    return bool(resources.num_gpus or resources.tpu) or any(
        k in ACCELERATORS or k.startswith("accelerator_type:") for k in resources.resources)


def ray_options(resources: Resources, env: dict[str, str]) -> dict[str, Any]:
    """A step task's options (`resources.ray_task_options`)."""
    if resources.tpu is not None:  # a single-host slice: one task with the slice's chips
        resources = resources.per_host()
    return ray_task_options(
        resources.num_cpus, resources.num_gpus, resources.memory, resources.resources, env
    )


# A Ray task's result, and each dependency result it is passed, travel as `AttemptResult.to_wire()` tuples:
# Ray pickles a task's return value with cloudpickle, which took ~25 us to dump the dataclass (its class and
# the enum's looked up each time) and ~10 us to load it, against ~7 and ~2 us for the tuple, on the worker,
# the driver and every attempt queued behind it.
def _run_attempt(payload: bytes, *dependencies: Wire) -> Wire:
    """A Ray task: one attempt whose function and config workers can import (see `_attempt`)."""
    return _attempt(payload, None, dependencies).to_wire()


def _run_script_attempt(payload: bytes, shared: tuple[Any, str], *dependencies: Wire) -> Wire:
    """A Ray task: one attempt that uses the run's table of script objects (see attempt_pickle)."""
    return _attempt(payload, shared, dependencies).to_wire()


def _attempt(payload: bytes, shared: tuple[Any, str] | None, wires: tuple[Wire, ...]) -> AttemptResult:
    dependencies = results_from_wire(wires)
    try:
        if shared is None:
            fn, config, log_path, env, record = pickle.loads(payload)
        else:  # the script's own functions and classes come from the run's table (see attempt_pickle)
            import ray

            table_ref, key = shared
            table = table_for(key, lambda: ray.get(table_ref))
            fn, config, log_path, env, record = loads_with_table(payload, table)
    except Exception as exc:  # e.g. the step's module is not importable on this node: failed, not preempted
        failure = AttemptResult.from_exception(
            exc, context="cannot load the step's function and config on this Ray worker", host=HOST)
        return dataclasses.replace(failure, message=f"{failure.message}. Fix: make the code importable on "
                                   "every node (PYTHONPATH or a runtime_env)")
    return execute_step(fn, config, log_path, env, record, *dependencies)


# Two task functions rather than one with an optional table argument: every top-level argument of a Ray task
# is serialized, stored and deserialized on its own, and a `None` placeholder cost ~50 us of CPU per task.
# Created once per process: Ray exports a remote function to each new job by itself, and re-creating it for
# every run cost ~4 ms (export and its collision check).
_REMOTES: dict[str, Any] = {}


def _remote_function(name: str) -> Any:
    """`plain` / `script`, and their `-once` variants for accelerator tasks: `max_calls=1` is accepted only
    by `ray.remote(...)`, not by `.options()`."""
    if name not in _REMOTES:
        import ray

        functions: dict[str, Callable[..., Wire]] = {"plain": _run_attempt, "script": _run_script_attempt}
        base, _, once = name.partition("-")
        _REMOTES[name] = ray.remote(max_calls=1)(functions[base]) if once else ray.remote(functions[base])
    return _REMOTES[name]


class _ResultWatcher:
    """Hands each submitted attempt's result (or Ray's error) to `deliver`, from one thread that waits on all
    pending references at once and fetches whatever finished in one batch.

    A per-reference completion callback (`ObjectRef._on_completed`) costs the driver ~0.1 ms of CPU per task
    on Ray's I/O thread, competing for the interpreter lock with the scheduling loop; batching saves most of
    it (a 1,000-step fan-out: 2.40 -> 2.17 CPU-s, 2.76x -> 2.55x raw Ray). A result is seen at once when it is
    the only one pending (or every pending one finished), otherwise within the current wait: `MIN_WAIT_S`
    while results keep coming, doubling while none do up to `MAX_WAIT_S`, so a long step does not make the
    thread poll a large DAG's references a hundred times a second. A call costs ~0.35 us of CPU per pending
    reference (3.4 ms for 10,000), so the wait is also at least `COST_FACTOR` times the last call's CPU: this
    thread never takes more than ~10% of a core, however many attempts are queued. An attempt queued behind
    another does not wait for this: Ray starts it by itself.
    """

    MIN_WAIT_S, MAX_WAIT_S, COST_FACTOR = 0.005, 0.1, 9.0
    MAX_FAILED_WAITS = 60  # consecutive failed waits (~1 min with back-off) before the attempts are failed

    def __init__(self, ray: Any, deliver: Callable[[Task, Any], None]) -> None:
        self.ray = ray
        self.deliver = deliver
        self._pending: dict[Any, Task] = {}
        self._changed = threading.Condition()
        self._closed = False
        self._wait_s = self.MIN_WAIT_S
        self._thread = threading.Thread(target=self._run, name="marin-ray-results", daemon=True)
        self._thread.start()

    def watch(self, ref: Any, task: Task) -> None:
        with self._changed:
            self._pending[ref] = task
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=2 * max(self._wait_s, self.MAX_WAIT_S) + 1)

    def _run(self) -> None:
        wait_s = self.MIN_WAIT_S
        failed_waits = 0
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                refs = list(self._pending)
            spent = 0.0
            try:
                before = time.thread_time()
                ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=wait_s, fetch_local=False)
                spent = time.thread_time() - before
                values = self._fetch(ready)
            except Exception as exc:
                if self._closed:
                    return
                failed_waits += 1
                if self.ray.is_initialized() and failed_waits < self.MAX_FAILED_WAITS:
                    # a passing error (e.g. an RPC to the GCS): the tasks still run, so wait for them again
                    print(f"marin: waiting for Ray results failed, retrying: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
                    wait_s = min(max(2 * wait_s, self.MIN_WAIT_S), 1.0)
                    time.sleep(wait_s)
                    continue
                # Ray is gone, or has failed for a minute: give up on these results (the attempts count as
                # preempted) rather than leave the run waiting forever
                ready, values = refs, [exc] * len(refs)
            failed_waits = 0
            wait_s = self.MIN_WAIT_S if ready else min(2 * wait_s, self.MAX_WAIT_S)
            wait_s = self._wait_s = max(wait_s, self.COST_FACTOR * spent)
            with self._changed:
                tasks = [self._pending.pop(ref) for ref in ready]
            for task, value in zip(tasks, values, strict=True):
                self.deliver(task, value)

    def _fetch(self, refs: list[Any]) -> list[Any]:
        """The values of finished references; a reference whose task failed at the Ray level gives its
        error."""
        if not refs:
            return []
        try:
            return list(self.ray.get(refs))
        except Exception:  # at least one of them is an error: fetch one by one to tell which
            values: list[Any] = []
            for ref in refs:
                try:
                    values.append(self.ray.get(ref))
                except Exception as exc:
                    values.append(exc)
            return values


def ray_failure(error: BaseException, log_path: str) -> AttemptResult:
    """A task that Ray reports as failed (its worker or node went away): an interruption, except a worker the
    memory monitor killed, which is an `oom` failure (causes.py)."""
    kind = causes.error_kind(error)
    if kind is causes.MemberEnd.OOM:
        result = AttemptResult.from_exception(error, outcome=Outcome.FAILED, log_path=log_path,
                                              cause=causes.OOM)
        return dataclasses.replace(result, message=f"killed for running out of memory: {result.message}. "
                                   "Fix: "
                                   "ask for more memory (Resources(memory=...)) or use less")
    cause = causes.NODE_DIED if kind is causes.MemberEnd.NODE else causes.PREEMPTED
    return AttemptResult.from_exception(error, outcome=Outcome.PREEMPTED, log_path=log_path, cause=cause)


class RayBackend:
    name = "ray"
    queues_behind_dependencies = True  # an attempt may be submitted with its dependencies' results as args

    def __init__(self, completions: Completions, address: str | None = None) -> None:
        import ray

        self.ray: Any = ray  # Ray's API is unannotated
        self.completions = completions
        self.owns_ray = ensure_ray(address)
        self._checked_options: set[tuple[Any, ...]] = set()
        self._refs: dict[str, Any] = {}
        # by value what the workers cannot import (a script's __main__)
        self._pickle: Callable[[Any], bytes] = ray.cloudpickle.dumps
        # the script's own functions and classes, shipped once (attempt_pickle)
        self._table: dict[str, Any] = {}
        self._table_ref: tuple[Any, str] | None = None
        self._table_size = 0
        self._results = _ResultWatcher(ray, self._done)
        self._gangs: set[str] = set()  # keys whose attempt is a gang supervisor
        # gangs waiting for hosts, reported to the executor (gang_wait.py)
        self._gang_waits = GangWaits(_KV, lambda key, attempt, text: completions.put(
            Waiting(key, attempt, text)))

    def check_resources(self, tasks: Sequence[tuple[str, Resources]]) -> None:
        nodes = [
            {k: float(v) for k, v in n.get("Resources", {}).items()}
            for n in self.ray.nodes() if n.get("Alive")
        ]
        check_feasible(tasks, nodes, "lower the step's resources, or add a node that has them "
                       "(e.g. ray start --resources=...)")

    def submit(self, task: Task) -> None:
        options = ray_options(task.resources, task.env)
        options["name"] = f"{task.name}:{task.key[:8]}:attempt-{task.attempt}"
        # Ray starts the task once the attempts it is queued behind have returned, passing their result dicts.
        after = [self._refs[k] for k in task.after]
        try:
            # The attempt travels as one pickled blob (bytes pass through Ray's serializer without a second
            # pickling), then the dependency references, which must be top-level arguments for Ray to wait for
            # them and pass their values.
            payload, shared = self._payload(task.payload())
        except Exception as exc:  # e.g. an unpicklable config value: the step fails, the run goes on
            failure = AttemptResult.from_exception(exc, context="cannot send the step to a Ray worker",
                                                   log_path=task.log_path)
            ref = self.ray.put(failure.to_wire())  # attempts queued behind this one see a failed dependency
        else:
            # `shared` holds the table's reference inside a tuple, so Ray does not resolve it for every task:
            # a worker fetches the table only the first time it sees it.
            if task.resources.is_gang:  # several hosts at once: a gang supervisor (gang.py)
                ref = submit_gang(self.ray, GangPlan.of(task.resources), payload, shared,
                                  name=options["name"], log_path=task.log_path, env=task.env, after=after)
                self._gangs.add(task.key)
                self._gang_waits.add(task.key, options["name"], task.attempt)
            else:
                function = "plain" if shared is None else "script"
                if uses_accelerator(task.resources):
                    function += "-once"
                ref = self._submit(function, options, (payload, *after) if shared is None
                                   else (payload, shared, *after))
        self._refs[task.key] = ref
        self._results.watch(ref, task)

    def _payload(self, attempt: tuple[Any, ...]) -> tuple[bytes, tuple[Any, str] | None]:
        """The pickled attempt, and the reference to the table of script objects it uses (None if none)."""
        fn, config = attempt[0], attempt[1]
        if not (from_main(fn) or from_main(type(config))):
            return self._pickle(attempt), None
        known = len(self._table)
        try:
            payload = dumps_with_table(attempt, self._table)
            if len(self._table) != self._table_size:  # new script objects: ship the grown table once
                ref = self.ray.put(self._pickle(self._table))
                self._table_ref, self._table_size = (ref, ref.hex()), len(self._table)
        except Exception:  # keep what this attempt added out of the table, so later attempts are unaffected
            for token in list(self._table)[known:]:
                del self._table[token]
            raise
        return payload, self._table_ref

    def _submit(self, function: str, options: dict[str, Any], args: tuple[Any, ...]) -> Any:
        """`.options(**options).remote(*args)`, without re-validating options already seen (~50 us per task).

        `.options()` validates the options and builds a wrapper class on every call; a fan-out of a thousand
        steps with the same resources needs that once. Options carrying a runtime_env (a step's `env`) always
        take the public path, which also prepares the runtime environment.
        """
        remote = _remote_function(function)
        if "runtime_env" in options:
            return remote.options(**options).remote(*args)
        key = (function, *sorted((k, repr(v)) for k, v in options.items() if k != "name"))
        if key not in self._checked_options:
            ref = remote.options(**options).remote(*args)  # validates; raises on a bad option
            self._checked_options.add(key)
            return ref
        # RemoteFunction._remote is what `.options(...).remote` calls with the merged, validated options.
        return remote._remote(args=args, kwargs=None, **options)

    def forget(self, key: str) -> None:
        """The executor handled `key`'s result: nothing will be queued behind this attempt any more."""
        self._refs.pop(key, None)

    def _done(self, task: Task, value: Any) -> None:
        # a Ray-level failure (node died, task cancelled) means the attempt did not finish
        if isinstance(value, BaseException):
            result = ray_failure(value, task.log_path)
        else:
            result = AttemptResult.from_wire(value)
        self._gangs.discard(task.key)
        self._gang_waits.discard(task.key)
        self.completions.put(AttemptDone(task.key, task.attempt, result))

    def cancel(self, key: str) -> None:
        ref = self._refs.get(key)
        if ref is not None:
            # a gang's supervisor is cancelled gently (KeyboardInterrupt): its `finally` cancels the members
            # and removes the placement group; a forced cancel would kill it before that
            self.ray.cancel(ref, force=key not in self._gangs)

    def shutdown(self) -> None:
        for key in list(self._refs):
            self.cancel(key)
        self._results.close()
        self._gang_waits.close()
        if self.owns_ray:
            self.ray.shutdown()
