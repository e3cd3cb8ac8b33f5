"""What the news worker needs from the outside, assembled once with the Runtime: the lease
backend and the processed-URL set (Redis when configured, each with its PostgreSQL fallback for
a run that finds Redis gone), the HTTP client for untrusted addresses (under the address
policy), the reviewer the configuration names, and the stage queues' broker in pipeline mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from nightcrew.adapters.addresses import AddressPolicy, UntrustedHttp, new_client
from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Leases, PostgresLeases, RedisLeases
from nightcrew.adapters.processed import (
    PostgresProcessedUrls,
    ProcessedUrls,
    RedisProcessedUrls,
)
from nightcrew.adapters.reviewer import Reviewer, make_reviewer
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database


@dataclass(frozen=True, kw_only=True)
class NewsAdapters:
    leases: Leases
    processed: ProcessedUrls
    # PostgreSQL's leases and set: what a run goes on with once Redis fails (spec 001); the
    # same objects as ``leases``/``processed`` when no Redis is configured
    fallback_leases: Leases
    fallback_processed: ProcessedUrls
    http: UntrustedHttp  # new_client(policy): every connection through the policy
    reviewer: Reviewer
    policy: AddressPolicy
    pipeline: PipelineBroker | None = None  # NEWS_PIPELINE=rabbitmq: the stage queues

    @property
    def redis_configured(self) -> bool:
        return self.processed.backend == "redis"


def news_adapters(
    db: Database,
    clock: Clock,
    *,
    http: UntrustedHttp,
    reviewer: Reviewer,
    policy: AddressPolicy,
    redis: Any = None,
    pipeline: PipelineBroker | None = None,
) -> NewsAdapters:
    """The adapters over ``redis`` (a client) when given, else PostgreSQL alone."""
    fallback_leases = PostgresLeases(db, clock)
    fallback_processed = PostgresProcessedUrls(db)
    return NewsAdapters(
        leases=RedisLeases(redis) if redis is not None else fallback_leases,
        processed=RedisProcessedUrls(redis) if redis is not None else fallback_processed,
        fallback_leases=fallback_leases,
        fallback_processed=fallback_processed,
        http=http,
        reviewer=reviewer,
        policy=policy,
        pipeline=pipeline,
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
    false``). The reviewer gets its own client: the model's address is the operator's, not a
    feed's, so the address policy does not apply to it. ``reviewer`` and ``policy`` replace
    the configured ones (the demo's offline rules and its loopback sample feeds)."""
    redis: Any = None
    if settings.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(  # type: ignore[no-untyped-call]
            settings.redis_url, socket_connect_timeout=2, socket_timeout=5
        )
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
    try:
        async with new_client(policy) as http, httpx.AsyncClient() as model_http:
            yield news_adapters(
                db,
                clock,
                http=http,
                reviewer=reviewer or make_reviewer(settings, model_http),
                policy=policy,
                redis=redis,
                pipeline=pipeline,
            )
    finally:
        if pipeline is not None:
            await pipeline.close()
        if redis is not None:
            await redis.aclose()
