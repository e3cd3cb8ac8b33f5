"""Redis cut together with RabbitMQ under the pipeline: a stage lease is never held in
two places that cannot see each other (PostgreSQL decides, Redis only carries a copy), so the
redeliveries RabbitMQ makes after the cut never start a second model call for an article whose
review is still under way. Real PostgreSQL, RabbitMQ and Redis, each of the last two behind a
TCP proxy the test cuts; loopback feeds; a model stand-in that takes its time."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.passes import run_pass
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.proxy import TcpProxy
from tests.support.services import AMQP_URL, REDIS_URL, needs_rabbitmq, needs_redis
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = [needs_rabbitmq, needs_redis]


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return parts._replace(netloc=f"{credentials}127.0.0.1:{port}").geturl()


async def test_redis_and_rabbitmq_cut_together_under_the_pipeline_review_nothing_twice(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    amqp, redis = urlsplit(AMQP_URL), urlsplit(REDIS_URL)
    broker_proxy = TcpProxy(amqp.port or 5672, amqp.hostname or "127.0.0.1")
    redis_proxy = TcpProxy(redis.port or 6379, redis.hostname or "127.0.0.1")
    await broker_proxy.start()
    await redis_proxy.start()
    try:
        with ModelStandIn(delay=0.5) as model, FeedFarm(feeds=3, items=10) as farm:
            await add_farm_sources(db, farm)
            env = pipeline_env(
                fresh_db_url,
                prefix,
                model,
                tmp_path / "store",
                QUEUE_URL=_via(AMQP_URL, broker_proxy.port),
                REDIS_URL=_via(REDIS_URL, redis_proxy.port),
            )
            async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
                await run_pass(runtime, SystemClock(), "s")

                async def reviewing() -> bool:
                    return sum(model.reviews.values()) >= 6

                await wait_for(reviewing, within=60, what="reviews under way")
                await broker_proxy.cut()
                await redis_proxy.cut()
                asked = sum(model.reviews.values())

                async def answered() -> bool:  # the answers come in; broker and Redis are gone
                    return sum(model.answered.values()) >= asked and model.in_flight == 0

                await wait_for(answered, within=30, what="the reviews in flight answered")
                await broker_proxy.restore()
                await redis_proxy.restore()

                async def all_written() -> bool:
                    if await count(db, "SELECT count(*) FROM news.articles") >= 30:
                        return True
                    await run_pass(runtime, SystemClock(), "s")  # the next passes
                    return False

                await wait_for(all_written, within=150, what="30 articles", poll=3)
        reviewed_twice = {url: n for url, n in model.reviews.items() if n > 1}
        assert reviewed_twice == {}
        assert set(model.reviews) == farm.article_urls()
    finally:
        await broker_proxy.cut()
        await redis_proxy.cut()


async def test_a_silent_redis_under_the_pipeline_costs_seconds_not_a_stall(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    """Redis accepting connections and never answering, from before the pass: the stage
    workers carry on on PostgreSQL's leases (each process pays one 1 s timeout, then its
    circuit breaker keeps Redis off), every article written and reviewed once, and the pass
    says Redis was not used."""
    import time

    redis = urlsplit(REDIS_URL)
    redis_proxy = TcpProxy(redis.port or 6379, redis.hostname or "127.0.0.1")
    await redis_proxy.start()
    try:
        with ModelStandIn(delay=0.0) as model, FeedFarm(feeds=3, items=10) as farm:
            await add_farm_sources(db, farm)
            env = pipeline_env(
                fresh_db_url,
                prefix,
                model,
                tmp_path / "store",
                REDIS_URL=_via(REDIS_URL, redis_proxy.port),
            )
            async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
                redis_proxy.blackhole()
                started = time.perf_counter()
                await run_pass(runtime, SystemClock(), "s")

                async def all_written() -> bool:
                    return await count(db, "SELECT count(*) FROM news.articles") >= 30

                await wait_for(all_written, within=60, what="30 articles")
                took = time.perf_counter() - started
                report = await run_pass(runtime, SystemClock(), "s")
        assert took < 20, took
        assert max(model.reviews.values()) == 1 and len(model.reviews) == 30
        assert report.to_json()["redisEnabled"] is False
    finally:
        await redis_proxy.restore()
        await redis_proxy.cut()
