"""The dashboard server's garbage-collector policy: full collections that do not stall every request.

The dashboard keeps what it parsed (manifests, status and result records, metrics columns) in memory, so its
heap holds hundreds of thousands of container objects after a few hundred pages of a large prefix. CPython's
full (generation 2) collection walks every one of them with the GIL held: 80-120 ms of CPU on the
1,000-experiment benchmark prefix (docs/benchmarks/dashboard.md), during which every request in flight waits;
the heap's growth triggers one each time it grows by a quarter.

`install()` (called by `marin dashboard` for its own process only, never by `create_app`: a process that
embeds the app keeps its collector as it is) adds a callback that, after each full collection, moves the
survivors into the permanent generation (`gc.freeze`): a full collection has just freed every unreachable
cycle, so what is frozen was live; later full collections walk only what was allocated since. An object
frozen while live that later becomes part of an unreachable cycle would not be collected, so once every
`full_every_s` (an hour) the callback unfreezes everything instead and the next full collection walks the
whole heap again, bounding what can be held that way. Objects without cycles (nearly all of the cache: parsed
JSON) are freed by reference counting whether frozen or not.
"""

from __future__ import annotations

import gc
import time
from typing import Any

FULL_EVERY_S = 3600.0


class FreezeAfterFullCollection:
    """The `gc.callbacks` entry (see the module docstring)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self.full_every_s = full_every_s
        self.last_unfreeze = time.monotonic()
        self.freezes = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        now = time.monotonic()
        if now - self.last_unfreeze >= self.full_every_s:
            self.last_unfreeze = now
            gc.unfreeze()  # the next full collection walks everything again
            return
        gc.freeze()
        self.freezes += 1


def install(full_every_s: float = FULL_EVERY_S) -> FreezeAfterFullCollection:
    """Add the policy to this process's collector (once) and return it."""
    for cb in gc.callbacks:
        if isinstance(cb, FreezeAfterFullCollection):
            return cb
    policy = FreezeAfterFullCollection(full_every_s)
    gc.callbacks.append(policy)
    return policy
