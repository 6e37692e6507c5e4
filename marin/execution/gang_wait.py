"""A gang waiting for capacity, shown as waiting everywhere: status.json, `marin status`, the dashboard, the
issue and the driver's console.

A gang attempt reserves all its hosts at once (gang.py); after a node loss the cluster may have fewer hosts
than the gang needs until a replacement joins, which can take minutes. While the reservation waits longer
than `NOTICE_S`, the gang's supervisor (on the driver's node):
- writes the attempt's status as WAITING with `"waiting": "waiting for 2 hosts with 1 CPU each; 1 available"`
  and a WAITING event carrying the same text (again whenever the text changes while fewer hosts than the gang
  needs are free: once enough are, the reservation is only being made), under the executor's lease
  and only while the lease still names the executor's holding (as the worker does, worker.py);
- publishes the text in Ray's internal key-value store under the attempt's name, and removes it when the
  hosts are reserved (rank 0 then writes RUNNING).
The driver's Ray backend polls those keys for its gang attempts in flight (`GangWaits`, one get per gang a
second; nothing when no gang runs) and reports each change to the executor (`Waiting`), which prints it on
the console and shows the step as WAITING to the publishers (the issue comment) until the hosts are there.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from marin.execution.attempt import StepRecord
from marin.status import files as sf
from marin.storage.fs import storage_for
from marin.storage.lease import LeaseInfo

NOTICE_S = 2.0  # a reservation that takes longer than this is shown as waiting
POLL_S = 1.0  # how often the supervisor re-checks the cluster, and the driver the waiting texts
KEY_PREFIX = "waiting:"


def _describe(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(bundle.items()) if v) or "no resources"


def fitting_hosts(bundle: dict[str, float], free: list[dict[str, float]]) -> int:
    """How many nodes could take one member now (`free`: each alive node's free resources)."""
    return sum(1 for n in free if all(n.get(k, 0.0) >= v for k, v in bundle.items()))


def waiting_text(size: int, bundle: dict[str, float], free: list[dict[str, float]]) -> str:
    """'waiting for 2 hosts with 1 CPU each; 1 available': the gang's request and how many nodes could take
    one member now (`free`: each alive node's free resources, `free_per_node`)."""
    return f"waiting for {size} hosts with {_describe(bundle)} each; {fitting_hosts(bundle, free)} available"


def free_per_node(ray: Any) -> list[dict[str, float]]:
    """Every alive node's free resources (Ray's per-node availability; each node's total where that is not
    offered)."""
    try:
        from ray._private.state import available_resources_per_node

        per_node: dict[str, dict[str, Any]] = available_resources_per_node()  # type: ignore[no-untyped-call]
        return [{k: float(v) for k, v in r.items()} for r in per_node.values()]
    except (ImportError, AttributeError):  # a Ray without it: what the nodes have at all
        alive = [n for n in ray.nodes() if n.get("Alive")]
        return [{k: float(v) for k, v in n.get("Resources", {}).items()} for n in alive]


def record_waiting(record: StepRecord, text: str) -> bool:
    """Write the attempt's WAITING status and event (see the module docstring); False if the executor no
    longer holds the step's lease (nothing written)."""
    storage = storage_for(record.output_path)
    lease_text = storage.read_text(sf.lease_path(record.output_path))
    holder = LeaseInfo.parse(lease_text) if lease_text else None
    if holder is None or holder.owner != record.executor or (
            record.lease_acquired is not None and holder.acquired != record.lease_acquired):
        return False
    sf.write_status(storage, record.output_path, name=record.name, hash=record.hash, status=sf.WAITING,
                    attempt=record.attempt, run_id=record.run_id, executor=record.executor,
                    previous={"created": record.created}, waiting=text)
    sf.append_event(storage, record.output_path, sf.WAITING, attempt=record.attempt, run_id=record.run_id,
                    executor=record.executor, message=text, waiting=text)
    return True


def wait_for_hosts(ray: Any, ready: Any, size: int, bundle: dict[str, float],
                   record_of: Callable[[], StepRecord | None], key: str, kv: Any) -> None:
    """Wait for the placement group's `ready` reference; after NOTICE_S, record and publish what the gang
    waits for (each change once), and withdraw it when the hosts are reserved. `record_of` gives the
    attempt's status record (unpickled only once the gang has to wait)."""
    done, _ = ray.wait([ready], timeout=NOTICE_S)
    shown = None
    record = record_of() if not done else None
    try:
        while not done:
            free = free_per_node(ray)
            text = waiting_text(size, bundle, free)
            # enough hosts free: the reservation is being made (or Ray has not yet seen a node die); a text
            # saying "3 of 3 available" while still waiting would only confuse, so nothing new is shown
            if text != shown and fitting_hosts(bundle, free) < size:
                kv.put(KEY_PREFIX + key, text)
                if record is not None:
                    record_waiting(record, text)
                shown = text
            done, _ = ray.wait([ready], timeout=POLL_S)
        ray.get(ready)
    finally:
        if shown is not None:
            kv.del_(KEY_PREFIX + key)


class GangWaits:
    """The driver's side: polls the waiting texts of its gang attempts in flight and reports each change
    through `report(step key, attempt, text or None)`."""

    def __init__(self, kv: Callable[[], Any], report: Callable[[str, int, str | None], None],
                 poll_s: float = POLL_S) -> None:
        self._kv_factory = kv
        self._poll_s = poll_s
        self._report = report
        self._attempts: dict[str, tuple[str, int]] = {}  # step key -> (attempt name, attempt number)
        self._shown: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, key: str, name: str, attempt: int) -> None:
        with self._lock:
            self._attempts[key] = (name, attempt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="marin-gang-waits", daemon=True)
                self._thread.start()

    def discard(self, key: str) -> None:
        """The attempt of `key` ended: stop polling it (and clear what was shown)."""
        with self._lock:
            _, attempt = self._attempts.pop(key, ("", 0))
            shown = self._shown.pop(key, None)
        if shown is not None:
            self._report(key, attempt, None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        kv = self._kv_factory()
        while not self._stop.wait(self._poll_s):
            with self._lock:
                attempts = dict(self._attempts)
            for key, (name, attempt) in attempts.items():
                try:
                    text = kv.get(KEY_PREFIX + name)
                except Exception as exc:  # a passing GCS error: ask again next time
                    print(f"marin: reading a gang's waiting state failed: {exc}", file=sys.stderr)
                    continue
                if text != self._shown.get(key):
                    self._shown[key] = text
                    self._report(key, attempt, text)


def waiting_line(name: str, attempt: int, text: str | None, since: float | None = None) -> str:
    """The driver's console line for a change of a gang's waiting state."""
    if text is None:
        waited = f" after {time.time() - since:.0f} s" if since else ""
        return f"marin: step {name} attempt {attempt}: hosts reserved{waited}; starting"
    return f"marin: step {name} attempt {attempt}: {text}"
