"""A per-process circuit breaker for Redis, shared by the leases' mirror and the processed-URL
set.

Redis is an accelerator here, never the authority (PostgreSQL is): so once a call fails, the
next ones go straight to PostgreSQL instead of each waiting out its own timeout against a
Redis that is cut or silent. After ``retry_after_seconds`` one call is let through again (half
open); its success closes the breaker. A run asks ``failed_since(its start)`` to report
``redisEnabled: false``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Long enough that a dead Redis costs one timeout per half-minute per process, short enough
# that a Redis back from a restart is used again within the minute.
REDIS_RETRY_AFTER_SECONDS = 30.0


class RedisBreaker:
    def __init__(
        self,
        *,
        retry_after_seconds: float = REDIS_RETRY_AFTER_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retry_after = retry_after_seconds
        self._monotonic = monotonic
        self._opened_at: float | None = None
        self._last_failure_at: float | None = None
        self.last_error: str | None = None

    @property
    def is_open(self) -> bool:
        """True while calls should skip Redis (it failed less than ``retry_after`` ago)."""
        if self._opened_at is None:
            return False
        return self._monotonic() - self._opened_at < self._retry_after

    def failure(self, error: str) -> None:
        now = self._monotonic()
        self._opened_at = now
        self._last_failure_at = now
        self.last_error = error

    def success(self) -> None:
        self._opened_at = None

    def now(self) -> float:
        """The breaker's clock, for ``failed_since``."""
        return self._monotonic()

    def failed_since(self, since: float) -> bool:
        """Whether a Redis call failed (or was skipped as failing) at or after ``since``."""
        if self.is_open:
            return True
        return self._last_failure_at is not None and self._last_failure_at >= since
