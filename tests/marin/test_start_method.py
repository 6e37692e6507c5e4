"""The local backend's fork hazard (marin/execution/start_method.py): a process that already runs other
threads (a JAX runtime that has computed, a thread of its own) gets spawned workers, not forked ones, and its
JAX step finishes instead of hanging in a worker that inherited a lock held forever; spawned workers report
crashes as forked ones do; a function no spawned worker can import, and a script that starts its run at
import time, fail with a message naming the fix instead of hanging. Each run is a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from marin.execution.start_method import fork_hazard, start_method

ROOT = Path(__file__).resolve().parents[2]

JAX_AND_THREAD = """
import json, sys, threading
import jax.numpy as jnp
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.jax_fns import JaxSumConfig, jax_sum

if __name__ == "__main__":
    jnp.arange(8.0).sum().block_until_ready()  # JAX's runtime started and computed in this process
    threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()
    step = Step(name="hz/jax", fn=jax_sum, config=JaxSumConfig(output_path=this_output_path(), n=8))
    result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                            script="tests/experiment_under_test.py")
    print("RESULT " + json.dumps({"status": result.status, "path": result.output_path("hz/jax")}))
"""

DIE_SPAWNED = """
import json, sys
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.fns import DieConfig, WriteConfig, die, write_numbers

if __name__ == "__main__":
    ok = Step(name="hz/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=4))
    dead = Step(name="hz/die", fn=die, config=DieConfig(output_path=this_output_path(), how=sys.argv[2]),
                max_preemptions=0)  # a worker killed by a signal is an interruption: no retry
    result = run_experiment([ok, dead], ExecutorMainConfig(prefix=sys.argv[1], backend="local"),
                            verbose=False, script="tests/experiment_under_test.py")
    print("RESULT " + json.dumps({"statuses": {n: result.status_of(n) for n in ("hz/numbers", "hz/die")},
                                  "path": result.output_path("hz/numbers")}))
"""

DEFINED_IN_MAIN_UNIMPORTABLE = """
import dataclasses, json, sys
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path

@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str

def here(cfg):
    pass

step = Step(name="hz/here", fn=here, config=Cfg(output_path=this_output_path()))
result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                        script="tests/experiment_under_test.py")
print("RESULT " + json.dumps({"status": result.status, "path": result.output_path("hz/here")}))
"""

UNGUARDED = """
import json, sys
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.fns import WriteConfig, write_numbers

step = Step(name="hz/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=4))
result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                        script="tests/experiment_under_test.py")
print("RESULT " + json.dumps({"status": result.status}))
"""


def _run(script: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         as_file: bool = True) -> tuple[dict[str, object], str]:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    command = [sys.executable, str(path)] if as_file else [sys.executable, "-c", path.read_text()]
    import os

    out = subprocess.run([*command, str(tmp_path / "prefix"), *args], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), out.stderr


def test_a_process_that_ran_jax_and_started_a_thread_runs_a_jax_step_on_the_local_backend(
        tmp_path: Path) -> None:
    result, err = _run(JAX_AND_THREAD, tmp_path, env={"MARIN_LOCAL_START": "auto"})
    assert result["status"] == "SUCCESS", err[-4000:]
    written = json.loads((Path(str(result["path"])) / "sum.json").read_text())
    assert written["sum"] == sum(x * x for x in range(8))
    assert ("marin: the local backend starts its workers with spawn, not fork: 1 other thread(s) run in this "
            "process (busy); JAX's runtime is started in this process (backends: cpu)") in err
    assert "os.fork() was called" not in err  # JAX's own warning of the hazard: no fork happened


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_spawned_worker_that_dies_is_reported_as_a_forked_one_is_and_replaced(tmp_path: Path,
                                                                                  how: str) -> None:
    result, err = _run(DIE_SPAWNED, tmp_path, how, env={"MARIN_LOCAL_START": "spawn"})
    assert "starts its workers with spawn, not fork: MARIN_LOCAL_START=spawn" in err
    statuses = result["statuses"]
    assert isinstance(statuses, dict)
    assert statuses == {"hz/numbers": "SUCCESS", "hz/die": "PREEMPTED" if how == "kill" else "FAILED"}
    assert (Path(str(result["path"])) / "numbers.txt").exists()
    [die_dir] = (tmp_path / "prefix/hz").glob("die-*")
    status = json.loads((die_dir / ".marin/status.json").read_text())
    expected = "was killed by signal 9" if how == "kill" else "exited with code 3"
    assert f"the step's worker process {expected} before reporting" in status["error"]["message"]


def test_a_function_no_spawned_worker_can_import_fails_its_attempt_naming_the_fix(tmp_path: Path) -> None:
    """`python -c` defines the step function in a main module that has no file: a spawned worker cannot
    import it. The attempt fails with the reason, never a hang or a bare 'worker exited'."""
    result, _ = _run(DEFINED_IN_MAIN_UNIMPORTABLE, tmp_path, env={"MARIN_LOCAL_START": "spawn"},
                     as_file=False)
    assert result["status"] == "FAILED"
    status = json.loads((Path(str(result["path"])) / ".marin/status.json").read_text())
    message = status["error"]["message"]
    assert message.startswith("the worker process could not load the step it was sent")
    assert "define them in an importable module" in message and "'here'" in message


def test_a_script_that_runs_at_import_time_is_stopped_in_its_spawned_worker_naming_the_guard(
        tmp_path: Path) -> None:
    result, err = _run(UNGUARDED, tmp_path, env={"MARIN_LOCAL_START": "spawn"})
    assert result["status"] == "FAILED"
    assert "guard the script's run with `if __name__ == \"__main__\":`" in err


def test_the_hazard_names_foreign_threads_but_not_the_engines_own(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    own = threading.Thread(target=stop.wait, name="marin-lease-heartbeat", daemon=True)
    own.start()
    try:
        assert "marin-lease-heartbeat" not in (fork_hazard() or "")
        foreign = threading.Thread(target=stop.wait, name="notebook-kernel", daemon=True)
        foreign.start()
        assert "notebook-kernel" in (fork_hazard() or "")
        monkeypatch.setenv("MARIN_LOCAL_START", "auto")
        method, why = start_method()
        assert method == "spawn" and why is not None and "notebook-kernel" in why
        monkeypatch.setenv("MARIN_LOCAL_START", "fork")
        assert start_method() == ("fork", None)
    finally:
        stop.set()
    monkeypatch.setenv("MARIN_LOCAL_START", "vfork")
    with pytest.raises(ValueError, match=r"MARIN_LOCAL_START='vfork' .* use one of auto, fork, spawn"):
        start_method()


def test_a_pool_of_many_threads_cannot_hide_the_odd_thread_from_the_hazard() -> None:
    """CI ran this module beside a web server's pools: eleven threads, and only the first four names were
    shown."""
    stop = threading.Event()
    pool = [threading.Thread(target=stop.wait, name=f"hazard-test-pool-7f01c2782{i:03x}", daemon=True)
            for i in range(12)]
    odd = threading.Thread(target=stop.wait, name="notebook-kernel", daemon=True)
    for thread in [*pool, odd]:
        thread.start()
    try:
        hazard = fork_hazard() or ""
        assert "notebook-kernel" in hazard
        assert "hazard-test-pool x12" in hazard  # a family of its own: other modules leave portals
    finally:
        stop.set()


def test_fsspecs_io_thread_is_a_hazard() -> None:
    """fsspec resets its own loop in a forked child, but not an async filesystem object a step module built
    before the fork (review of issue 35: exempting the thread broke such steps)."""
    import fsspec.asyn

    fsspec.asyn.get_loop()  # starts fsspec's IO thread, as the first gcsfs/s3fs call does
    real = fsspec.asyn.iothread[0]
    assert real is not None and real.is_alive() and real.name == "fsspecIO"
    assert "fsspecIO" in (fork_hazard() or "")


MODULE_LEVEL_ASYNC_FS = """
import dataclasses, http.server, json, sys, threading
import fsspec
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()

    def log_message(self, *args):
        pass


HTTP = fsspec.filesystem("http")  # built at import time: an async filesystem (starts fsspec's IO thread)


@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str
    url: str


def read_it(cfg):
    with fsspec.open(f"{cfg.output_path}/got.txt", "wb", auto_mkdir=True) as f:
        f.write(HTTP.cat(cfg.url))


if __name__ == "__main__":
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="marin-test-http", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/x"
    step = Step(name="hz/http", fn=read_it, config=Cfg(output_path=this_output_path(), url=url))
    result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                            script="tests/experiment_under_test.py")
    print("RESULT " + json.dumps({"status": result.status, "path": result.output_path("hz/http")}))
"""


def test_a_step_using_an_async_filesystem_built_at_import_time_runs(tmp_path: Path) -> None:
    result, err = _run(MODULE_LEVEL_ASYNC_FS, tmp_path, env={"MARIN_LOCAL_START": "auto"})
    assert result["status"] == "SUCCESS", err[-4000:]
    assert (Path(str(result["path"])) / "got.txt").read_bytes() == b"ok"
    assert "fsspecIO" in err  # the reason the workers were spawned, said once


def test_a_worker_forked_beside_fsspecs_io_thread_uses_its_own_loop() -> None:
    """The child of a fork taken while fsspec's IO thread runs gets a fresh loop and thread of its own."""
    import multiprocessing

    import fsspec.asyn

    fsspec.asyn.get_loop()
    parent_thread = fsspec.asyn.iothread[0]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply(_fresh_fsspec_loop_in_child)
    assert child[0] and child[1] != parent_thread.native_id  # kernel thread ids: both alive, never equal


def _fresh_fsspec_loop_in_child() -> tuple[bool, int]:
    import asyncio

    import fsspec.asyn

    loop = fsspec.asyn.get_loop()
    result = fsspec.asyn.sync(loop, asyncio.sleep, 0, result=True)
    return bool(result), fsspec.asyn.iothread[0].native_id


# ----- the spawn server (start_method.fresh_context): workers of `auto` in a process that cannot fork -------
SERVED_DIE = """
import json, sys, threading
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.fns import DieConfig, WriteConfig, die, write_numbers

if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()  # forking is unsafe
    ok = Step(name="hz/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=4))
    dead = Step(name="hz/die", fn=die, config=DieConfig(output_path=this_output_path(), how=sys.argv[2]),
                max_preemptions=0)
    result = run_experiment([ok, dead], ExecutorMainConfig(prefix=sys.argv[1], backend="local"),
                            verbose=False, script="tests/experiment_under_test.py")
    print("RESULT " + json.dumps({"statuses": {n: result.status_of(n) for n in ("hz/numbers", "hz/die")},
                                  "path": result.output_path("hz/numbers")}))
"""

SERVED = "forked from one fresh interpreter that imported the engine and its storage libraries"


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_worker_of_the_spawn_server_that_dies_is_reported_and_replaced(tmp_path: Path, how: str) -> None:
    result, err = _run(SERVED_DIE, tmp_path, how, env={"MARIN_LOCAL_START": "auto"})
    assert "starts its workers with spawn, not fork: 1 other thread(s) run in this process (busy)" in err
    assert SERVED in err
    assert result["statuses"] == {"hz/numbers": "SUCCESS",
                                  "hz/die": "PREEMPTED" if how == "kill" else "FAILED"}
    [die_dir] = (tmp_path / "prefix/hz").glob("die-*")
    status = json.loads((die_dir / ".marin/status.json").read_text())
    expected = "was killed by signal 9" if how == "kill" else "exited with code 3"
    assert f"the step's worker process {expected} before reporting" in status["error"]["message"]


SERVED_UNGUARDED = """
import json, sys, threading
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.fns import WriteConfig, write_numbers

threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()
step = Step(name="hz/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=4))
result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                        script="tests/experiment_under_test.py")
print("RESULT " + json.dumps({"status": result.status}))
"""


def test_a_script_that_runs_at_import_time_is_stopped_in_a_worker_of_the_spawn_server(
        tmp_path: Path) -> None:
    result, err = _run(SERVED_UNGUARDED, tmp_path, env={"MARIN_LOCAL_START": "auto"})
    assert SERVED in err
    assert result["status"] == "FAILED"
    assert "guard the script's run with `if __name__ == \"__main__\":`" in err


SERVED_ENV = """
import dataclasses, json, os, sys, threading
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path


@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str
    run: int


def note_env(cfg):
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "env.json"), "w") as f:
        json.dump({"x": os.environ.get("MARIN_TEST_SERVED"), "pid": os.getpid()}, f)


if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()
    seen = []
    for run, value in enumerate(["first", "first", "second"]):
        os.environ["MARIN_TEST_SERVED"] = value
        step = Step(name="hz/env", fn=note_env, config=Cfg(output_path=this_output_path(), run=run))
        result = run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"),
                                verbose=False, script="tests/experiment_under_test.py")
        with open(os.path.join(result.output_path("hz/env"), "env.json")) as f:
            seen.append(json.load(f))
    print("RESULT " + json.dumps({"seen": seen, "executor": os.getpid()}))
"""


def test_a_worker_of_the_spawn_server_sees_the_executors_environment_of_its_run(tmp_path: Path) -> None:
    """The server keeps the environment it was started with: a run after a variable changed gets plain
    spawned workers (start_method._server_matches), so no step sees a stale value."""
    result, err = _run(SERVED_ENV, tmp_path, env={"MARIN_LOCAL_START": "auto"})
    seen = result["seen"]
    assert isinstance(seen, list)
    assert [s["x"] for s in seen] == ["first", "first", "second"], err[-3000:]
    assert len({s["pid"] for s in seen}) == 3  # each run's worker is a new process


SERVED_SLEEP = """
import dataclasses, os, sys, threading, time
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path


@dataclasses.dataclass(frozen=True)
class Cfg:
    output_path: str
    pid_file: str


def sleep_long(cfg):
    with open(cfg.pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(cfg.pid_file + ".tmp", cfg.pid_file)
    time.sleep(120)


if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()
    step = Step(name="hz/sleep", fn=sleep_long,
                config=Cfg(output_path=this_output_path(), pid_file=sys.argv[2]))
    run_experiment([step], ExecutorMainConfig(prefix=sys.argv[1], backend="local"), verbose=False,
                   script="tests/experiment_under_test.py")
"""


def test_a_killed_executor_takes_the_workers_of_its_spawn_server_with_it(tmp_path: Path) -> None:
    """A worker forked by the server is the server's child, not the executor's: the server ends when the
    executor does, and its workers die with it (PR_SET_PDEATHSIG), so no step runs on behind a stale lease."""
    import os
    import signal
    import time

    script, pid_file = tmp_path / "script.py", tmp_path / "worker.pid"
    script.write_text(textwrap.dedent(SERVED_SLEEP))
    executor = subprocess.Popen([sys.executable, str(script), str(tmp_path / "prefix"), str(pid_file)],
                                cwd=ROOT, env={**os.environ, "MARIN_LOCAL_START": "auto"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not pid_file.exists() and executor.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), executor.stderr.read()[-3000:] if executor.poll() is not None else "no pid"
        worker = int(pid_file.read_text())
        assert worker != executor.pid and Path(f"/proc/{worker}").exists()
        os.kill(executor.pid, signal.SIGKILL)
        executor.wait(30)
        deadline = time.time() + 30
        while Path(f"/proc/{worker}").exists() and time.time() < deadline:
            time.sleep(0.1)
        alive = Path(f"/proc/{worker}").exists()
        state = Path(f"/proc/{worker}/stat").read_text().split()[2] if alive else "gone"
        assert state in ("gone", "Z"), f"the worker {worker} still runs (state {state})"
    finally:
        if executor.poll() is None:
            executor.kill()
            executor.wait(30)


def test_the_spawn_server_never_preloads_a_package_this_directory_shadows(tmp_path: Path) -> None:
    """Run from a directory holding another `marin` (a second checkout): the server, a `python -c` started
    there, would import that one for its preload (Python 3.11 ignores the executor's path there); the
    workers must run this checkout's engine."""
    import os

    decoy = tmp_path / "elsewhere"
    (decoy / "marin/execution").mkdir(parents=True)
    (decoy / "marin/__init__.py").write_text("")
    (decoy / "marin/execution/__init__.py").write_text("")
    (decoy / "marin/execution/local_backend.py").write_text(
        "import os\n\ndef _serve(*args):\n    os._exit(7)\n")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SERVED_DIE))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "prefix"), "exit"], capture_output=True,
                         text=True, timeout=300, cwd=decoy,
                         env={**os.environ, "MARIN_LOCAL_START": "auto",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert SERVED in out.stderr
    assert result["statuses"] == {"hz/numbers": "SUCCESS", "hz/die": "FAILED"}, out.stderr[-3000:]
    [die_dir] = (tmp_path / "prefix/hz").glob("die-*")
    status = json.loads((die_dir / ".marin/status.json").read_text())
    assert "exited with code 3" in status["error"]["message"]  # the step's own exit, not the decoy's 7
