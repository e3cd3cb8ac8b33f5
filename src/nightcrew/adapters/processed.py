"""The processed-URL set: "seen before?" for a batch of article URLs (spec 001's Redis set).

Two implementations behind one Protocol: Redis's set, a fast accelerator in front of the
database, and PostgreSQL's, which is the articles table itself (``news.articles`` is unique by
normalised URL, the same identity). Only the database's unique URL prevents a second write,
so a Redis that fails raises ``ProcessedUrlsDown``: the caller carries on with the PostgreSQL
set for the rest of its run and reports ``redisEnabled: false``.
"""

from __future__ import annotations

from typing import Any, Protocol

from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.db.database import Database
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error

PROCESSED_SET = "news:processed"
PROCESSED_SET_TTL_SECONDS = 30 * 24 * 3600


def redis_failures() -> tuple[type[BaseException], ...]:
    """What a Redis call raises when Redis, not the caller, is at fault."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class ProcessedUrlsDown(NightcrewError):
    """The set's backend (Redis) could not answer; the message says how."""


class ProcessedUrls(Protocol):
    backend: str  # "redis" or "postgres"

    async def seen(self, urls: list[str]) -> set[str]:
        """The URLs of ``urls`` already processed."""
        ...

    async def add(self, urls: list[str]) -> None:
        """Record ``urls`` as processed (written)."""
        ...


class RedisProcessedUrls:
    backend = "redis"

    def __init__(
        self, redis: Any, key: str = PROCESSED_SET, *, breaker: RedisBreaker | None = None
    ) -> None:
        self._redis = redis
        self._key = key
        self._breaker = breaker or RedisBreaker()

    async def seen(self, urls: list[str]) -> set[str]:
        if not urls:
            return set()
        self._skip_if_failing()
        try:
            flags = await self._redis.smismember(self._key, urls)
        except redis_failures() as exc:  # the caller logs it, and says so in its report
            raise self._down(exc) from exc
        self._breaker.success()
        return {u for u, hit in zip(urls, flags, strict=True) if hit}

    async def add(self, urls: list[str]) -> None:
        if not urls:
            return
        self._skip_if_failing()
        try:
            # The set lives as long as articles are written to it, and goes PROCESSED_SET_TTL
            # after the last: every key nightcrew writes has a TTL. Missing an entry costs a
            # database lookup, never a duplicate (news.articles is unique by URL).
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.sadd(self._key, *urls)
                pipe.expire(self._key, PROCESSED_SET_TTL_SECONDS)
                await pipe.execute()
        except redis_failures() as exc:  # the caller logs it, and says so in its report
            raise self._down(exc) from exc
        self._breaker.success()

    def _skip_if_failing(self) -> None:
        if self._breaker.is_open:
            raise ProcessedUrlsDown(
                f"Redis set {self._key}: skipped, Redis failed moments ago "
                f"({self._breaker.last_error})"
            )

    def _down(self, exc: BaseException) -> ProcessedUrlsDown:
        error = describe_error(exc)
        self._breaker.failure(error)
        return ProcessedUrlsDown(f"Redis set {self._key}: {error}")


class PostgresProcessedUrls:
    """The written articles are the set: nothing to add, nothing that can drift."""

    backend = "postgres"

    def __init__(self, db: Database) -> None:
        self._db = db

    async def seen(self, urls: list[str]) -> set[str]:
        if not urls:
            return set()
        return set(
            await self._db.fetch_values(
                str,
                "SELECT url FROM news.articles WHERE url = ANY(%(urls)b::text[])",
                {"urls": urls},
            )
        )

    async def add(self, urls: list[str]) -> None:
        return None  # the transaction that wrote the article recorded it
