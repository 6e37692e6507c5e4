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
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from marin.storage.base import Storage, Versioned


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    owner: str
    acquired: float
    heartbeat: float
    timeout_s: float
    attempt: int

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
            )
        except (ValueError, KeyError, TypeError):
            return None  # unreadable (e.g. truncated by a non-atomic store): treated as stale

    def is_stale(self, now: float) -> bool:
        return now - self.heartbeat > self.timeout_s

    def to_json(self) -> str:
        # An explicit dict: dataclasses.asdict deep-copies field by field, a cost paid on every step's lease.
        return json.dumps({"owner": self.owner, "acquired": self.acquired, "heartbeat": self.heartbeat,
                           "timeout_s": self.timeout_s, "attempt": self.attempt})


@dataclasses.dataclass(frozen=True)
class Acquired:
    """Outcome of `try_acquire`: `ok`, else the live `holder`; `previous_owner` is set on a takeover."""

    ok: bool
    holder: LeaseInfo | None = None
    previous_owner: str | None = None


class LeaseManager:
    """Acquires, renews (one heartbeat thread) and releases the leases one executor holds."""

    def __init__(
        self,
        storage: Storage,
        owner: str,
        timeout_s: float,
        on_lost: Callable[[str], None] = lambda path: None,
    ) -> None:
        self.storage = storage
        self.owner = owner
        self.timeout_s = timeout_s
        self.on_lost = on_lost
        self._held: dict[str, tuple[Any, LeaseInfo]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new(self, attempt: int, acquired: float | None = None) -> LeaseInfo:
        now = time.time()
        return LeaseInfo(self.owner, acquired or now, now, self.timeout_s, attempt)

    def try_acquire(self, path: str, attempt: int) -> Acquired:
        for _ in range(5):  # the lease may vanish between our create and our read: try again
            lease = self._new(attempt)
            text = lease.to_json()
            if self.storage.create_exclusive(path, text):
                # Locally the token is the text we just wrote; object stores need a read for the
                # ETag/generation.
                versioned = self._version_after_write(path, text)
                self._remember(path, versioned, lease)
                return Acquired(True)
            current = self.storage.read_versioned(path)
            if current is None:
                continue
            holder = LeaseInfo.parse(current.text)
            if holder is not None and not holder.is_stale(time.time()):
                return Acquired(False, holder=holder)
            if self.storage.replace_if(path, text, current.token):
                versioned = self._version_after_write(path, text)
                self._remember(path, versioned, lease)
                return Acquired(True, previous_owner=holder.owner if holder else "<unreadable lease>")
        current = self.storage.read_versioned(path)
        holder = LeaseInfo.parse(current.text) if current else None
        return Acquired(False, holder=holder)

    def _version_after_write(self, path: str, text: str) -> Versioned | None:
        """The version of the lease file we just wrote with `text` (its text locally; a read elsewhere)."""
        return Versioned(text, text) if self.storage.is_local else self.storage.read_versioned(path)

    def _remember(self, path: str, versioned: Any, lease: LeaseInfo) -> None:
        token = versioned.token if versioned is not None else lease.to_json()
        with self._lock:
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
