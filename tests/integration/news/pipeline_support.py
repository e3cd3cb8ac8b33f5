"""What the pipeline tests share: a RabbitMQ namespace per test (its own NEWS_QUEUE_PREFIX,
deleted afterwards), the pipeline's environment, a runtime on it whose feed client can open
loopback connections only, and a worker run until a condition holds. Its fixtures (``prefix``,
``model``) serve every pipeline test, in this folder and in tests/faults (registered as a plugin
by tests/conftest.py); a module that needs another model defines its own ``model``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from nightcrew.adapters.addresses import new_client
from nightcrew.adapters.broker import PipelineBroker
from nightcrew.assembly import open_runtime
from nightcrew.clock import Clock, SystemClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.worker import Worker, WorkerSummary
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES
from tests.integration.news.conftest import LOOPBACK
from tests.support.network import LoopbackOnlyBackend
from tests.support.services import AMQP_URL
from tests.support.standins import FeedFarm, ModelStandIn


async def delete_namespace(prefix: str, url: str = AMQP_URL) -> None:
    broker = PipelineBroker(url, prefix=prefix, max_deliveries=5)
    try:
        await broker.delete_topology()
    finally:
        await broker.close()


@asynccontextmanager
async def namespace() -> AsyncIterator[str]:
    prefix = f"nctest-{uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        await delete_namespace(prefix)


def pipeline_env(
    database_url: str, prefix: str, model: ModelStandIn, store: Path, **extra: str
) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "QUEUE_URL": AMQP_URL,
        "NEWS_PIPELINE": "rabbitmq",
        "NEWS_QUEUE_PREFIX": prefix,
        "NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
        "NEWS_AI_BASE_URL": model.base_url,
        "NEWS_AI_MODEL": "stand-in",
        "STORAGE_URL": f"file://{store}",
        "NEWS_SNAPSHOT_DEBOUNCE_SECONDS": "0.5",
        "MAX_AI_REVIEWS": "1000",
        # a model that fails is the engines' to retry in these tests (a later run, pass or
        # delivery); the SDK's own retries inside one call have their tests (test_review.py,
        # test_model_speed.py), which keep the default of 2
        "NEWS_AI_MAX_RETRIES": "0",
        # a worker that dies of a signal (one CI run saw -6 at a SIGTERM stop) leaves every
        # thread's Python stack in its log, for the assertion that shows the log's tail
        "PYTHONFAULTHANDLER": "1",
        **extra,
    }


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """The test's own RabbitMQ namespace (NEWS_QUEUE_PREFIX), deleted afterwards."""
    async with namespace() as name:
        yield name


@pytest.fixture
def model() -> Iterator[ModelStandIn]:
    """An OpenAI-compatible model stand-in that answers at once."""
    with ModelStandIn(delay=0.0) as server:
        yield server


@asynccontextmanager
async def pipeline_runtime(
    env: dict[str, str], db: Database, clock: Clock | None = None
) -> AsyncIterator[Runtime]:
    settings = Settings.model_validate(env)
    async with open_runtime(settings, clock or SystemClock(), db=db) as runtime:
        news = runtime.news_adapters()
        async with new_client(LOOPBACK, inner=LoopbackOnlyBackend()) as http:
            yield replace(runtime, news=replace(news, http=http))


async def add_farm_sources(db: Database, farm: FeedFarm, shard: str = "s") -> None:
    from nightcrew.news.sources.registry import add_source

    for n, url in enumerate(farm.feed_urls()):
        await add_source(db, url=url, name=f"Feed {n}", shard=shard, now=SystemClock().now())


async def wait_for(
    check: Callable[[], Awaitable[bool]], within: float, what: str, poll: float = 0.2
) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(poll)


async def housekept(summary: WorkerSummary, rounds: int = 1, within: float = 30) -> None:
    """Until the worker has done ``rounds`` more housekeeping rounds (its relay, its re-sends
    of what is due): what a test waits on before saying "and it did nothing"."""
    until = summary.housekeeping_rounds + rounds

    async def done() -> bool:
        return summary.housekeeping_rounds >= until

    await wait_for(done, within=within, what=f"{rounds} housekeeping round(s)", poll=0.05)


@asynccontextmanager
async def worker_running(
    runtime: Runtime,
    stages: list[str] | None = None,
    concurrency: int = 4,
    clock: Clock | None = None,
) -> AsyncIterator[WorkerSummary]:
    """An in-process worker (on ``clock``, the system's by default), stopped (gracefully)
    when the block ends."""
    stop = asyncio.Event()
    worker = Worker(runtime, clock or SystemClock(), stages or list(STAGES), concurrency)
    task = asyncio.create_task(worker.run(stop, grace=10))
    try:
        yield worker.summary
    finally:
        stop.set()
        await task


async def count(db: Database, sql: str, params: dict[str, Any] | None = None) -> int:
    row = await db.fetch_one(sql, params)
    assert row is not None
    return int(next(iter(row.values())))
