"""One lock authority: a lease is never held in two places that cannot see each
other. Redis cut (through a TCP proxy) under a running shard while a second run starts: the
second run finds the shard held in PostgreSQL, and no article is reviewed twice by the model.
Real PostgreSQL, real Redis behind the proxy, loopback feeds and a model stand-in."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from nightcrew.adapters.processed import PROCESSED_SET
from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.news.steps.review import review_lock_name
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_runtime,
    wait_for,
)
from tests.support.proxy import TcpProxy
from tests.support.services import REDIS_URL, needs_redis
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_redis


@pytest.fixture
async def redis_proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(REDIS_URL)
    proxy = TcpProxy(target.port or 6379, target.hostname or "127.0.0.1")
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.cut()


async def _not_yet_processed(farm: FeedFarm) -> None:
    """The farm's article URLs out of Redis's processed set, which every test shares: a farm
    that got the port of an earlier test's farm has that farm's URLs, and would find some of
    them "processed" already (one CI run found 26 of 30 new)."""
    client = aioredis.from_url(REDIS_URL)
    try:
        await client.srem(PROCESSED_SET, *farm.article_urls())
    finally:
        await client.aclose()


def _env(db_url: str, model: ModelStandIn, redis_port: int, store: Path) -> dict[str, str]:
    redis = urlsplit(REDIS_URL)._replace(netloc=f"127.0.0.1:{redis_port}").geturl()
    return {
        "DATABASE_URL": db_url,
        "REDIS_URL": redis,
        "NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
        "NEWS_AI_BASE_URL": model.base_url,
        "NEWS_AI_MODEL": "stand-in",
        "STORAGE_URL": f"file://{store}",
        "MAX_AI_REVIEWS": "1000",
    }


async def test_redis_cut_under_a_running_shard_while_a_second_run_starts(
    db: Database, fresh_db_url: str, redis_proxy: TcpProxy, tmp_path: Path
) -> None:
    shard = f"auth-{uuid.uuid4().hex[:6]}"
    with FeedFarm(feeds=3, items=10, thumbnails=True) as farm, ModelStandIn(delay=0.05) as model:
        await _not_yet_processed(farm)
        await add_farm_sources(db, farm, shard)
        env = _env(fresh_db_url, model, redis_proxy.port, tmp_path / "media")
        clock = SystemClock()
        reports: list[Any] = []
        async with pipeline_runtime(env, db) as first_rt, pipeline_runtime(env, db) as second_rt:
            first = asyncio.create_task(run_shard(first_rt, clock, shard))

            async def reviewing() -> bool:
                return sum(model.reviews.values()) >= 5

            await wait_for(reviewing, 30, "the first run to be reviewing")
            await redis_proxy.cut()  # Redis gone: connections reset, new ones refused
            # a second run (another process: its own adapters, its own breaker) starts now
            reports.append(await run_shard(second_rt, clock, shard))
            reports.append(await first)

    second, first_report = reports
    assert second.locked_count == 1 and second.processed_count == 0, second.to_json()
    assert first_report.processed_count == 30, first_report.to_json()
    assert max(model.reviews.values()) == 1 and sum(model.reviews.values()) == 30
    assert await count(db, "SELECT count(*) FROM news.articles") == 30


async def test_after_a_run_every_key_nightcrew_wrote_in_redis_has_a_ttl(
    db: Database, fresh_db_url: str, tmp_path: Path
) -> None:
    shard = f"ttl-{uuid.uuid4().hex[:6]}"
    port = urlsplit(REDIS_URL).port or 6379
    with FeedFarm(feeds=2, items=5, thumbnails=True) as farm, ModelStandIn(delay=0.0) as model:
        await _not_yet_processed(farm)
        await add_farm_sources(db, farm, shard)
        env = _env(fresh_db_url, model, port, tmp_path / "media")
        async with pipeline_runtime(env, db) as runtime:
            # a long ttl, so a lease key that was written and not released would still be there
            report = await run_shard(runtime, SystemClock(), shard)
        urls = sorted(farm.article_urls())
    assert report.processed_count == 10 and report.redis_enabled
    client = aioredis.from_url(REDIS_URL)
    try:
        names = [shard_lock_name(shard), *(review_lock_name(u) for u in urls), PROCESSED_SET]
        names += [n + ":fence" for n in names]
        ttls = {name: await client.ttl(name) for name in names}
        # -2: no such key (released, or never written); -1: a key without a TTL
        assert all(ttl != -1 for ttl in ttls.values()), {n: t for n, t in ttls.items() if t == -1}
        assert ttls[PROCESSED_SET] > 0  # the run wrote the set, with its TTL
        await client.srem(PROCESSED_SET, *urls)
    finally:
        await client.aclose()


async def test_a_silent_redis_costs_a_run_seconds_not_a_timeout_per_call(
    db: Database, fresh_db_url: str, redis_proxy: TcpProxy, tmp_path: Path
) -> None:
    """Redis accepting connections and never answering: the first call waits out the short
    timeout, the circuit breaker opens, and the run carries on on PostgreSQL's leases and set
    (30 articles: one review lock each, one shard lease, its renewals)."""
    import time

    shard = f"silent-{uuid.uuid4().hex[:6]}"
    with FeedFarm(feeds=3, items=10, thumbnails=True) as farm, ModelStandIn(delay=0.0) as model:
        await add_farm_sources(db, farm, shard)
        env = _env(fresh_db_url, model, redis_proxy.port, tmp_path / "media")
        async with pipeline_runtime(env, db) as runtime:
            redis_proxy.blackhole()
            started = time.perf_counter()
            report = await run_shard(runtime, SystemClock(), shard)
            took = time.perf_counter() - started
            await redis_proxy.restore()
    assert report.processed_count == 30 and not report.redis_enabled, report.to_json()
    assert took < 10, took
    assert max(model.reviews.values()) == 1
