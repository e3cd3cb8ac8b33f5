"""The Runtime: every adapter, opened once and closed once.

Doors (CLI, HTTP, scheduler) build a Runtime from Settings and hand it to jobs; jobs never read
the environment or construct a driver themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from nightcrew.adapters.queues import PostgresQueueProducer, QueueProducer
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.embedded import EmbeddedPostgres
from nightcrew.metrics import Metrics


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    settings: Settings
    db: Database
    queues: QueueProducer
    metrics: Metrics = field(default_factory=Metrics)


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[Database]:
    """The pool against DATABASE_URL, or against the embedded server when it is unset."""
    embedded: EmbeddedPostgres | None = None
    conninfo = settings.database_url
    if conninfo is None:
        embedded = EmbeddedPostgres.start(settings.embedded_pgdata)
        conninfo = embedded.uri
    try:
        db = await Database.open(
            conninfo,
            connect_timeout=settings.db_connect_timeout_seconds,
            max_size=settings.db_pool_max_size,
        )
        try:
            yield db
        finally:
            await db.close()
    finally:
        if embedded is not None:
            embedded.stop()


@asynccontextmanager
async def open_runtime(settings: Settings, clock: Clock) -> AsyncIterator[Runtime]:
    async with open_database(settings) as db:
        yield Runtime(settings=settings, db=db, queues=PostgresQueueProducer(db, clock))
