"""How many model calls one process makes at once, and how fast: the two limits a model
provider enforces, kept on our side so the provider never has to refuse us.

* ``NEWS_AI_CONCURRENCY``: at most that many calls (reviews and translations, either engine,
  every stage consumer) in flight in this process — a semaphore held for the whole call,
  retries included. A worker's prefetch only decides how many messages wait for a slot.
* ``NEWS_AI_REQUESTS_PER_MINUTE``: at most that many requests *started* (every retry is a
  request). With ``REDIS_URL``, the ``limits`` library's moving window in Redis (one Lua script
  per request: atomic), so every process sharing that Redis shares the one limit. Without it —
  and while Redis fails, for the breaker's half-minute (logged; the process's Redis circuit
  breaker is told, so the run reports ``redisEnabled: false``) — ``aiolimiter``'s leaky bucket,
  per process. (Not ``limits``' in-memory storage: its background expiry trims a key's window
  list from a thread without holding the lock its writers use once it has popped that lock,
  and under load it dropped entries — 80 requests at 20 a second went out in 2.2 s.)

The rate is taken at its finest whole granularity: 1,200 a minute is 20 in any one second (not
a burst of 1,200 and then a minute of silence), 90 a minute is 3 in any two seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiolimiter import AsyncLimiter
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import StorageError

from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.log import warning

# A Redis in trouble answers within a second or not at all (as the news adapters' own client).
REDIS_TIMEOUT_SECONDS = 1.0
KEY_PREFIX = "nightcrew:ai-rate"


def window_of(per_minute: int) -> RateLimitItem:
    """``per_minute`` as the smallest whole window that expresses it exactly: ``amount`` requests
    per ``seconds`` seconds with seconds = 60 / gcd(per_minute, 60)."""
    seconds = 60 // math.gcd(per_minute, 60)
    return RateLimitItemPerSecond(per_minute * seconds // 60, seconds)


class Pacer:
    """NEWS_AI_REQUESTS_PER_MINUTE: ``wait`` returns when one more request may start."""

    def __init__(
        self,
        per_minute: int,
        *,
        key: str,
        redis_url: str | None = None,
        breaker: RedisBreaker | None = None,
    ) -> None:
        self.item = window_of(per_minute)
        self._key = hashlib.sha256(key.encode()).hexdigest()[:24]
        self._local = AsyncLimiter(self.item.amount, self.item.get_expiry())
        self._shared: MovingWindowRateLimiter | None = None
        if redis_url:
            self._shared = MovingWindowRateLimiter(
                RedisStorage(
                    "async+" + redis_url,
                    implementation="redispy",
                    wrap_exceptions=True,
                    key_prefix=KEY_PREFIX,
                    socket_timeout=REDIS_TIMEOUT_SECONDS,
                    socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
                )
            )
        self._breaker = breaker
        self._local_said = False  # the fall back to memory logged (once per episode)

    @property
    def shared(self) -> bool:
        return self._shared is not None

    def _limiter(self) -> MovingWindowRateLimiter | None:
        """The shared limit while Redis serves it; None: this process's own."""
        if self._shared is None:
            return None
        if self._breaker is not None and self._breaker.is_open:
            # Redis failed (here, or for the leases or the processed set): per process for now
            self._say_local(self._breaker.last_error or "Redis is failing")
            return None
        self._local_said = False
        return self._shared

    def _say_local(self, error: str) -> None:
        if not self._local_said:
            self._local_said = True
            warning("news.ai_rate_limit_local", error=error, per_minute=self.per_minute)

    async def wait(self) -> None:
        while True:
            limiter = self._limiter()
            if limiter is None:
                await self._local.acquire()
                return
            try:
                if await limiter.hit(self.item, self._key):
                    if self._breaker is not None:
                        self._breaker.success()
                    return
                stats = await limiter.get_window_stats(self.item, self._key)
            except StorageError as exc:
                self._fall_back(exc)
                continue
            if stats.remaining > 0:  # the window emptied since the hit: try again now
                continue
            # the oldest request in the window leaves it at reset_time; a little jitter so the
            # waiters do not all wake in the same millisecond
            delay = max(stats.reset_time - time.time(), 0.005) + random.uniform(0, 0.02)
            await asyncio.sleep(min(delay, float(self.item.get_expiry())))

    def _fall_back(self, exc: StorageError) -> None:
        error = f"{type(exc.storage_error).__name__}: {exc.storage_error}"
        if self._breaker is not None:
            self._breaker.failure(error)
        else:  # no breaker to hold it open: no shared limit for this process from now on
            self._shared = None
        self._say_local(error)

    async def aclose(self) -> None:
        """The shared limit's Redis connections closed (the memory one holds none)."""
        if self._shared is not None:
            client = getattr(getattr(self._shared.storage, "bridge", None), "storage", None)
            if client is not None:
                await client.aclose()

    @property
    def per_minute(self) -> int:
        return self.item.amount * 60 // self.item.get_expiry()


class ModelCalls:
    """The process's model calls: ``slot()`` around each call (NEWS_AI_CONCURRENCY), ``pace()``
    before each request of it (NEWS_AI_REQUESTS_PER_MINUTE, when set)."""

    def __init__(self, concurrency: int, pacer: Pacer | None = None) -> None:
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self.pacer = pacer
        self.in_flight = 0
        self.most_in_flight = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._slots:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                yield
            finally:
                self.in_flight -= 1

    async def pace(self) -> None:
        if self.pacer is not None:
            await self.pacer.wait()

    async def aclose(self) -> None:
        if self.pacer is not None:
            await self.pacer.aclose()
