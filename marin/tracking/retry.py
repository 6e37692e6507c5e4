"""The retry policy for tracker calls: which failures are transient, and how long to wait before trying again.

Transient: network errors (connection refused/reset/dropped, timeouts), HTTP 5xx, and rate limits (429, or 403
carrying ``Retry-After`` / ``X-RateLimit-Remaining: 0`` / GitHub's rate-limit message). Everything else (401,
404, 422, other 403s) fails at once: retrying cannot fix it. Between attempts the policy waits with
exponential backoff plus jitter; for a rate limit it waits what the server asked (``Retry-After`` seconds, or
until ``X-RateLimit-Reset``) unless that is longer than ``max_rate_limit_wait_s``, in which case it gives up
at once rather than stall the run. Waits go through an abort event so a background flusher can be stopped
mid-wait when the final publish takes over.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


class RetryAborted(Exception):
    """The abort event was set while waiting to retry."""


@dataclass(frozen=True)
class Transient:
    """A classified transient failure: ``wait_s`` is the server-requested wait (rate limits), else None."""

    reason: str
    wait_s: float | None = None


@dataclass(frozen=True)
class BackoffPolicy:
    max_attempts: int = 5
    """Attempts per call, the first included."""
    base_delay_s: float = 1.0
    """Backoff before the second attempt; doubles each time."""
    max_delay_s: float = 30.0
    """Cap on one backoff wait."""
    max_rate_limit_wait_s: float = 120.0
    """Longest wait honoured for a rate limit; a longer reset time fails the call at once."""
    sleep: Callable[[float], None] | None = field(default=None, compare=False)
    """Replaces the abortable wait (tests record the waits instead of sleeping)."""

    def backoff(self, attempt: int) -> float:
        """Wait after failed attempt ``attempt`` (1-based): exponential with up to 25% jitter."""
        delay: float = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        return delay * (1 + 0.25 * random.random())

    def run(
        self,
        call: Callable[[], T],
        classify: Callable[[BaseException], Transient | None],
        on_give_up: Callable[[BaseException, str], Exception],
        abort: threading.Event | None = None,
    ) -> T:
        """Run ``call`` until it succeeds, a failure is not transient, or attempts run out.

        ``classify`` says whether an exception is transient; ``on_give_up(exc, why)`` builds the exception
        raised when retrying stops (non-transient failures are re-raised through it too).
        """
        for attempt in range(1, self.max_attempts + 1):
            try:
                return call()
            except Exception as exc:
                transient = classify(exc)
                if transient is None:
                    raise on_give_up(exc, "not retryable") from None
                if attempt == self.max_attempts:
                    raise on_give_up(exc, f"{transient.reason}; gave up after {attempt} attempts") from None
                if transient.wait_s is not None and transient.wait_s > self.max_rate_limit_wait_s:
                    why = (f"{transient.reason}; the server asks to wait {transient.wait_s:.0f}s, more than "
                           f"max_rate_limit_wait_s={self.max_rate_limit_wait_s:.0f}s")
                    raise on_give_up(exc, why) from None
                delay = transient.wait_s if transient.wait_s is not None else self.backoff(attempt)
                self._wait(max(0.0, delay), abort)
        raise AssertionError("unreachable: the loop returns or raises")

    def _wait(self, seconds: float, abort: threading.Event | None) -> None:
        if abort is not None and abort.is_set():
            raise RetryAborted()
        if self.sleep is not None:
            self.sleep(seconds)
        elif abort is not None:
            if abort.wait(seconds):
                raise RetryAborted()
        else:
            time.sleep(seconds)
