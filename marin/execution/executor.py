"""The executor: runs a plan's steps on a backend, holding a lease for each step it runs.

One thread runs the scheduling loop; backends report finished attempts through a queue (backend.py), so a
step starts the moment its last dependency succeeds (no polling of running steps). On a backend that can
queue an attempt behind other attempts (Ray: the dependencies' result references are the task's arguments),
a step is submitted as soon as all its dependencies are running or done, under its own lease, and starts the
moment they finish without a round trip through this loop; if one of them fails, the queued attempt does not
call the step function and reports SKIPPED. Steps held by another executor's live lease are polled with
backoff until they succeed (their result is reused), fail, or their lease goes stale (it is taken over and the
takeover recorded). Status files are written only under a lease this executor holds: RUNNING and SUCCESS by
the worker running the attempt (see worker.py), failures, retries and DEP_FAILED by this loop (records.py);
the terminal status is written before the lease is released (after SUCCESS, by the worker).

What is not scheduling lives beside it: a step's phases and their allowed changes (state.py), whether a bad
attempt is retried (retry.py), the leases by step (step_leases.py) and the records (records.py).

Why the file is past 400 lines: it is the one loop, and the loop's cases (queued attempts, waiting on other
executors, results arriving out of order, retries with a back-off after a preemption) share its state;
splitting them apart would spread one decision ("what runs next") over several files. Every function is short.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import pickle
import queue
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from marin.definition.step import Resources
from marin.errors import StepFailedError
from marin.execution.attempt import AttemptResult, Outcome, Task
from marin.execution.backend import (
    AttemptDone,
    Backend,
    Completions,
    Interrupted,
    LeaseTaken,
    Message,
    RunOnLoop,
    Waiting,
)
from marin.execution.gang_wait import waiting_line
from marin.execution.inputs import name_producer
from marin.execution.records import RunContextInfo, StepRecords
from marin.execution.retry import RetryPolicy
from marin.execution.state import PHASE_OF_STATUS, POLL_MIN_S, Board, Phase, StepState, recorded_attempt
from marin.execution.step_leases import StepLeases
from marin.graph.dag import Graph
from marin.graph.plan import BLOCKED, FAILED_ACTION, RUN, SKIP, WAIT, Plan
from marin.status import files as sf
from marin.storage.fs import Storage
from marin.storage.lease import Acquired

Taken = tuple[Acquired, dict[str, Any] | None]
"""A step's lease as `Executor._lease_io` tried to take it, and its status re-read once held."""

# A step with more dependencies than this is not queued behind running ones; it is submitted once they all
# succeeded. Ray hands a queued attempt every dependency's result as an argument: for the sink of a 1,000-step
# fan-out that is 998 results to collect and ship, which took ~20 ms after the last one finished, against one
# trip through this loop (~1 ms).
QUEUE_BEHIND_MAX_DEPENDENCIES = 16
LEASE_BATCH_THREADS = 32
"""Threads taking the leases of ready steps on an object store, off the loop's thread
(`Executor._start_ready`). Their names start with `marin-`: the engine's own threads, which do not stop the
local backend forking."""
RELEASE_WAIT_S = 10.0
"""How long an interrupted run waits for lease takes in flight before it gives up on releasing them."""
# How long the attempts of a Ray-backed executor may outlive its process: Ray ends a dead driver's workers
# within seconds; a same-machine taker waits this long after it first saw the owner's process gone.
ATTEMPTS_OUTLIVE_S = 15.0
_SETTLED = {SKIP: Phase.SUCCESS, FAILED_ACTION: Phase.FAILED, BLOCKED: Phase.DEP_FAILED}


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
        self.plan = plan
        self.backend = backend
        self.completions = completions
        self.max_concurrent = max(1, max_concurrent)
        self.on_transition = on_transition
        self.on_idle = on_idle  # called before the loop waits; returns when to be called again (s), or None
        self.board = Board()
        # a dead executor's local workers die with it; Ray's live until Ray notices (storage/lease.py)
        local = getattr(backend, "name", "") == "local"
        outlive_s = 0.0 if local else min(ATTEMPTS_OUTLIVE_S, lease_timeout_s)
        self.leases = StepLeases(storage, ctx, lease_timeout_s, completions, outlive_s)
        self.records = StepRecords(storage, ctx, graph, self.board.get)
        self.queue_behind = bool(backend.queues_behind_dependencies)
        self._dependents: dict[str, list[str]] = {}
        self._ready: deque[str] = deque()  # PENDING steps whose dependencies all succeeded
        self._eager: deque[str] = deque()  # launched steps whose dependents may be queued behind them
        self._resume: deque[tuple[str, int, AttemptResult, bool]] = deque()  # deferred results now to handle
        self._backoff: list[tuple[float, str, int]] = []  # (when, key, attempt): preempted, re-launched then
        self._ledger_open: set[str] = set()  # steps whose last interruption waits for the next attempt's end
        self._taking: dict[str, Future[Taken]] = {}  # ready steps whose leases are taken off this thread
        self._lease_pool: ThreadPoolExecutor | None = None  # those threads (object stores; made at need)

    @property
    def states(self) -> dict[str, StepState]:
        return self.board.states

    # ----- set-up -------------------------------------------------------------------------------------
    def _init_states(self) -> None:
        for e in self.plan.entries:
            assert e.node is not None
            st = StepState(e, e.node, _SETTLED.get(e.action, Phase.PENDING), previous=e.previous)
            if e.action == SKIP:
                st.note = "reused" if e.previous else "not needed"
            elif e.action in (FAILED_ACTION, BLOCKED):
                st.note = e.reason
            self.board.add(e.hash, st)
        for key, st in self.states.items():
            for dep in st.node.deps:
                dst = self.board.get(dep.hash)
                if dst is not None and dst.phase is not Phase.SUCCESS:
                    st.unmet += 1
                    self._dependents.setdefault(dep.hash, []).append(key)
        for key, st in self.states.items():
            if st.entry.action in (RUN, WAIT) and st.unmet == 0:
                self._ready.append(key)
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
            if self._lease_pool is not None:
                self._lease_pool.shutdown(wait=True)
            self.leases.stop()
        return self.states

    def _loop(self) -> None:
        running, waiting = self.board.running, self.board.waiting
        while True:
            while self._resume or self._eager or (self._ready and self._has_room()):
                if self._resume:
                    self._finished(*self._resume.popleft())
                elif self._ready and self._has_room():
                    self._start_ready()
                else:
                    self._queue_dependents(self._eager.popleft())
            if not running and not waiting and not self._ready and not self._taking:
                return
            timeout = None
            if waiting:
                timeout = max(0.0, min(self.board[k].next_poll for k in waiting) - time.time())
            if self._backoff:
                due = max(0.0, self._backoff[0][0] - time.time())
                timeout = due if timeout is None else min(timeout, due)
            again = self.on_idle() if self.completions.empty() else None
            if again is not None:
                timeout = again if timeout is None else min(timeout, again)
            try:
                self._handle(self.completions.get(timeout=timeout))
                while True:
                    self._handle(self.completions.get_nowait())
            except queue.Empty:
                pass
            now = time.time()
            for key in [k for k in waiting if self.board[k].next_poll <= now]:
                self._poll_waiting(key)
            while self._backoff and self._backoff[0][0] <= time.time():
                _, key, attempt = heapq.heappop(self._backoff)
                if key in running and self.board[key].attempt == attempt:  # still ours, not handled otherwise
                    self._launch(key)

    def _has_room(self) -> bool:
        return len(self.board.running) + len(self._taking) < self.max_concurrent

    def _handle(self, message: Message) -> None:
        if isinstance(message, AttemptDone):
            self._finished(message.key, message.attempt, message.result)
        elif isinstance(message, RunOnLoop):  # a backend's work that must run on this thread (local forks)
            message.call()
        elif isinstance(message, LeaseTaken):
            self._lease_taken(message)
        elif isinstance(message, Waiting):
            self._waiting(message)
        elif isinstance(message, Interrupted):  # Ctrl-C, raised here: run() records the running PREEMPTED
            raise KeyboardInterrupt
        else:
            self._lease_lost(message.lease_path)

    def _waiting(self, message: Waiting) -> None:
        """A gang attempt of this run waits for hosts (or no longer does): say so on the console and to the
        publishers (gang_wait.py)."""
        st = self.board.get(message.key)
        if st is None or message.key not in self.board.running or message.attempt != st.attempt:
            return
        print(waiting_line(st.node.name, st.attempt, message.text, st.waiting_since), file=sys.stderr,
              flush=True)
        st.waiting = message.text
        st.waiting_since = time.time() if message.text is not None else None
        self.on_transition()

    def _lease_lost(self, lease_path: str) -> None:
        key = self.leases.step_of(lease_path)
        if key is None or key not in self.board.running or self.leases.gone_after_success(self.board[key]):
            return
        self.backend.cancel(key)
        st = self.board[key]
        st.note = "lease lost to another executor; its result will be used"
        st.deferred = None
        self._wait_for_other(key)

    def _queue_dependents(self, key: str) -> None:
        """`key` was just launched: submit each dependent whose dependencies are now all running or done, so
        the backend starts it the moment they finish."""
        for user in self._dependents.get(key, ()):
            ust = self.board[user]
            if (ust.phase is Phase.PENDING and user not in self._taking and ust.entry.action in (RUN, WAIT)
                    and self._has_room() and self._startable(user)):
                self._try_start(user)

    def _startable(self, key: str) -> bool:
        """Every dependency succeeded, or (on a backend that queues, for a step with at most
        QUEUE_BEHIND_MAX_DEPENDENCIES of them) is running in this executor."""
        deps = self.board[key].node.deps
        queue_behind = self.queue_behind and len(deps) <= QUEUE_BEHIND_MAX_DEPENDENCIES
        for dep in deps:
            dst = self.board.get(dep.hash)
            if (dst is not None and dst.phase is not Phase.SUCCESS
                    and not (queue_behind and dep.hash in self.board.running)):
                return False
        return True

    # ----- starting -----------------------------------------------------------------------------------
    def _start_ready(self) -> None:
        """Start as many ready steps as there is room for. On local disk each is decided at once. On an
        object store their leases are taken, and their statuses re-read under them, by a pool of threads
        while this loop goes on: each takes two round trips, and taken on this thread they bounded a
        1,000-step run at 30 ms a request to about 65 s, the loop waiting on storage instead of handing out
        work. A step whose lease is being taken counts against `max_concurrent` like a running one; once
        taken (a `LeaseTaken` message), it is decided here (`_lease_taken`), exactly as one taken inline."""
        keys = [self._ready.popleft()
                for _ in range(min(len(self._ready), self.max_concurrent - len(self.board.running)
                                   - len(self._taking)))]
        if self.leases.storage.is_local:
            for key in keys:
                self._try_start(key)
            return
        if self._lease_pool is None:
            self._lease_pool = ThreadPoolExecutor(LEASE_BATCH_THREADS, thread_name_prefix="marin-lease-take")
        for key in keys:
            future = self._lease_pool.submit(self._lease_io, key)
            self._taking[key] = future
            future.add_done_callback(self._post_taken(key))

    def _post_taken(self, key: str) -> Callable[[Future[Taken]], None]:
        """What posts `key`'s taken lease (or what taking it raised) to the loop once its thread is done."""
        def post(future: Future[Taken]) -> None:
            if not future.cancelled():  # `_abort` cancelled it before it started: nothing was taken
                self.completions.put(LeaseTaken(key, future.exception() or future.result()))
        return post

    def _lease_taken(self, message: LeaseTaken) -> None:
        """A lease `_start_ready` had taken off this thread: decide the step (launch it, wait for the
        holder, reuse another executor's result...). What `_lease_io` raised is raised here."""
        if self._taking.pop(message.key, None) is None:
            return  # already released by `_abort`
        st = self.board[message.key]
        if st.phase is not Phase.PENDING:  # decided by another path meanwhile (none should: see
            taken = message.taken  # `_queue_dependents`); a lease this take holds is given back
            if isinstance(taken, tuple) and taken[0].ok:
                self.leases.release(st)
            return
        self._try_start(message.key, message.taken)  # type: ignore[arg-type]

    def _lease_io(self, key: str) -> Taken:
        """Take the step's lease and, once held, re-read its status under it: between our plan and our
        lease another executor may have finished it. Storage only; the decision is `_try_start`'s."""
        st = self.board[key]
        fresh = st.entry.action == WAIT or st.phase is not Phase.PENDING
        prev = self.records.current(st) if fresh else st.previous
        acquired = self.leases.acquire(st, attempt=recorded_attempt(prev) + 1)
        if not acquired.ok:
            return acquired, None
        try:
            return acquired, self.records.current(st)
        except BaseException:  # the lease is held, but the step cannot be decided: give it back
            with contextlib.suppress(Exception):
                self.leases.release(st)
            raise

    def _try_start(self, key: str, taken: Taken | BaseException | None = None) -> None:
        if isinstance(taken, BaseException):
            raise taken
        st = self.board[key]
        acquired, current = taken if taken is not None else self._lease_io(key)
        if not acquired.ok:
            holder = acquired.holder.owner if acquired.holder else "another executor"
            st.note = f"waiting for executor {holder}"
            self._wait_for_other(key)
            return
        step_json_checked = current is None  # a step never recorded has no step.json to keep
        if current is not None and current.get("_damaged"):  # named, moved aside, never overwritten
            current, step_json_checked = self.records.keep_damaged(st, current), True
        if _new_success(st, current):
            self.leases.release(st)
            self._succeeded(key, note="finished by another executor")
            return
        # another executor ran it and it failed since we planned: that counts as this run's failure too
        error = self.records.failed_elsewhere(st, current, (sf.FAILED,), others_only=False)
        if error is not None:
            self.leases.release(st)
            self._failed(key, error)
            return
        if (current or {}).get("status") == sf.SUCCESS:  # runs again: its earlier results are kept first
            self.records.keep_finished(st, current or {})
        # every status this run writes keeps `created`, when the step was first recorded (wall time, goodput)
        created = (current or {}).get("created") or time.time()
        st.previous, st.attempt = {**(current or {}), "created": created}, recorded_attempt(current)
        st.ended_attempts = None
        if not step_json_checked:  # the worker rewrites step.json: a damaged one is moved aside first
            self.records.keep_damaged_step_json(st)
        if (current or {}).get("status") == sf.PREEMPTED:  # interrupted in an earlier run: its ledger entry
            self._ledger_open.add(key)  # is completed when this run's first attempt ends
        if acquired.previous_owner:
            self.records.takeover(st, acquired)
            if self.records.close_lost_attempt(st, current, acquired):  # its executor died mid-attempt
                self._ledger_open.add(key)
        st.config = self.records.resolve_config(st)
        self._launch(key, first=True)
        if self.queue_behind:
            self._eager.append(key)

    def _launch(self, key: str, first: bool = False) -> None:
        """Submit an attempt, queued behind any dependency still running. Its worker writes step.json (first
        attempt of this run) and RUNNING when it starts, so the status says RUNNING only once it really
        runs."""
        st = self.board[key]
        st.attempt += 1
        after = tuple(d.hash for d in st.node.deps if d.hash in self.board.running)
        self.board.move(key, Phase.QUEUED if after else Phase.RUNNING)
        st.ended, st.error = None, None
        st.waiting = st.waiting_since = None
        st.started = None if after else time.time()
        step = st.node.step
        record = self.records.attempt_record(key, st, self.leases.acquired_at(st), first)
        self.backend.submit(Task(key=key, name=step.name, fn=step.fn, config=st.config,
                                 log_path=sf.log_path(st.path, st.attempt), env=dict(step.env),
                                 resources=Resources.coerce(step.resources), attempt=st.attempt,
                                 record=record, after=after))
        self.on_transition()

    # ----- waiting on another executor ------------------------------------------------------------------
    def _wait_for_other(self, key: str) -> None:
        st = self.board[key]
        changed = st.phase is not Phase.WAITING
        self.board.move(key, Phase.WAITING)
        if changed:
            st.poll_s = POLL_MIN_S
        st.next_poll = time.time() + st.poll_s
        if changed:
            self.on_transition()

    def _poll_waiting(self, key: str) -> None:
        st = self.board[key]
        current = self.records.current(st)
        if _new_success(st, current):
            self._succeeded(key, note="reused the result of another executor")
            return
        # A failure written by the executor we waited for (not an old one that was already there when we
        # planned)
        error = self.records.failed_elsewhere(st, current, (sf.FAILED, sf.DEP_FAILED), others_only=True)
        if error is not None:
            self._failed(key, error)
            return
        st.back_off()  # the holder may run for hours
        if self._has_room() and self._startable(key):
            self._try_start(key)  # acquires if the holder released or went stale; else back to waiting
            return
        st.next_poll = time.time() + st.poll_s

    # ----- finishing ----------------------------------------------------------------------------------
    def _finished(self, key: str, attempt: int, result: AttemptResult, was_queued: bool = False) -> None:
        st = self.board[key]
        if key not in self.board.running or attempt != st.attempt:
            return  # a cancelled attempt reporting late
        if st.queued:  # finished before this loop saw all its dependencies finish: handle it after them
            st.deferred = (attempt, result)
            return
        self.backend.forget(key)
        # An attempt that succeeded checked the lease itself before it wrote SUCCESS; otherwise check it here.
        if result.outcome is Outcome.LEASE_LOST or (not result.ok and not self.leases.holds(st)):
            st.note = "lease lost while running; waiting for the executor that took it over"
            self._wait_for_other(key)
            return
        # A queued attempt that never called fn: it saw a failed attempt of a dependency that was then
        # retried, or Ray failed it because a dependency's task was cancelled. Not a failure of this step:
        # submit again. A Ray-level failure (worker died) does not say whether fn had started; the worker's
        # RUNNING does.
        if result.outcome is Outcome.SKIPPED or (was_queued and not result.ok and result.started is None
                                                 and not self.records.attempt_started(st)):
            st.attempt -= 1
            self._launch(key, first=st.attempt == st.base_attempt)
            return
        if result.started:
            st.started = result.started
        if not result.ok:
            self._ended_badly(key, result)
            return
        self._close_ledger(key, result)
        st.ended = result.ended or time.time()  # the worker wrote SUCCESS (status and event) under our lease
        if result.lease_released:  # ... and then released the lease for us
            self.leases.released_by_worker(st)
        else:
            self.leases.release(st)
        self._succeeded(key, note="ran")

    def _ended_badly(self, key: str, result: AttemptResult) -> None:
        """A FAILED or PREEMPTED attempt: retried under the same lease, as a new attempt with its own log, if
        the step's policy allows (a preempted one after a back-off); otherwise the step's final status. An
        interruption is written to the step's ledger first."""
        st = self.board[key]
        error = result.error
        status = sf.PREEMPTED if result.outcome is Outcome.PREEMPTED else sf.FAILED
        if status == sf.FAILED and result.exception:  # an input another step wrote is unreadable: name it
            error = name_producer(error, result.exception,
                                  [(d.name, self.records.node_path(d)) for d in st.node.deps])
        self._close_ledger(key, result)
        fields: dict[str, Any] = {"cause": result.cause} if result.cause else {}
        if result.outcome is Outcome.PREEMPTED:
            fields = self.records.interruption(st, result.cause or "preempted", result.hosts,
                                               f"{error['type']}: {error['message']}")
            self._ledger_open.add(key)
        self.records.attempt_ended(st, status, error, **fields)
        ended = st.ended_attempts = st.ended_attempts or Counter()
        ended[result.outcome] += 1
        policy = RetryPolicy.for_step(st.node.step)
        if policy.retry(ended):
            wait_s = policy.backoff_s(ended, result.outcome)
            if wait_s > 0:
                st.note = f"interrupted ({result.cause or 'preempted'}); next attempt in {wait_s:g} s"
                heapq.heappush(self._backoff, (time.time() + wait_s, key, st.attempt))
            else:
                self._launch(key)
            return
        st.ended = time.time()
        if exhausted := policy.exhausted(ended):
            error = {**error, "message": f"{error['message']} ({exhausted})"}
        self.records.final(st, status, error)
        self.leases.release(st)
        self._failed(key, error, status=status, exc_pickle=result.exception)

    def _close_ledger(self, key: str, result: AttemptResult) -> None:
        """The attempt after an interruption ended (whatever its outcome): complete the ledger entry."""
        if key in self._ledger_open:
            self._ledger_open.discard(key)
            self.records.resumed(self.board[key], result.started)

    def _succeeded(self, key: str, note: str) -> None:
        st = self.board.move(key, Phase.SUCCESS)
        st.note = note
        for user in self._dependents.get(key, ()):
            ust = self.board[user]
            ust.unmet -= 1
            if ust.unmet == 0 and ust.phase is Phase.PENDING:
                self._ready.append(user)
            elif ust.unmet == 0 and ust.queued:  # its queued attempt starts (or started) now
                self.board.move(user, Phase.RUNNING)
                ust.started = time.time()
                if ust.deferred is not None:
                    self._resume.append((user, *ust.deferred, True))
                    ust.deferred = None
        self.on_transition()

    def _failed(self, key: str, error: dict[str, Any], *, status: str = sf.FAILED,
                exc_pickle: bytes | None = None) -> None:
        st = self.board.move(key, PHASE_OF_STATUS[status])
        st.error = error
        st.ended = st.ended or time.time()
        st.failure = _step_failure(key, st, error, exc_pickle)
        self._dep_failed_below(key)
        self.on_transition()

    def _dep_failed_below(self, failed_key: str) -> None:
        """Mark every not-yet-started step downstream of `failed_key` DEP_FAILED (they will not run)."""
        failed = self.board[failed_key]
        stack = list(self._dependents.get(failed_key, ()))
        while stack:
            key = stack.pop()
            st = self.board[key]
            held = st.queued  # queued behind the failure: it never called fn
            if st.phase is not Phase.PENDING and not held:
                continue
            if held:  # ends by itself (SKIPPED, fn never called; its late result ignored): a forced cancel
                self.backend.forget(key)  # racing that end crashed Ray 2.60's driver (changelog)
                st.deferred, st.attempt = None, st.attempt - 1
            self.board.move(key, Phase.DEP_FAILED)
            st.note = f"dependency {failed.node.name} failed"
            st.error = {"type": "DependencyFailed", "message": f"dependency {failed.node.name} failed",
                        "dependency": f"{failed.node.name}-{failed_key[:8]}"}
            self._write_dep_failed(st, held=held)
            stack.extend(self._dependents.get(key, ()))

    def _write_dep_failed(self, st: StepState, held: bool = False) -> None:
        if not held and (st.entry.previous or {}).get("_damaged"):
            # its status.json cannot be read: a DEP_FAILED "attempt 0" over it would lose the attempt numbers
            # on record (the next run would write attempt 1's log again). It stays as it is, named by the plan
            # and `marin status`; the run that runs the step moves it aside under the lease (keep_damaged).
            return
        attempt = st.base_attempt
        if not held and not self.leases.acquire(st, attempt=attempt).ok:
            return  # another executor is running it: its status is that executor's to write
        try:
            self.records.dep_failed(st, attempt)
        finally:
            self.leases.release(st)

    def _abort(self) -> None:
        """Interrupted (Ctrl-C, SIGTERM), or a step could not be decided: cancel the lease takes not started,
        stop running attempts and record them PREEMPTED, then give back the leases taken meanwhile."""
        taking, self._taking = self._taking, {}
        for future in taking.values():
            future.cancel()  # not started yet: nothing taken
        try:
            self._abort_running()
        finally:
            self._release_taken(taking)

    def _abort_running(self) -> None:
        """Stop the running attempts; record them PREEMPTED and release their leases."""
        for key in list(self.board.running):
            st = self.board[key]
            self.backend.cancel(key)
            if st.queued and self.leases.holds(st):  # it never started: nothing to record
                self.leases.release(st)
                self.board.move(key, Phase.PENDING)
                continue
            if self.leases.holds(st):
                fields: dict[str, Any] = {"cause": "driver_lost"}
                try:
                    fields = self.records.interruption(st, "driver_lost", (), "the executor was interrupted")
                except Exception as exc:  # the ledger must not stop the leases from being released
                    print(f"marin: could not write the interruption ledger of {st.node.name}: {exc}")
                self.records.interrupted(st, **fields)
                self.leases.release(st)
            self.board.move(key, Phase.PREEMPTED)

    def _release_taken(self, taking: dict[str, Future[Taken]]) -> None:
        """The leases `_start_ready` was still taking when the run stopped: wait for each take in flight (at
        most RELEASE_WAIT_S in all: a hung store must not hold up the exit), release what was taken (the
        step stays PENDING; nothing about it was recorded). A take still running after that leaves a lease
        that goes stale like any lease of a killed executor."""
        done, _ = concurrent.futures.wait([f for f in taking.values() if not f.cancelled()],
                                          timeout=RELEASE_WAIT_S)
        for key, future in taking.items():
            if future not in done or future.exception() is not None:
                continue  # nothing taken (or still being taken: see above)
            acquired, _ = future.result()
            if acquired.ok:
                with contextlib.suppress(Exception):
                    self.leases.release(self.board[key])


def _new_success(st: StepState, current: dict[str, Any] | None) -> bool:
    """`current` is a SUCCESS another executor wrote since the plan: not the SUCCESS the plan itself found
    and re-runs (its outputs changed since, or `--force-run`), told apart by its run, attempt and end."""
    if (current or {}).get("status") != sf.SUCCESS:
        return False
    planned = st.entry.previous or {}
    if planned.get("status") != sf.SUCCESS:
        return True
    return any(current.get(k) != planned.get(k) for k in ("run_id", "attempt", "ended"))  # type: ignore[union-attr]


def _step_failure(key: str, st: StepState, error: dict[str, Any],
                  exc_pickle: bytes | None) -> StepFailedError:
    """The error a failed step raises from `executor_main`, chained to the step's own exception if it
    unpickles."""
    log = sf.log_path(st.path, st.attempt) if st.attempt else None
    failure = StepFailedError(st.node.name, key, st.path, log, f"{error.get('type')}: {error.get('message')}")
    if exc_pickle:
        try:
            failure.__cause__ = pickle.loads(exc_pickle)
        except Exception as e:  # the original exception class is not importable here
            failure.__cause__ = e
    return failure
