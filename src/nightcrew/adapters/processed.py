"""The processed-URL set: a fast "seen before?" in front of the database (spec 001's Redis set).

Only an accelerator: the database's unique article URL is what prevents a second write. So a
Redis that fails answers "unknown" (None / False) instead of raising, and the caller carries on
with the database alone and reports ``redisEnabled: false``.
"""

from __future__ import annotations

from typing import Any

from nightcrew.log import describe_error, warning

PROCESSED_SET = "news:processed"


def redis_failures() -> tuple[type[BaseException], ...]:
    """What a Redis call raises when Redis, not the caller, is at fault."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class RedisProcessedUrls:
    def __init__(self, redis: Any, key: str = PROCESSED_SET) -> None:
        self._redis = redis
        self._key = key

    async def seen(self, urls: list[str]) -> set[str] | None:
        """The URLs of ``urls`` in the set; None when Redis cannot answer."""
        if not urls:
            return set()
        try:
            flags = await self._redis.smismember(self._key, urls)
        except redis_failures() as exc:
            warning("worker.redis.unavailable", error=describe_error(exc))
            return None
        return {u for u, hit in zip(urls, flags, strict=True) if hit}

    async def add(self, urls: list[str]) -> bool:
        if not urls:
            return True
        try:
            await self._redis.sadd(self._key, *urls)
        except redis_failures() as exc:
            warning("worker.redis.unavailable", error=describe_error(exc))
            return False
        return True
