"""The executor: runs a plan's steps on a backend, holding a lease for each step it runs.

One thread runs the scheduling loop; backends report finished attempts through a queue, so a step starts the
moment its last dependency succeeds (no polling of running steps). On a backend that can queue an attempt
behind other attempts (Ray: the dependencies' result references are the task's arguments), a step is
submitted as soon as all its dependencies are running or done, under its own lease, and starts the moment
they finish without a round trip through this loop; if one of them fails, the queued attempt does not call the
step function and reports `skipped`. Steps held by another executor's live lease are polled with backoff until
they succeed (their result is reused), fail, or their lease goes stale (it is taken over and the takeover
recorded). Status files are written only under a lease this executor holds: RUNNING and SUCCESS by the
worker running the attempt (see worker.py), failures, retries and DEP_FAILED by this loop; the terminal
status is written before the lease is released (after SUCCESS, by the worker).
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from marin.definition.identity import resolve
from marin.definition.step import Resources, Step
from marin.errors import StepFailedError
from marin.execution.attempt import AttemptResult, Outcome, StepRecord, Task
from marin.execution.backend import AttemptDone, Backend, Completions, LeaseLost, Message, RunOnLoop
from marin.graph.dag import Graph, Node
from marin.graph.plan import BLOCKED, FAILED_ACTION, RUN, SKIP, WAIT, Plan, PlanEntry
from marin.status import files as sf
from marin.status.stepinfo import step_info
from marin.storage.fs import Storage
from marin.storage.lease import LeaseManager

POLL_MIN_S, POLL_MAX_S = 0.05, 2.0
# A step with more dependencies than this is not queued behind running ones; it is submitted once they all
# succeeded. Ray hands a queued attempt every dependency's result as an argument: for the sink of a 1,000-step
# fan-out that is 998 results to collect and ship, which took ~20 ms after the last one finished, against one
# trip through this loop (~1 ms).
QUEUE_BEHIND_MAX_DEPENDENCIES = 16


@dataclasses.dataclass
class StepState:
    """What this run knows about one step; the source of the publishers' StepView."""

    entry: PlanEntry
    node: Node
    status: str | None  # None: not started by this run yet
    attempt: int = 0
    started: float | None = None
    ended: float | None = None
    error: dict[str, Any] | None = None
    note: str = ""
    unmet: int = 0
    poll_s: float = POLL_MIN_S
    next_poll: float = 0.0
    previous: dict[str, Any] | None = None
    failure: StepFailedError | None = None
    config: Any = None  # the resolved config of the current attempt
    queued: bool = False  # submitted behind dependencies that have not succeeded yet (shown as WAITING)
    deferred: tuple[int, AttemptResult] | None = None  # its result, held until those dependencies are handled

    @property
    def path(self) -> str:
        return self.entry.output_path


@dataclasses.dataclass
class RunContextInfo:
    run_id: str
    executor_id: str
    experiment_id: str
    issue: str | None
    prefix: str
    provenance: dict[str, Any]


class Executor:
    def __init__(
        self,
        graph: Graph,
        plan: Plan,
        storage: Storage,
        backend: Backend,
        completions: Completions,
        ctx: RunContextInfo,
        *,
        max_concurrent: int,
        lease_timeout_s: float,
        on_transition: Callable[[], None] = lambda: None,
        on_idle: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.graph = graph
        self.plan = plan
        self.storage = storage
        self.backend = backend
        self.completions = completions
        self.ctx = ctx
        self.max_concurrent = max(1, max_concurrent)
        self.on_transition = on_transition
        self.on_idle = on_idle  # called before the loop waits; returns when to be called again (s), or None
        self.leases = LeaseManager(storage, ctx.executor_id, lease_timeout_s,
                                   on_lost=lambda path: completions.put(LeaseLost(path)))
        self.states: dict[str, StepState] = {}
        self._by_lease: dict[str, str] = {}
        self._dependents: dict[str, list[str]] = {}
        self.ready: deque[str] = deque()
        self.running: set[str] = set()
        self.waiting: set[str] = set()
        self.queue_behind = bool(backend.queues_behind_dependencies)
        self._eager: deque[str] = deque()  # launched steps whose dependents may be queued behind them
        self._resume: deque[tuple[str, int, AttemptResult, bool]] = deque()  # deferred results now ready to handle

    # ----- set-up -------------------------------------------------------------------------------------
    def _init_states(self) -> None:
        status_of = {SKIP: sf.SUCCESS, FAILED_ACTION: sf.FAILED, BLOCKED: sf.DEP_FAILED}
        for e in self.plan.entries:
            assert e.node is not None
            st = StepState(e, e.node, status_of.get(e.action), previous=e.previous)
            if e.action == SKIP:
                st.note = "reused" if e.previous else "not needed"
            elif e.action in (FAILED_ACTION, BLOCKED):
                st.note = e.reason
            self.states[e.hash] = st
            self._by_lease[sf.lease_path(e.output_path)] = e.hash
        for key, st in self.states.items():
            for dep in st.node.deps:
                dst = self.states.get(dep.hash)
                if dst is not None and dst.status != sf.SUCCESS:
                    st.unmet += 1
                    self._dependents.setdefault(dep.hash, []).append(key)
        for key, st in self.states.items():
            if st.entry.action in (RUN, WAIT) and st.unmet == 0:
                self.ready.append(key)
        self.on_transition()  # the first view: reused steps SUCCESS, the rest WAITING

    # ----- main loop ----------------------------------------------------------------------------------
    def run(self) -> dict[str, StepState]:
        self._init_states()
        try:
            self._loop()
        except BaseException:
            self._abort()
            raise
        finally:
            self.leases.stop()
        return self.states

    def _loop(self) -> None:
        while True:
            while self._resume or self._eager or (self.ready and len(self.running) < self.max_concurrent):
                if self._resume:
                    self._finished(*self._resume.popleft())
                elif self.ready and len(self.running) < self.max_concurrent:
                    self._try_start(self.ready.popleft())
                else:
                    self._queue_dependents(self._eager.popleft())
            if not self.running and not self.waiting and not self.ready:
                return
            timeout = None
            if self.waiting:
                timeout = max(0.0, min(self.states[k].next_poll for k in self.waiting) - time.time())
            again = self.on_idle() if self.completions.empty() else None
            if again is not None:
                timeout = again if timeout is None else min(timeout, again)
            try:
                item = self.completions.get(timeout=timeout)
                self._handle(item)
                while True:
                    self._handle(self.completions.get_nowait())
            except queue.Empty:
                pass
            now = time.time()
            for key in [k for k in self.waiting if self.states[k].next_poll <= now]:
                self._poll_waiting(key)

    def _handle(self, message: Message) -> None:
        if isinstance(message, AttemptDone):
            self._finished(message.key, message.attempt, message.result)
        elif isinstance(message, RunOnLoop):  # a backend's work that must run on this thread (local forks)
            message.call()
        else:
            key = self._by_lease.get(message.lease_path)
            if key is not None and key in self.running and not self._released_by_worker(key):
                self.backend.cancel(key)
                st = self.states[key]
                st.note = "lease lost to another executor; its result will be used"
                st.queued, st.deferred = False, None
                self.running.discard(key)
                self._wait_for_other(key)

    def _released_by_worker(self, key: str) -> bool:
        """True if the lease the heartbeat found gone was released by the worker of our current attempt after
        it wrote SUCCESS: not a lost lease - the attempt's result is on its way."""
        st = self.states[key]
        current = sf.read_status(self.storage, st.path) or {}
        return (current.get("status") == sf.SUCCESS and current.get("attempt") == st.attempt
                and current.get("run_id") == self.ctx.run_id and current.get("executor") == self.ctx.executor_id)

    def _queue_dependents(self, key: str) -> None:
        """`key` was just launched: submit each dependent whose dependencies are now all running or done, so the
        backend starts it the moment they finish."""
        for user in self._dependents.get(key, ()):
            ust = self.states[user]
            if (ust.status is None and ust.entry.action in (RUN, WAIT) and len(self.running) < self.max_concurrent
                    and self._startable(user)):
                self._try_start(user)

    def _startable(self, key: str) -> bool:
        """Every dependency succeeded, or (on a backend that queues, for a step with at most
        QUEUE_BEHIND_MAX_DEPENDENCIES of them) is running in this executor."""
        deps = self.states[key].node.deps
        queue_behind = self.queue_behind and len(deps) <= QUEUE_BEHIND_MAX_DEPENDENCIES
        for dep in deps:
            dst = self.states.get(dep.hash)
            if dst is not None and dst.status != sf.SUCCESS and not (queue_behind and dep.hash in self.running):
                return False
        return True

    # ----- starting -----------------------------------------------------------------------------------
    def _try_start(self, key: str) -> None:
        st = self.states[key]
        lease = sf.lease_path(st.path)
        prev = sf.read_status(self.storage, st.path) if st.entry.action == WAIT or st.status else st.previous
        acquired = self.leases.try_acquire(lease, attempt=int((prev or {}).get("attempt") or 0) + 1)
        if not acquired.ok:
            holder = acquired.holder.owner if acquired.holder else "another executor"
            st.note = f"waiting for executor {holder}"
            self._wait_for_other(key)
            return
        # Between our plan and our lease another executor may have finished it: re-read under the lease.
        current = sf.read_status(self.storage, st.path)
        if current and current.get("status") == sf.SUCCESS:
            self.leases.release(lease)
            self._succeeded(key, note="finished by another executor")
            return
        if (current and current.get("status") == sf.FAILED
                and current.get("updated") != (st.entry.previous or {}).get("updated")):
            # another executor ran it and it failed since we planned: that counts as this run's failure too
            self.leases.release(lease)
            err = current.get("error") or {}
            self._failed(key, {"type": err.get("type", sf.FAILED), "message": f"failed in executor "
                               f"{current.get('executor')}: {err.get('message')}", "traceback": ""})
            return
        st.previous = current
        st.attempt = int((current or {}).get("attempt") or 0)
        if acquired.previous_owner:
            sf.append_event(self.storage, st.path, sf.LEASE_TAKEOVER, attempt=st.attempt + 1, run_id=self.ctx.run_id,
                            executor=self.ctx.executor_id, previous_owner=acquired.previous_owner,
                            message=f"took over the stale lease of {acquired.previous_owner}")
        st.config = resolve(st.node.step.config, own_path=st.path, prefix=self.ctx.prefix, dep_path=self._step_path)
        self._launch(key, first=True)
        if self.queue_behind:
            self._eager.append(key)

    def _node_path(self, node: Node) -> str:
        st = self.states.get(node.hash)
        return st.path if st is not None else node.output_path(self.ctx.prefix)

    def _step_path(self, step: Step) -> str:
        return self._node_path(self.graph.node_of(step))

    def _launch(self, key: str, first: bool = False) -> None:
        """Submit an attempt, queued behind any dependency still running. Its worker writes step.json (first
        attempt of this run) and RUNNING when it starts, so the status says RUNNING only once it really runs."""
        st = self.states[key]
        st.attempt += 1
        after = tuple(d.hash for d in st.node.deps if d.hash in self.running)
        st.status, st.ended, st.error, st.queued = sf.RUNNING, None, None, bool(after)
        st.started = None if after else time.time()
        self.waiting.discard(key)
        step = st.node.step
        record = StepRecord(output_path=st.path, name=st.node.name, hash=key, attempt=st.attempt,
                            run_id=self.ctx.run_id, executor=self.ctx.executor_id,
                            created=(st.previous or {}).get("created"),
                            lease_acquired=self.leases.acquired_at(sf.lease_path(st.path)),
                            step_json=sf.json_text(step_info(st.node, st.path, st.config, self._node_path, self.ctx))
                            if first else None)
        self.running.add(key)
        self.backend.submit(Task(key=key, name=step.name, fn=step.fn, config=st.config,
                                 log_path=sf.log_path(st.path, st.attempt), env=dict(step.env),
                                 resources=Resources.coerce(step.resources), attempt=st.attempt, record=record, after=after))
        self.on_transition()

    # ----- waiting on another executor ------------------------------------------------------------------
    def _wait_for_other(self, key: str) -> None:
        st = self.states[key]
        changed = st.status != sf.WAITING
        if changed:
            st.status = sf.WAITING
            st.poll_s = POLL_MIN_S
        st.next_poll = time.time() + st.poll_s
        self.waiting.add(key)
        if changed:
            self.on_transition()

    def _poll_waiting(self, key: str) -> None:
        st = self.states[key]
        current = sf.read_status(self.storage, st.path)
        status = (current or {}).get("status")
        if status == sf.SUCCESS:
            self.waiting.discard(key)
            self._succeeded(key, note="reused the result of another executor")
            return
        # A failure written by the executor we waited for (not an old one that was already there when we planned)
        if (current and status in (sf.FAILED, sf.DEP_FAILED) and current.get("executor") != self.ctx.executor_id
                and current.get("updated") != (st.entry.previous or {}).get("updated")):
            self.waiting.discard(key)
            err = current.get("error") or {}
            self._failed(key, {"type": err.get("type", status), "message": f"failed in executor "
                               f"{current.get('executor')}: {err.get('message')}", "traceback": ""})
            return
        st.poll_s = min(st.poll_s * 1.5, POLL_MAX_S)  # back off: the holder may run for hours
        if len(self.running) < self.max_concurrent and self._startable(key):
            self.waiting.discard(key)
            self._try_start(key)  # acquires if the holder released or went stale; else back to waiting
            return
        st.next_poll = time.time() + st.poll_s

    # ----- finishing ----------------------------------------------------------------------------------
    def _finished(self, key: str, attempt: int, result: AttemptResult, was_queued: bool = False) -> None:
        st = self.states[key]
        if key not in self.running or attempt != st.attempt:
            return  # a cancelled attempt reporting late
        if st.queued:  # finished before this loop saw all its dependencies finish: handle it after them
            st.deferred = (attempt, result)
            return
        self.running.discard(key)
        self.backend.forget(key)
        lease = sf.lease_path(st.path)
        # An attempt that succeeded checked the lease itself before it wrote SUCCESS; otherwise check it here.
        if result.outcome is Outcome.LEASE_LOST or (not result.ok and not self.leases.holds(lease)):
            st.note = "lease lost while running; waiting for the executor that took it over"
            self._wait_for_other(key)
            return
        # A queued attempt that never called fn: it saw a failed attempt of a dependency that was then retried,
        # or Ray failed it because a dependency's task was cancelled. Not a failure of this step: submit again.
        # A Ray-level failure (worker died) does not say whether fn had started; the worker's RUNNING does.
        if result.outcome is Outcome.SKIPPED or (was_queued and not result.ok and result.started is None
                                                 and not self._attempt_started(st)):
            st.attempt -= 1
            self._launch(key, first=st.attempt == int((st.previous or {}).get("attempt") or 0))
            return
        if result.started:
            st.started = result.started
        if result.ok:  # the worker wrote SUCCESS (status and event) under our lease
            st.ended = result.ended or time.time()
            if result.lease_released:  # ... and then released the lease for us
                self.leases.forget(lease)
            else:
                self.leases.release(lease)
            self._succeeded(key, note="ran")
            return
        error: dict[str, Any] = result.error
        status = sf.PREEMPTED if result.outcome is Outcome.PREEMPTED else sf.FAILED
        sf.append_event(self.storage, st.path, status, attempt=st.attempt, run_id=self.ctx.run_id,
                        executor=self.ctx.executor_id, message=f"{error['type']}: {error['message']}")
        if st.attempt - int((st.previous or {}).get("attempt") or 0) <= st.node.step.retries:
            self._launch(key)  # retry under the same lease, as a new attempt with its own log
            return
        st.ended = time.time()
        sf.write_status(self.storage, st.path, name=st.node.name, hash=key, status=status, attempt=st.attempt,
                        run_id=self.ctx.run_id, executor=self.ctx.executor_id, previous=st.previous,
                        started=st.started, ended=st.ended, error=error)
        self.leases.release(lease)
        self._failed(key, error, status=status, exc_pickle=result.exception)

    def _attempt_started(self, st: StepState) -> bool:
        """True if the worker of `st`'s current attempt wrote RUNNING, i.e. the attempt really started."""
        current = sf.read_status(self.storage, st.path) or {}
        return (current.get("status") == sf.RUNNING and current.get("attempt") == st.attempt
                and current.get("run_id") == self.ctx.run_id)

    def _succeeded(self, key: str, note: str) -> None:
        st = self.states[key]
        st.status, st.note = sf.SUCCESS, note
        for user in self._dependents.get(key, ()):
            ust = self.states[user]
            ust.unmet -= 1
            if ust.unmet == 0 and ust.status is None:
                self.ready.append(user)
            elif ust.unmet == 0 and ust.queued:  # its queued attempt starts (or started) now
                ust.queued, ust.started = False, time.time()
                if ust.deferred is not None:
                    self._resume.append((user, *ust.deferred, True))
                    ust.deferred = None
        self.on_transition()

    def _failed(self, key: str, error: dict[str, Any], *, status: str = sf.FAILED,
                exc_pickle: bytes | None = None) -> None:
        st = self.states[key]
        st.status, st.error = status, error
        st.ended = st.ended or time.time()
        log = sf.log_path(st.path, st.attempt) if st.attempt else None
        failure = StepFailedError(st.node.name, key, st.path, log, f"{error.get('type')}: {error.get('message')}")
        if exc_pickle:
            import pickle

            try:
                failure.__cause__ = pickle.loads(exc_pickle)
            except Exception as e:  # the original exception class is not importable here
                failure.__cause__ = e
        st.failure = failure
        self._dep_failed_below(key)
        self.on_transition()

    def _dep_failed_below(self, failed_key: str) -> None:
        """Mark every not-yet-started step downstream of `failed_key` DEP_FAILED (they will not run)."""
        failed = self.states[failed_key]
        stack = list(self._dependents.get(failed_key, ()))
        while stack:
            key = stack.pop()
            st = self.states[key]
            held = st.queued and key in self.running  # queued behind the failure: it never called fn
            if st.status is not None and not held:
                continue
            if held:
                self.backend.cancel(key)
                self.running.discard(key)
                st.queued, st.deferred, st.attempt = False, None, st.attempt - 1
            st.status, st.note = sf.DEP_FAILED, f"dependency {failed.node.name} failed"
            st.error = {"type": "DependencyFailed", "message": f"dependency {failed.node.name} failed",
                        "dependency": f"{failed.node.name}-{failed_key[:8]}"}
            self._write_dep_failed(st, held=held)
            stack.extend(self._dependents.get(key, ()))

    def _write_dep_failed(self, st: StepState, held: bool = False) -> None:
        lease = sf.lease_path(st.path)
        attempt = int((st.previous or {}).get("attempt") or 0)
        if not held and not self.leases.try_acquire(lease, attempt=attempt).ok:
            return  # another executor is running it: its status is that executor's to write
        try:
            # step.json too: it records the identity, which later plans use to explain what changed
            config = resolve(st.node.step.config, own_path=st.path, prefix=self.ctx.prefix, dep_path=self._step_path)
            sf.write_json(self.storage, sf.step_json_path(st.path),
                          step_info(st.node, st.path, config, self._node_path, self.ctx))
            sf.write_status(self.storage, st.path, name=st.node.name, hash=st.entry.hash, status=sf.DEP_FAILED,
                            attempt=attempt, run_id=self.ctx.run_id, executor=self.ctx.executor_id,
                            previous=st.previous, ended=time.time(), error=st.error)
            sf.append_event(self.storage, st.path, sf.DEP_FAILED, attempt=attempt, run_id=self.ctx.run_id,
                            executor=self.ctx.executor_id, message=st.error["message"] if st.error else "")
        finally:
            self.leases.release(lease)

    def _abort(self) -> None:
        """Interrupted (Ctrl-C, SIGTERM): stop running attempts and record them PREEMPTED."""
        for key in list(self.running):
            st = self.states[key]
            self.backend.cancel(key)
            lease = sf.lease_path(st.path)
            if st.queued and self.leases.holds(lease):  # it never started: nothing to record
                self.leases.release(lease)
                st.status, st.queued = None, False
                continue
            if self.leases.holds(lease):
                sf.write_status(self.storage, st.path, name=st.node.name, hash=key, status=sf.PREEMPTED,
                                attempt=st.attempt, run_id=self.ctx.run_id, executor=self.ctx.executor_id,
                                previous=st.previous, started=st.started, ended=time.time(),
                                error={"type": "Interrupted", "message": "the executor was interrupted",
                                       "traceback": ""})
                sf.append_event(self.storage, st.path, sf.PREEMPTED, attempt=st.attempt, run_id=self.ctx.run_id,
                                executor=self.ctx.executor_id, message="executor interrupted")
                self.leases.release(lease)
            st.status = sf.PREEMPTED
        self.running.clear()
