"""What the news worker needs from the outside, assembled once with the Runtime: the lease
backend and the processed-URL set (Redis when configured, each with its PostgreSQL fallback for
a run that finds Redis gone), the HTTP client for untrusted addresses (under the address
policy), the parser worker processes that read what it fetches, the reviewer the configuration
names, and the stage queues' broker in pipeline mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from nightcrew.adapters.addresses import AddressPolicy, UntrustedHttp, new_client
from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Leases, PairedLeases, PostgresLeases
from nightcrew.adapters.model_calls import ModelCalls, Pacer
from nightcrew.adapters.parsers import ParserPool
from nightcrew.adapters.processed import (
    PostgresProcessedUrls,
    ProcessedUrls,
    RedisProcessedUrls,
)
from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.adapters.reviewer import Reviewer, make_reviewer
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database

# Redis answers in well under a millisecond on a LAN and in tens over the internet (Upstash):
# a second is a Redis in trouble. Short, because every call of a run may pay it once before
# the circuit breaker opens.
REDIS_CONNECT_TIMEOUT_SECONDS = 1.0
REDIS_TIMEOUT_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True)
class NewsAdapters:
    leases: Leases  # decided by PostgreSQL; copied to Redis when it is configured
    processed: ProcessedUrls
    # PostgreSQL's processed set: what a run goes on with once Redis fails (spec 001); the
    # same object as ``processed`` when no Redis is configured
    fallback_processed: ProcessedUrls
    http: UntrustedHttp  # new_client(policy): every connection through the policy
    # where feeds are parsed (fetch.FeedRules): worker processes started on the first parse,
    # stopped when open_news_adapters closes — one pool per runtime, none per process
    parsers: ParserPool
    reviewer: Reviewer
    policy: AddressPolicy
    pipeline: PipelineBroker | None = None  # NEWS_PIPELINE=rabbitmq: the stage queues
    # the process's Redis circuit breaker (None without Redis): a run that saw it fail since
    # its start reports redisEnabled: false
    redis_breaker: RedisBreaker | None = None

    @property
    def redis_configured(self) -> bool:
        return self.processed.backend == "redis"


def news_adapters(
    db: Database,
    clock: Clock,
    *,
    http: UntrustedHttp,
    parsers: ParserPool,
    reviewer: Reviewer,
    policy: AddressPolicy,
    redis: Any = None,
    pipeline: PipelineBroker | None = None,
    breaker: RedisBreaker | None = None,
) -> NewsAdapters:
    """The adapters over ``redis`` (a client) when given, else PostgreSQL alone; ``parsers``
    stays the caller's to close.

    Leases have one authority, PostgreSQL: with Redis they are PairedLeases (decided in
    ``nightcrew.leases``, copied to Redis), so a lease is never held in two places that cannot
    see each other, whatever Redis does mid-run. Redis stays the processed-URL set's fast path.
    One circuit breaker per process serves both: after a Redis failure neither calls Redis for
    a while, and no call waits out a timeout against a Redis that is gone."""
    authority = PostgresLeases(db, clock)
    fallback_processed = PostgresProcessedUrls(db)
    leases: Leases = authority
    processed: ProcessedUrls = fallback_processed
    if redis is not None:
        breaker = breaker or RedisBreaker()
        leases = PairedLeases(authority, redis, breaker)
        processed = RedisProcessedUrls(redis, breaker=breaker)
    return NewsAdapters(
        leases=leases,
        processed=processed,
        fallback_processed=fallback_processed,
        http=http,
        parsers=parsers,
        reviewer=reviewer,
        policy=policy,
        pipeline=pipeline,
        redis_breaker=breaker if redis is not None else None,
    )


@asynccontextmanager
async def open_news_adapters(
    settings: Settings,
    db: Database,
    clock: Clock,
    *,
    reviewer: Reviewer | None = None,
    policy: AddressPolicy | None = None,
) -> AsyncIterator[NewsAdapters]:
    """Redis when REDIS_URL is set — not contacted here: each run finds out, and falls back to
    PostgreSQL leases and the database de-dupe for that run when Redis fails (``redisEnabled:
    false``). The reviewer's model calls are held to NEWS_AI_CONCURRENCY and
    NEWS_AI_REQUESTS_PER_MINUTE (``model_calls``; the rate shared through Redis, under the same
    circuit breaker). ``reviewer`` and ``policy`` replace the configured ones (the demo's
    offline rules and its loopback sample feeds). The parser pool is made here and closed on
    the way out, its workers (if any started) stopped."""
    redis: Any = None
    breaker: RedisBreaker | None = None
    if settings.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(  # type: ignore[no-untyped-call]
            settings.redis_url,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_SECONDS,
            socket_timeout=REDIS_TIMEOUT_SECONDS,
        )
        breaker = RedisBreaker()
    if policy is None:
        policy = AddressPolicy.parse(settings.news_allowed_private_hosts)
    pipeline = (  # connected on first use: a command that never touches it never waits for it
        PipelineBroker(
            settings.queue_url,
            prefix=settings.news_queue_prefix,
            max_deliveries=settings.news_max_deliveries,
        )
        if settings.news_pipeline == "rabbitmq"
        else None
    )
    own: Reviewer | None = None
    try:
        if reviewer is None:
            reviewer = own = make_reviewer(settings, model_calls(settings, breaker))
        async with ParserPool() as parsers, new_client(policy) as http:
            yield news_adapters(
                db,
                clock,
                http=http,
                parsers=parsers,
                reviewer=reviewer,
                policy=policy,
                redis=redis,
                pipeline=pipeline,
                breaker=breaker,
            )
    finally:
        if own is not None:
            await own.aclose()
        if pipeline is not None:
            await pipeline.close()
        if redis is not None:
            await redis.aclose()


def model_calls(settings: Settings, breaker: RedisBreaker | None) -> ModelCalls:
    """The process's limits on model calls; the rate (when set) keyed by the model's address
    and name, so the processes sharing a Redis and a model share it."""
    pacer = None
    if settings.news_ai_requests_per_minute is not None:
        pacer = Pacer(
            settings.news_ai_requests_per_minute,
            key=f"{settings.news_ai_base_url}|{settings.news_ai_model}",
            redis_url=settings.redis_url,
            breaker=breaker,
        )
    return ModelCalls(settings.news_ai_concurrency, pacer)
