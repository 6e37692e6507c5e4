"""The dashboard's one bounded cache: entries kept least recently used first out within a byte budget.

Used by the metrics reader (parsed metrics.jsonl columns, marin/dashboard/metrics.py) and by the results cache
(each experiment's verdict, headline and results, marin/dashboard/results.py). Each entry is counted by the
`cost` function the cache was built with (an estimate of its memory, of the right order: the budget is what
bounds the cache, not an exact figure), once when it is put; a value that grows in place is put again after
it grew (the metrics reader does), which counts it anew.

An entry larger than the whole budget is not kept (an older entry of its key is dropped) and evicts nothing:
keeping it would first push every other entry out and then drop it too. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLru(Generic[K, V]):
    """See the module docstring. `max_bytes` may be changed at any time; it applies from the next `put`."""

    def __init__(self, max_bytes: int, cost: Callable[[V], int]):
        self.max_bytes = max_bytes
        self.bytes = 0  # the sum of the kept entries' costs
        self._cost = cost
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept for `key` (now the most recently used), or None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V) -> None:
        """Keep `value` as the most recently used, then drop the least recently used over the budget."""
        cost = self._cost(value)
        with self._lock:
            old = self._entries.pop(key, None)
            self.bytes -= old[1] if old else 0
            if cost > self.max_bytes:
                return
            self._entries[key] = (value, cost)
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped

    def cached(self) -> list[K]:
        """The kept keys, least recently used first."""
        with self._lock:
            return list(self._entries)
