"""The worker side of a step: capture stdout/stderr into the attempt's log, call `fn(config)`, report back.

The same function runs in a forked local process and inside a Ray task. It never touches status files or
leases (the executor that holds the lease writes those), so a worker can only ever produce output and a log.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Credentials the platform itself uses (the issue tracker's token). A step never sees them unless its own `env`
# passes one explicitly, so a step that prints its environment cannot leak them into its log.
PLATFORM_SECRETS = ("GITHUB_TOKEN", "GH_TOKEN")


@contextlib.contextmanager
def capture_output(log_file: str) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so subprocesses too) to `log_file`."""
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    # Python-level streams too: a test runner or a Ray worker may have replaced sys.stdout with its own object.
    stream = open(log_file, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = stream
        yield
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        sys.stdout, sys.stderr = saved_streams
        stream.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def error_record(exc: BaseException) -> dict[str, Any]:
    """A JSON-able description of an exception, plus the pickled exception when it can be pickled."""
    record: dict[str, Any] = {
        "ok": False,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    try:
        record["exception"] = pickle.dumps(exc)
    except Exception:  # unpicklable exception types still report type, message and traceback
        record["exception"] = None
    return record


def execute_step(
    fn: Callable[[Any], Any],
    config: Any,
    log_path: str,
    env: Mapping[str, str],
    sys_path: list[str] | None = None,
) -> dict[str, Any]:
    """Run one attempt of a step; never raises (the outcome is returned as a dict).

    `log_path` is the attempt's log file; when it is not a local path (an object store), output is captured
    into a local temporary file that is uploaded when the attempt ends.
    """
    for p in reversed(sys_path or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    remote_log = "://" in log_path and not log_path.startswith("file://")
    if remote_log:
        handle, local_log = tempfile.mkstemp(prefix="marin-attempt-", suffix=".log")
        os.close(handle)
    else:
        local_log = log_path
    hidden = [k for k in PLATFORM_SECRETS if k not in env and k in os.environ]
    saved_env = {k: os.environ.get(k) for k in (*env, *hidden)}
    for k in hidden:
        del os.environ[k]
    os.environ.update(env)
    started = time.time()
    try:
        with capture_output(local_log):
            try:
                fn(config)
                result: dict[str, Any] = {"ok": True}
            except BaseException as exc:  # reported to the executor, which writes FAILED and re-raises there
                traceback.print_exc()
                result = error_record(exc)
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    result["started"] = started
    result["ended"] = time.time()
    if remote_log:
        from marin.storage.fs import storage_for

        storage_for(log_path).upload_file(local_log, log_path)
        os.unlink(local_log)
    return result
