"""A circuit breaker with exponential back-off, shared by the trace recorder and the sidecar.

After a failure the breaker opens: callers skip the dependency until ``retry_after`` seconds
have passed (doubling per consecutive failure up to ``max_retry_after``). Then exactly one
caller is let through as a probe (half-open); its success closes the breaker, its failure
opens it again for longer. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """``allow()`` says whether to call the dependency now; report with ``success()`` /
    ``failure()``. ``clock`` is ``time.monotonic`` unless a test passes another."""

    def __init__(
        self, retry_after: float = 2.0, max_retry_after: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._base = retry_after
        self._max = max_retry_after
        self._clock = clock
        self._lock = threading.Lock()
        self._backoff = retry_after
        self._open_until = 0.0
        self._failures = 0
        self._probing = False
        self.last_error: str | None = None

    @property
    def is_open(self) -> bool:
        """True after a failure, until a call succeeds again."""
        with self._lock:
            return self._failures > 0

    @property
    def failures(self) -> int:
        """Consecutive failures so far (0 when closed)."""
        with self._lock:
            return self._failures

    def allow(self, force: bool = False) -> bool:
        """True when the caller may call now: the breaker is closed, or it is open, its wait
        is over and no other probe is running (this caller becomes the probe). ``force``
        lets a caller through regardless (an explicit flush)."""
        with self._lock:
            if self._failures == 0 or force:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> bool:
        """Close the breaker; True when it was open (the dependency is back)."""
        with self._lock:
            was_open = self._failures > 0
            self._failures, self._backoff, self._open_until = 0, self._base, 0.0
            self._probing = False
            self.last_error = None
            return was_open

    def failure(self, error: str = "") -> bool:
        """Open (or keep open) the breaker with the next back-off; True on the first failure
        after a closed state (the one worth a warning)."""
        with self._lock:
            first = self._failures == 0
            self._failures += 1
            self._open_until = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, self._max)
            self._probing = False
            self.last_error = error or self.last_error
            return first

    def retry_in(self) -> float:
        """Seconds until the next probe may run (0 when closed or due)."""
        with self._lock:
            return max(0.0, self._open_until - self._clock()) if self._failures else 0.0
