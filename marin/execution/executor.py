"""The executor: runs a plan's steps on a backend, holding a lease for each step it runs.

One thread runs the scheduling loop; backends report finished attempts through a queue, so a step starts the
moment its last dependency succeeds (no polling of running steps). Steps held by another executor's live
lease are polled with backoff until they succeed (their result is reused), fail, or their lease goes stale
(it is taken over and the takeover recorded). Only this loop writes status files, and only for steps whose
lease it holds; the terminal status is written before the lease is released.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from marin.definition.identity import resolve
from marin.definition.step import Step
from marin.errors import StepFailedError
from marin.execution.local_backend import Task
from marin.graph.dag import Graph, Node
from marin.graph.plan import BLOCKED, FAILED_ACTION, RUN, SKIP, WAIT, Plan, PlanEntry
from marin.status import files as sf
from marin.status.stepinfo import step_info
from marin.storage.fs import Storage
from marin.storage.lease import LeaseManager

POLL_MIN_S, POLL_MAX_S = 0.05, 2.0


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
        backend: Any,
        completions: queue.Queue[tuple[Any, ...]],
        ctx: RunContextInfo,
        *,
        max_concurrent: int,
        lease_timeout_s: float,
        on_transition: Callable[[], None] = lambda: None,
    ) -> None:
        self.graph = graph
        self.plan = plan
        self.storage = storage
        self.backend = backend
        self.completions = completions
        self.ctx = ctx
        self.max_concurrent = max(1, max_concurrent)
        self.on_transition = on_transition
        self.leases = LeaseManager(storage, ctx.executor_id, lease_timeout_s,
                                   on_lost=lambda path: completions.put(("lost", path)))
        self.states: dict[str, StepState] = {}
        self._by_lease: dict[str, str] = {}
        self._dependents: dict[str, list[str]] = {}
        self.ready: deque[str] = deque()
        self.running: set[str] = set()
        self.waiting: set[str] = set()

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
            while self.ready and len(self.running) < self.max_concurrent:
                self._try_start(self.ready.popleft())
            if not self.running and not self.waiting and not self.ready:
                return
            timeout = None
            if self.waiting:
                timeout = max(0.0, min(self.states[k].next_poll for k in self.waiting) - time.time())
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

    def _handle(self, item: tuple[Any, ...]) -> None:
        if item[0] == "done":
            _, key, attempt, result = item
            self._finished(key, attempt, result)
        elif item[0] == "lost":
            key = self._by_lease.get(item[1])
            if key is not None and key in self.running:
                self.backend.cancel(key)
                st = self.states[key]
                st.note = "lease lost to another executor; its result will be used"
                self.running.discard(key)
                self._wait_for_other(key)

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

    def _node_path(self, node: Node) -> str:
        st = self.states.get(node.hash)
        return st.path if st is not None else node.output_path(self.ctx.prefix)

    def _step_path(self, step: Step) -> str:
        return self._node_path(self.graph.node_of(step))

    def _launch(self, key: str, first: bool = False) -> None:
        """Record RUNNING, submit the attempt, then write the rest of the bookkeeping (step.json, the event)
        while it runs. So the status says RUNNING before the function starts, and everything lands before this
        loop handles the attempt's completion."""
        st = self.states[key]
        st.attempt += 1
        st.status, st.started, st.ended, st.error = sf.RUNNING, time.time(), None, None
        self.waiting.discard(key)
        sf.write_status(self.storage, st.path, name=st.node.name, hash=key, status=sf.RUNNING, attempt=st.attempt,
                        run_id=self.ctx.run_id, executor=self.ctx.executor_id, previous=st.previous,
                        started=st.started)
        step = st.node.step
        self.running.add(key)
        self.backend.submit(Task(key=key, name=step.name, fn=step.fn, config=st.config,
                                 log_path=sf.log_path(st.path, st.attempt), env=dict(step.env),
                                 resources=step.resources, attempt=st.attempt))
        if first:
            sf.write_json(self.storage, sf.step_json_path(st.path),
                          step_info(st.node, st.path, st.config, self._node_path, self.ctx))
        sf.append_event(self.storage, st.path, sf.RUNNING, attempt=st.attempt, run_id=self.ctx.run_id,
                        executor=self.ctx.executor_id)
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
        if len(self.running) < self.max_concurrent:
            self.waiting.discard(key)
            self._try_start(key)  # acquires if the holder released or went stale; else back to waiting
            return
        st.next_poll = time.time() + st.poll_s

    # ----- finishing ----------------------------------------------------------------------------------
    def _finished(self, key: str, attempt: int, result: dict[str, Any]) -> None:
        st = self.states[key]
        if key not in self.running or attempt != st.attempt:
            return  # a cancelled attempt reporting late
        self.running.discard(key)
        lease = sf.lease_path(st.path)
        if not self.leases.holds(lease):
            st.note = "lease lost while running; waiting for the executor that took it over"
            self._wait_for_other(key)
            return
        if result.get("ok"):
            st.ended = time.time()
            sf.write_status(self.storage, st.path, name=st.node.name, hash=key, status=sf.SUCCESS, attempt=st.attempt,
                            run_id=self.ctx.run_id, executor=self.ctx.executor_id, previous=st.previous,
                            started=st.started, ended=st.ended)
            sf.append_event(self.storage, st.path, sf.SUCCESS, attempt=st.attempt, run_id=self.ctx.run_id,
                            executor=self.ctx.executor_id)
            self.leases.release(lease)
            self._succeeded(key, note="ran")
            return
        error = {k: result.get(k) for k in ("type", "message", "traceback")}
        status = sf.PREEMPTED if result.get("preempted") else sf.FAILED
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
        self._failed(key, error, status=status, exc_pickle=result.get("exception"))

    def _succeeded(self, key: str, note: str) -> None:
        st = self.states[key]
        st.status, st.note = sf.SUCCESS, note
        for user in self._dependents.get(key, ()):
            ust = self.states[user]
            ust.unmet -= 1
            if ust.unmet == 0 and ust.status is None:
                self.ready.append(user)
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
            if st.status is not None:
                continue
            st.status, st.note = sf.DEP_FAILED, f"dependency {failed.node.name} failed"
            st.error = {"type": "DependencyFailed", "message": f"dependency {failed.node.name} failed",
                        "dependency": f"{failed.node.name}-{failed_key[:8]}"}
            self._write_dep_failed(st)
            stack.extend(self._dependents.get(key, ()))

    def _write_dep_failed(self, st: StepState) -> None:
        lease = sf.lease_path(st.path)
        attempt = int((st.previous or {}).get("attempt") or 0)
        if not self.leases.try_acquire(lease, attempt=attempt).ok:
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
