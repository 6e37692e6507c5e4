"""The `local` backend: a warm pool of worker processes forked from the executor (or spawned, when a fork
of it is unsafe: start_method.py).

A worker is forked the first time no idle worker is free (so at most `--max-concurrent` exist) and then runs
one attempt after another: the step function and its resolved config travel over a pipe (pickled by reference,
which works because the worker is a fork of the process that defined them), and the `AttemptResult` comes
back as a tuple of plain values (`AttemptResult.to_wire`, a tenth of the dataclass's pickling cost). Forking
a fresh process per step costs 5-7 ms on a loaded 2-core machine and a fresh interpreter about 75 ms; a warm
worker costs a fraction of a millisecond per step. Steps get this machine's resources the way Ray hands out
a node's: an attempt starts only when the CPUs, GPUs, memory and custom resources it requests are free (others
that fit start meanwhile), and a request larger than the machine is an error before anything runs (see
resources.py; custom resources are declared in MARIN_LOCAL_RESOURCES). A step that crashes its worker
(segfault, `os._exit`, SIGKILL) is reported as failed and the worker is replaced; a step that calls `sys.exit`
is an ordinary failure. Each attempt restores the working directory and the environment it changed. Workers
die with the executor (PR_SET_PDEATHSIG), so a killed executor leaves no step running behind a stale lease.

A process that already runs other threads (a JAX runtime that has computed, embedded Ray, a notebook) cannot
be forked safely: a lock one of them held stays held forever in the child. Workers of such a process are
started with `spawn` instead (a fresh interpreter that imports the step's function by module and name; the
reason is said once on stderr; in `auto` they are forked from a spawn server, one fresh interpreter that
imported the engine once); `MARIN_LOCAL_START` forces either (start_method.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import multiprocessing.connection as mpc
import multiprocessing.process
import os
import select
import selectors
import signal
import sys
import threading
from collections.abc import Sequence

from marin.definition.step import Resources
from marin.execution.attempt import HOST, AttemptResult, Outcome, Task
from marin.execution.backend import AttemptDone, Completions, RunOnLoop
from marin.execution.resources import check_feasible, local_machine, requested
from marin.execution.start_method import ENV, fresh_context, start_method
from marin.execution.worker import execute_step

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """End this worker when the executor `parent` ends: by PR_SET_PDEATHSIG for a forked worker (the
    executor's child); a worker of the spawn server is the server's child, and the server outlives the
    executor while any of its workers runs, so that worker watches the executor's process itself."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: workers may outlive a killed executor
        return
    if os.getppid() == parent:
        return
    try:
        watched = os.pidfd_open(parent)
    except ProcessLookupError:  # the executor is gone already
        os._exit(1)
    except OSError:  # a kernel without pidfds (before Linux 5.3)
        return

    def watch() -> None:
        select.select([watched], [], [])  # readable once the executor's process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="marin-executor-watch", daemon=True).start()


UNPICKLABLE = ("the worker process could not load the step it was sent: a spawned worker (start_method.py) "
               "imports the step's function and config classes by module and name, so define them in an "
               "importable module or a script guarded by `if __name__ == \"__main__\"` (not a notebook cell "
               "or `python -c`), or run from a process that can fork safely")


def _worker_loop(tasks: mpc.Connection, results: mpc.Connection) -> None:
    cwd = os.getcwd()
    while True:
        try:
            message = tasks.recv()
        except EOFError:
            return
        except Exception as exc:  # unpickling failed: the step's function cannot be imported here
            results.send(AttemptResult.from_exception(exc, context=UNPICKLABLE, host=HOST).to_wire())
            continue
        if message is None:
            return
        result = execute_step(*message, delivered_once=True)  # a retry is a new attempt, never this one again
        if os.getcwd() != cwd:
            os.chdir(cwd)
        try:
            results.send(result.to_wire())  # a tuple of plain values: the dataclass pickles ~10x slower
        except Exception as exc:  # an unpicklable result field: report the failure itself
            results.send(AttemptResult.from_exception(exc, host=HOST).to_wire())


def _serve(tasks: mpc.Connection, results: mpc.Connection, parent: int) -> None:
    """A worker process's life (forked or spawned): serve attempts until the executor closes the pipe; never
    return into the caller's code."""
    code = 0
    try:
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _worker_loop(tasks, results)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _worker_died(worker: _Worker, task: Task) -> AttemptResult:
    """The result of an attempt whose worker process ended before reporting: killed by a signal (PREEMPTED),
    or exited (`os._exit`, FAILED)."""
    sig, code = worker.wait()
    how = f"was killed by signal {sig}" if sig else f"exited with code {code}"
    return AttemptResult(Outcome.PREEMPTED if sig is not None else Outcome.FAILED, error_type="WorkerDied",
                         message=f"the step's worker process {how} before reporting", log_path=task.log_path,
                         host=HOST)


@dataclasses.dataclass
class _Worker:
    pid: int
    tasks: mpc.Connection
    results: mpc.Connection
    task: Task | None = None
    process: multiprocessing.process.BaseProcess | None = None  # a spawned worker (None: forked)

    def kill(self) -> None:
        """SIGKILL the worker if it still runs. A worker of the spawn server is the server's child, reaped
        there at once: its pid could be another process's by now, so it is killed only while it is alive."""
        if self.process is not None and not self.process.is_alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> tuple[int | None, int | None]:
        """Wait for the ended process: (the signal that killed it, or None; its exit code, or None)."""
        if self.process is not None:  # its Popen reaps it: a waitpid of ours could race with that
            self.process.join()
            code = self.process.exitcode
            return (-code, None) if code is not None and code < 0 else (None, code)
        _, status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(status):
            return os.WTERMSIG(status), None
        return None, os.WEXITSTATUS(status)


class LocalBackend:
    name = "local"
    queues_behind_dependencies = False  # an attempt is submitted only once its dependencies succeeded

    def __init__(self, completions: Completions) -> None:
        self.completions = completions
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._free = local_machine()  # what is not held by a running attempt
        self._pending: list[Task] = []  # submitted, waiting for resources; started in order as they fit
        self._holding: dict[str, dict[str, float]] = {}  # running attempt's key -> what it holds
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        # Workers are forked only by the thread that runs the executor: a fork copies only the forking thread,
        # and a lock another thread held at that moment (the executor's, a library's) would stay held in the
        # child.
        self._owner = threading.get_ident()
        self._start_requested = False  # a start the reaper could not make is queued for the executor's thread
        self._said_spawn = False  # the reason for spawning is said once
        self._reaper = threading.Thread(target=self._reap_loop, name="marin-local-reaper", daemon=True)
        self._reaper.start()

    def check_resources(self, tasks: Sequence[tuple[str, Resources]]) -> None:
        check_feasible(tasks, [local_machine()], "lower the step's resources, run it on a Ray cluster "
                       "that has "
                       "them (--backend ray --ray-address ...), or declare custom resources this machine has "
                       "in MARIN_LOCAL_RESOURCES (e.g. '{\"TPU\": 4}')")

    def _spawn(self) -> _Worker:
        task_r, task_w = mpc.Pipe(duplex=False)
        result_r, result_w = mpc.Pipe(duplex=False)
        parent = os.getpid()
        method, why = start_method()
        process = None
        if method == "spawn":
            context, how = fresh_context(forced=os.environ.get(ENV, "").strip().lower() == "spawn")
            self._say_spawn(why, how)
            process = context.Process(
                target=_serve, args=(task_r, result_w, parent), name="marin-local-worker", daemon=False)
            process.start()
            pid = process.pid
            assert pid is not None  # started
        else:
            pid = os.fork()
            if pid == 0:  # worker: serve attempts until the executor closes the pipe
                task_w.close()
                result_r.close()
                _serve(task_r, result_w, parent)
        task_r.close()
        result_w.close()
        worker = _Worker(pid, task_w, result_r, process=process)
        self._workers.append(worker)
        self._selector.register(result_r.fileno(), selectors.EVENT_READ, worker)
        os.write(self._wake_w, b"x")
        return worker

    def _say_spawn(self, why: str | None, how: str) -> None:
        if not self._said_spawn:
            self._said_spawn = True
            print(f"marin: the local backend starts its workers with spawn, not fork: {why} (a forked worker "
                  f"could inherit a lock held forever; workers are {how}); MARIN_LOCAL_START=fork forces "
                  "fork",
                  file=sys.stderr, flush=True)

    def submit(self, task: Task) -> None:
        with self._lock:
            self._pending.append(task)
        self._start_what_fits()

    def _start_what_fits(self) -> None:
        """Start every pending attempt whose request fits in what is free, in submission order.
 Called by the executor's thread (on submit) and by the reaper (when an attempt finished). An attempt that
needs a new worker is started only on the executor's thread, so no worker is forked from the reaper: the
        reaper asks the executor's loop to call this again instead.
        """
        starts = []
        on_owner = threading.get_ident() == self._owner
        with self._lock:
            if on_owner:
                self._start_requested = False
            for task in list(self._pending):
                want = requested(task.resources)
                if all(self._free.get(k, 0.0) >= v for k, v in want.items()):
                    worker = next((w for w in self._workers if w.task is None), None)
                    if worker is None and not on_owner:
                        if not self._start_requested:
                            self._start_requested = True
                            self.completions.put(RunOnLoop(self._start_what_fits))
                        break
                    self._pending.remove(task)
                    for k, v in want.items():
                        self._free[k] -= v
                    self._holding[task.key] = want
                    worker = worker or self._spawn()
                    worker.task = task
                    starts.append((worker, task))
        for worker, task in starts:
            try:
                worker.tasks.send(task.payload())
            except Exception as exc:  # e.g. a config value that cannot be pickled
                with self._lock:
                    worker.task = None
                    self._release(task.key)
                failure = AttemptResult.from_exception(
                    exc, context="cannot send the step to a worker process", log_path=task.log_path,
                    host=HOST)
                self.completions.put(AttemptDone(task.key, task.attempt, failure))

    def _release(self, key: str) -> None:
        """Give back what attempt `key` held (call with the lock held)."""
        for k, v in self._holding.pop(key, {}).items():
            self._free[k] += v

    def _reap_loop(self) -> None:
        while not self._closed:
            for selected, _ in self._selector.select():
                worker = selected.data
                if worker is None:
                    os.read(self._wake_r, 4096)
                    continue
                self._collect(worker)

    def _collect(self, worker: _Worker) -> None:
        result: AttemptResult | None
        try:
            result = AttemptResult.from_wire(worker.results.recv())
        except (EOFError, OSError):
            result = None
        except Exception as exc:  # the result could not be unpickled here
            result = AttemptResult.from_exception(exc, host=HOST)
        with self._lock:
            task, worker.task = worker.task, None
            if result is None:
                self._retire(worker)
            if task is not None:
                self._release(task.key)
        if task is None:
            return
        if result is None:
            result = _worker_died(worker, task)
        self.completions.put(AttemptDone(task.key, task.attempt, result))
        self._start_what_fits()

    def _retire(self, worker: _Worker) -> None:
        if worker not in self._workers:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(worker.results.fileno())
        for conn in (worker.tasks, worker.results):
            with contextlib.suppress(OSError):
                conn.close()
        if worker in self._workers:
            self._workers.remove(worker)

    def forget(self, key: str) -> None:
        """Nothing to drop: attempts are never queued behind others here."""

    def cancel(self, key: str) -> None:
        with self._lock:
            self._pending = [t for t in self._pending if t.key != key]  # never started: nothing to report
            worker = next((w for w in self._workers if w.task is not None and w.task.key == key), None)
        if worker is not None:
            worker.kill()

    def shutdown(self) -> None:
        with self._lock:
            self._pending.clear()
            workers = list(self._workers)
        for w in workers:
            if w.task is not None:
                w.kill()
            with contextlib.suppress(OSError, BrokenPipeError):
                w.tasks.send(None)
        self._closed = True
        os.write(self._wake_w, b"x")
        self._reaper.join(timeout=5)
        for w in workers:
            with contextlib.suppress(ChildProcessError):
                w.wait()
            with self._lock:
                self._retire(w)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
