"""Leases: one executor runs a step; others wait, then reuse its result.

A lease is `{output_path}/.marin/lease.json` = `{"owner", "acquired", "heartbeat", "timeout_s", "attempt"}`.
It is created with an exclusive create; one heartbeat thread per executor renews every lease it holds with a
compare-and-swap; a lease whose heartbeat is older than its `timeout_s` is stale and may be taken over (again
by compare-and-swap, so of two executors racing for a stale lease exactly one wins). Only the owner releases
its lease (or the worker running the step for it, right after writing SUCCESS), after the step's final status
is written, and release is itself conditional on the lease still being the owner's: a heartbeat can never
resurrect a released lease, and a release can never delete someone else's lease (the marin#5026 class of bug).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from marin.storage.base import Storage, Versioned, aside_name


@dataclasses.dataclass(frozen=True)
class ProcessId:
    """Which process holds a lease, precisely enough for a process on the same machine to prove it is gone:
    the host name, the kernel's boot id and pid namespace (a pid means the same process only within both),
    the pid and the process's start time (clock ticks since boot: a reused pid has another)."""

    host: str
    boot: str
    pid_ns: int
    pid: int
    start: int

    @staticmethod
    def current() -> ProcessId | None:
        """This process (None where /proc cannot say: not Linux)."""
        pid = os.getpid()
        if pid not in _CURRENT:
            _CURRENT.clear()  # a forked child is another process
            start = _start_time(pid)
            try:
                with open("/proc/sys/kernel/random/boot_id") as f:
                    boot = f.read().strip()
                pid_ns = os.stat("/proc/self/ns/pid").st_ino
            except OSError:
                start = None
            host = socket.gethostname()
            _CURRENT[pid] = None if start is None else ProcessId(host, boot, pid_ns, pid, start)
        return _CURRENT[pid]

    @classmethod
    def parse(cls, data: Any) -> ProcessId | None:
        try:
            return cls(str(data["host"]), str(data["boot"]), int(data["pid_ns"]), int(data["pid"]),
                       int(data["start"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "boot": self.boot, "pid_ns": self.pid_ns, "pid": self.pid,
                "start": self.start}

    def gone(self) -> str | None:
        """Why this process is provably gone, or None: only a process on this machine (same host, boot and
        pid namespace) can be proved gone - its pid is free, a zombie, or another process's now."""
        here = ProcessId.current()
        if here is None or (self.host, self.boot, self.pid_ns) != (here.host, here.boot, here.pid_ns):
            return None
        start = _start_time(self.pid)
        if start is None:
            return f"its process {self.pid} on {self.host} is gone"
        if start != self.start:
            return f"its process {self.pid} on {self.host} is gone (the pid now names another process)"
        return None


_CURRENT: dict[int, ProcessId | None] = {}


def _start_time(pid: int) -> int | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), None if there is none or it is a
    zombie (it died; its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    owner: str
    acquired: float
    heartbeat: float
    timeout_s: float
    attempt: int
    process: ProcessId | None = None  # the owner's process, when its platform can say (ProcessId)
    # how long the owner's attempts may outlive its process (0: they die with it, as the local backend's
    # forked workers do; Ray's workers live until Ray notices their driver gone)
    outlive_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LeaseInfo | None:
        try:
            data = json.loads(text)
            return cls(
                owner=str(data["owner"]),
                acquired=float(data["acquired"]),
                heartbeat=float(data["heartbeat"]),
                timeout_s=float(data["timeout_s"]),
                attempt=int(data.get("attempt", 0)),
                process=ProcessId.parse(data.get("process")),
                outlive_s=float(data.get("outlive_s", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            return None  # unreadable (e.g. truncated by a non-atomic store): treated as stale

    def is_stale(self, now: float) -> bool:
        return now - self.heartbeat > self.timeout_s

    def lost(self, now: float) -> str | None:
        """Why the lease may be taken over now, or None while its owner may be alive: its owner's process is
        provably gone (same machine: at once), or its heartbeat is older than its timeout (any machine)."""
        gone = self.process.gone() if self.process is not None else None
        if gone is not None:
            return gone
        return f"no heartbeat for {now - self.heartbeat:.0f} s" if self.is_stale(now) else None

    def to_json(self) -> str:
        # An explicit dict: dataclasses.asdict deep-copies field by field, a cost paid on every step's lease.
        data: dict[str, Any] = {"owner": self.owner, "acquired": self.acquired, "heartbeat": self.heartbeat,
                                "timeout_s": self.timeout_s, "attempt": self.attempt}
        if self.process is not None:
            data["process"] = self.process.to_dict()
        if self.outlive_s:
            data["outlive_s"] = self.outlive_s
        return json.dumps(data)


@dataclasses.dataclass(frozen=True)
class Acquired:
    """Outcome of `try_acquire`: `ok`, else the live `holder`; `previous_owner` is set on a takeover."""

    ok: bool
    holder: LeaseInfo | None = None
    previous_owner: str | None = None
    previous: LeaseInfo | None = None  # on a takeover: the lease taken over (None: it was unreadable)
    why: str = ""  # on a takeover: why the previous owner was judged lost (LeaseInfo.lost)


class LeaseManager:
    """Acquires, renews (one heartbeat thread) and releases the leases one executor holds."""

    def __init__(
        self,
        storage: Storage,
        owner: str,
        timeout_s: float,
        on_lost: Callable[[str], None] = lambda path: None,
        outlive_s: float = 0.0,
    ) -> None:
        self.storage = storage
        self.owner = owner
        self.timeout_s = timeout_s
        self.outlive_s = outlive_s  # written into our leases (LeaseInfo.outlive_s)
        # (path, owner, acquired) -> when this manager first saw that owner's process gone
        self._gone_since: dict[tuple[str, str, float], float] = {}
        self.on_lost = on_lost
        self._held: dict[str, tuple[Any, LeaseInfo]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new(self, attempt: int, acquired: float | None = None) -> LeaseInfo:
        now = time.time()
        return LeaseInfo(self.owner, acquired or now, now, self.timeout_s, attempt, ProcessId.current(),
                         self.outlive_s)

    def try_acquire(self, path: str, attempt: int) -> Acquired:
        for _ in range(5):  # the lease may vanish between our create and our read: try again
            lease = self._new(attempt)
            text = lease.to_json()
            created, token = self.storage.create_versioned(path, text)
            if created:
                # Locally the token is the text we just wrote; S3 and GCS answer the create with the
                # ETag/generation; other stores need a read for it.
                versioned = (Versioned(text, token) if token is not None
                             else self._version_after_write(path, text))
                self._remember(path, versioned, lease)
                return Acquired(True)
            current = self._read(path)
            if current is None:
                continue
            holder = LeaseInfo.parse(current.text)
            why = self._lost(path, holder) if holder is not None else "the lease file was unreadable"
            if why is None:
                return Acquired(False, holder=holder)
            if self.storage.replace_if(path, text, current.token):
                versioned = self._version_after_write(path, text)
                self._remember(path, versioned, lease)
                return Acquired(True, previous_owner=holder.owner if holder else "<unreadable lease>",
                                previous=holder, why=why)
        current = self._read(path)
        holder = LeaseInfo.parse(current.text) if current else None
        return Acquired(False, holder=holder)

    def _lost(self, path: str, holder: LeaseInfo) -> str | None:
        """`holder.lost`, except that an owner whose attempts may outlive its process (`outlive_s`) is lost
        only once this manager has seen its process gone for that long (or its lease went stale)."""
        now = time.time()
        why = holder.lost(now)
        if why is None or not holder.outlive_s or holder.is_stale(now):
            return why
        first = self._gone_since.setdefault((path, holder.owner, holder.acquired), now)
        if now - first < holder.outlive_s:
            return None
        return f"{why}, for {now - first:.0f} s"

    def _read(self, path: str) -> Versioned | None:
        """The lease file; one that is not even text (binary bytes) is moved aside, named, and reads as
        absent: no live owner writes such a file, and its bytes are kept (marin/status/damaged.py)."""
        try:
            return self.storage.read_versioned(path)
        except UnicodeDecodeError as e:
            aside = aside_name(path)
            try:
                self.storage.move(path, aside)
            except FileNotFoundError:  # another taker moved it first
                return None
            print(f"marin: the lease {path} was not text ({e}); moved to {aside}", file=sys.stderr)
            return None

    def _version_after_write(self, path: str, text: str) -> Versioned | None:
        """The version of the lease file we just wrote with `text` (its text locally; a read elsewhere)."""
        return Versioned(text, text) if self.storage.is_local else self.storage.read_versioned(path)

    def _remember(self, path: str, versioned: Any, lease: LeaseInfo) -> None:
        token = versioned.token if versioned is not None else lease.to_json()
        with self._lock:  # leases are taken from several threads at once (executor.py `_start_ready`)
            self._held[path] = (token, lease)
            self._ensure_thread()

    def _current_if_mine(self, path: str, lease: LeaseInfo) -> Versioned | None:
        """The lease file at `path` if it is still the lease we acquired (same owner and acquisition time, at
        whatever heartbeat), read now; None if it is gone or another's. Its identity, not the version token we
        last saw, decides: a renewal whose write landed but whose reply or re-read was lost leaves us an old
        token for a lease that is still ours."""
        current = self.storage.read_versioned(path)
        found = LeaseInfo.parse(current.text) if current is not None else None
        if current is None or found is None or (found.owner, found.acquired) != (lease.owner, lease.acquired):
            return None
        return current

    def holds(self, path: str) -> bool:
        """True if the lease at `path` is still ours right now (checked against storage)."""
        with self._lock:
            entry = self._held.get(path)
            return entry is not None and self._current_if_mine(path, entry[1]) is not None

    def acquired_at(self, path: str) -> float | None:
        """When we acquired the lease at `path` (it identifies this holding of it), or None if we hold
        none."""
        with self._lock:
            entry = self._held.get(path)
            return entry[1].acquired if entry is not None else None

    def release(self, path: str) -> bool:
        """Delete our lease (only if it is still ours). Returns False if we had lost it."""
        with self._lock:
            entry = self._held.pop(path, None)
            if entry is None:
                return False
            if self.storage.delete_if(path, entry[0]):
                return True
            current = self._current_if_mine(path, entry[1])  # ours under a token we did not learn?
            return current is not None and self.storage.delete_if(path, current.token)

    def forget(self, path: str) -> None:
        """Stop renewing the lease at `path` without touching storage: a worker released it on our behalf."""
        with self._lock:
            self._held.pop(path, None)

    def renew_all(self) -> None:
        for path in list(self._held):
            try:
                if self._renew(path):
                    self.on_lost(path)
            except Exception as exc:  # this lease only (e.g. a request that timed out): the others renew
                print(f"marin: renewing the lease {path} failed, retrying next beat: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)

    def _renew(self, path: str) -> bool:
        """Renew one lease by compare-and-swap; True if it turned out to be lost."""
        with self._lock:
            entry = self._held.get(path)
            if entry is None:
                return False
            token, lease = entry
            for _ in range(2):
                renewed = dataclasses.replace(lease, heartbeat=time.time())
                text = renewed.to_json()
                if self.storage.replace_if(path, text, token):
                    fresh = self._version_after_write(path, text)
                    self._held[path] = (fresh.token if fresh else text, renewed)
                    return False
                current = self._current_if_mine(path, lease)  # refused: still ours under an unknown token?
                if current is None:
                    break
                token = current.token
            self._held.pop(path, None)
            return True

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="marin-lease-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.timeout_s / 4):
            self.renew_all()  # never raises: a lease that fails to renew is retried next beat

    def stop(self) -> None:
        """Stop the heartbeat (leases still held become stale after their timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
