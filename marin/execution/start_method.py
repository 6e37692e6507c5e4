"""How the local backend starts a worker process: `fork` when it is safe, `spawn` when it is not.

A fork copies only the forking thread. A lock another thread of the process held at that moment stays held
forever in the child, and the child hangs the first time it needs it: a worker forked from a process whose
JAX runtime had run a computation hung in JAX lowering, and so can one forked from a process with embedded
Ray's threads, a notebook's, or any library's. Fork is still the cheap way (a warm worker in well under a
millisecond per step after a few milliseconds to fork; `spawn` starts a fresh interpreter that imports the
step's modules, a few hundred milliseconds per worker), so it stays the rule when nothing makes it unsafe:

- **fork** when the executor's thread is the only thread of the process besides the engine's own (`marin-*`
  threads: the local backend's reaper, lease heartbeats, the log shipper, the console's progress poller), no
  JAX backend is initialised in it, and Ray is not initialised in it.
- **spawn** otherwise, with the reason said once on stderr. A spawned worker imports the step's function by
  module and name (a script run by `marin run` or `python SCRIPT` is imported as its main module, guarded by
  `if __name__ == "__main__"`); a function defined where no module can import it (a notebook cell, `python
  -c`) fails its attempt with a message that says so, and a script that starts its run at import time
  (unguarded) is stopped in the worker with an error naming the guard (`refuse_while_spawning`).

`MARIN_LOCAL_START` overrides the choice: `auto` (the default, as above), `fork` or `spawn`.

**How `spawn` is carried out** (`fresh_context`). A spawned interpreter imports marin, and on an object store
gcsfs, aiohttp and google-cloud-storage, before it can run a step: about 1.5 CPU seconds per worker, 18 of the
50 CPU seconds of a 1,000-step no-op run on `gs://` with 16 workers. So in `auto` the workers come from a
*spawn server* (multiprocessing's `forkserver`): one fresh interpreter, started at the first worker, that
imports the engine and the storage libraries this process has loaded and then forks each worker off itself.
The server runs no other thread, so its forks inherit no held lock; it imports no user module, so a worker
still imports the step's module (and the script, as a spawned worker does) afresh, building its own objects
(an async filesystem made at import time included). A worker of the server gets the executor's environment
of the moment it starts; the server is used only while this process's standard output and error are the ones
it was started with and no variable that libraries read at import time (`FSSPEC_*`, `STORAGE_EMULATOR_HOST`,
...) changed since (`_server_matches`): otherwise that worker is a plain spawned interpreter.
`MARIN_LOCAL_START=spawn` always starts plain spawned interpreters, one per worker.

fsspec's IO thread (`fsspecIO`, started by the first call to gcsfs, s3fs or any async filesystem) counts like
any other. fsspec drops its own loop and thread in a forked child, but an async filesystem object created
before the fork and still held (a step module's `HTTP = fsspec.filesystem("http")` at import time) refuses to
work in the child ("This class is not fork-safe"), while a spawned worker imports the module afresh and builds
its own. On a `gs://` or `s3://` prefix the plan has started that thread, so workers are spawned there;
`MARIN_LOCAL_START=fork` forks them anyway for steps that hold no such object (a 200-step no-op fan-out on
fake-gcs-server at 30 ms per request: 90 -> 22 s wall, 25.2 -> 6.6 CPU s, load 12-17; each spawned worker
imports marin, gcsfs and aiohttp, about 1 CPU second).

Threads outside Python (a C library's pool, such as OpenBLAS's after `import numpy`) are not counted:
they are invisible to `threading`, and the common ones re-initialise themselves in a forked child
(`pthread_atfork`). JAX's are the exception that matters, hence its own check.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.context
import os
import re
import subprocess
import sys
import threading
from typing import Any

ENV = "MARIN_LOCAL_START"
METHODS = ("auto", "fork", "spawn")
OWN_THREAD_PREFIX = "marin-"  # the engine's own threads; they hold none of the locks a worker needs


_INSTANCE_SUFFIX = re.compile(r"([-_ ]?(?:0x)?[0-9a-f]*\d[0-9a-f]*)?( \(.*\))?$")


_MOST_FAMILIES = 24  # kinds of thread named; a process rarely has more (one test-suite worker had 9)


def _families(names: list[str]) -> str:
    """Thread names grouped by family ("asyncio-portal-7f01..." and "asyncio-portal-7f02..." are one family,
    shown once with its count), so a pool of many threads cannot push the one odd thread out of the text."""
    counts: dict[str, int] = {}
    for name in names:
        family = _INSTANCE_SUFFIX.sub("", name) or name
        counts[family] = counts.get(family, 0) + 1
    ordered = sorted(counts, key=lambda f: (counts[f], f))
    shown = [f if counts[f] == 1 else f"{f} x{counts[f]}" for f in ordered[:_MOST_FAMILIES]]
    more = len(ordered) - _MOST_FAMILIES
    return ", ".join(shown) + (f", and {more} more kinds" if more > 0 else "")


def fork_hazard() -> str | None:
    """Why forking this process now could hand the child a lock held forever; None when nothing is known."""
    here = threading.current_thread()
    others = [t.name for t in threading.enumerate()
              if t is not here and not t.name.startswith(OWN_THREAD_PREFIX)]
    reasons = []
    if others:
        reasons.append(f"{len(others)} other thread(s) run in this process ({_families(others)})")
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    if backends:
        reasons.append(f"JAX's runtime is started in this process (backends: {', '.join(sorted(backends))})")
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        reasons.append("Ray is initialised in this process")
    return "; ".join(reasons) or None


def start_method() -> tuple[str, str | None]:
    """(`fork` or `spawn`, why spawn when it was chosen for a hazard) for the next worker."""
    chosen = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if chosen not in METHODS:
        raise ValueError(f"{ENV}={chosen!r} is not a start method of the local backend; use one of "
                         f"{', '.join(METHODS)} (auto: fork unless forking this process is unsafe)")
    if chosen != "auto":
        return chosen, f"{ENV}={chosen}" if chosen == "spawn" else None
    hazard = fork_hazard()
    return ("spawn", hazard) if hazard else ("fork", None)


def refuse_while_spawning() -> None:
    """Raise if this process is a spawned worker still importing its parent's main module: a script that runs
    its experiment at import time (no `if __name__ == "__main__"` guard) would otherwise start the same run
    again inside its own worker, which then waits forever for the step lease its parent holds."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "an experiment was started while a local-backend worker process imported the script's main "
            "module (workers are spawned, not forked, when forking the executor is unsafe: "
            "marin/execution/start_method.py); guard the script's run with `if __name__ == \"__main__\":`")


SERVER_PRELOAD = ("marin.execution.local_backend", "gcsfs", "google.cloud.storage", "s3fs", "adlfs")
"""What the spawn server imports before it forks a worker: those of these this process has imported (the
engine's worker side, and the prefix's storage libraries) that the server finds where this process did
(`_found_alike_by_server`)."""

_server: dict[str, Any] = {}  # the spawn server this process started: what it was started with


def _stdio() -> tuple[tuple[int, int] | None, ...]:
    """Which files standard output and error are (device, inode): a worker of the server writes to the ones
    the server was started with."""
    def ident(fd: int) -> tuple[int, int] | None:
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    return ident(1), ident(2)


def _server_matches() -> bool:
    """The spawn server was started from this process's present environment and standard streams."""
    return _server.get("environ") == dict(os.environ) and _server.get("stdio") == _stdio()


_PROBE = """
import importlib.util, json, sys
found = {}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name.split(".")[0])
    if spec is not None and spec.origin is None:  # a namespace package (google): the module itself
        spec = importlib.util.find_spec(name)
    found[name] = spec.origin if spec is not None else None
print(json.dumps(found))
"""


def _origin_here(name: str) -> str | None:
    """Where this process found `name`: its top-level package's file, or for a namespace package (no file)
    the module's own; the probe (`_PROBE`) answers the same for the server."""
    top = sys.modules.get(name.split(".")[0])
    origin = getattr(top, "__file__", None) or getattr(sys.modules.get(name), "__file__", None)
    return os.path.realpath(origin) if isinstance(origin, str) else None


def _found_alike_by_server(names: list[str]) -> list[str]:
    """Those of `names` (imported here) that the spawn server would import from where this process did.
    The server is `python -c` started in this directory, and on Python 3.11 it imports its preloads on its
    own search path (this directory first, then PYTHONPATH and the site's), not on this process's: a second
    checkout in this directory, or a path this process changed at run time, would give it other code. A
    fresh interpreter started as the server is (same directory, environment and flags) says where it finds
    each; what it would find elsewhere is not preloaded, and a worker imports it itself on this process's
    path."""
    here = {n: _origin_here(n) for n in names}
    asked = [n for n in names if here[n] is not None]
    if not asked:
        return []
    # the interpreter's flags, as multiprocessing starts the server
    flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
    try:
        done = subprocess.run([sys.executable, *flags, "-c", _PROBE, *asked], capture_output=True, text=True,
                              timeout=60, check=True)
        there = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    return [n for n in asked if isinstance(there.get(n), str) and os.path.realpath(there[n]) == here[n]]


def fresh_context(forced: bool) -> tuple[multiprocessing.context.SpawnContext
                                         | multiprocessing.context.ForkServerContext, str]:
    """The multiprocessing context a spawned worker is started with, and how that is said: the spawn server
    (see the module docstring) when it can be used, else a plain spawned interpreter (always when `forced`,
    i.e. MARIN_LOCAL_START=spawn)."""
    plain = multiprocessing.context.SpawnContext(), "each a fresh interpreter"
    if forced or "forkserver" not in multiprocessing.get_all_start_methods():
        return plain
    context = multiprocessing.context.ForkServerContext()
    if not _server:
        loaded = [m for m in SERVER_PRELOAD if m in sys.modules]
        context.set_forkserver_preload(_found_alike_by_server(loaded))
        _server.update(environ=dict(os.environ), stdio=_stdio())
    elif not _server_matches():
        return plain
    return context, "forked from one fresh interpreter that imported the engine and its storage libraries"
