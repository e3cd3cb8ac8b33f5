"""Shared fixtures: a real PostgreSQL for every integration and acceptance test.

The server is ``DATABASE_URL`` (or ``NIGHTCREW_TEST_DATABASE_URL``) when it answers, otherwise
an embedded one started with pgserver, so the suite also passes on a machine with nothing
installed. The schema is migrated once into a template database; every test gets its own clone
(``CREATE DATABASE … TEMPLATE``), which is fast and fully isolated.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.parsers import ParserPool
from nightcrew.adapters.queues import MemoryQueueProducer, PostgresQueueProducer
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import Clock, FrozenClock
from nightcrew.config import Settings
from nightcrew.db.connection import with_dbname
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.runtime import Runtime
from tests.support.servers import (
    S3_CREDENTIALS,
    RecordingServer,
    create_bucket,
    embedded_postgres,
    moto_s3,
    recording_server,
)

# The pipeline tests' fixtures (a RabbitMQ namespace, a model stand-in), shared by
# tests/integration/news and tests/faults.
pytest_plugins = [
    "tests.integration.news.pipeline_support",
    "tests.support.hygiene",
    "tests.support.schedule",
]

_TIERS = ("unit", "integration", "faults", "acceptance")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test marked with its tier, by the directory it lives in: `-m unit` runs the fast
    tier, `-m "not faults"` leaves out the slowest."""
    tests = Path(__file__).parent
    for item in items:
        try:
            tier = item.path.relative_to(tests).parts[0]
        except ValueError:  # a test file outside tests/ (given on the command line)
            continue
        if tier in _TIERS:
            item.add_marker(tier)


NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
_counter = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _data_dir_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """nightcrew's default data directory is ./.nightcrew: every runtime and command a test
    starts without a NIGHTCREW_DATA_DIR of its own (commands inherit this environment) keeps
    its embedded server and local files in pytest's temporary directory, not in the checkout."""
    data = tmp_path_factory.mktemp("nightcrew-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NIGHTCREW_DATA_DIR", str(data))
        yield data


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A superuser URL on a server the tests may create databases on."""
    for name in ("NIGHTCREW_TEST_DATABASE_URL", "DATABASE_URL"):
        url = os.environ.get(name)
        if url and _answers(url):
            yield url
            return
    with embedded_postgres() as url:
        yield url


def _admin(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
async def template_db(pg_admin_url: str) -> AsyncIterator[str]:
    name = f"nightcrew_tmpl_{os.getpid()}"
    _admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name}")
    _admin(pg_admin_url, f"CREATE DATABASE {name}")
    url = with_dbname(pg_admin_url, name)
    db = await Database.open(url)
    try:
        await migrate(db)
    finally:
        await db.close()
    yield name
    _admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _no_commit_flush(url: str, name: str) -> None:
    """A test's database commits without waiting for its WAL to reach the disk
    (``synchronous_commit = off``, a per-database setting its connections pick up): what a
    commit means to every other session is unchanged — only a crash of the server itself could
    lose the last few, and no test crashes the server. Hundreds of tests commit thousands of
    small transactions each; on this machine's disk every flush is a wait."""
    _admin(url, f"ALTER DATABASE {name} SET synchronous_commit = off")


@pytest.fixture
def fresh_db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A migrated database of this test's own."""
    name = f"nightcrew_t_{os.getpid()}_{next(_counter)}"
    _admin(pg_admin_url, f"CREATE DATABASE {name} TEMPLATE {template_db}")
    _no_commit_flush(pg_admin_url, name)
    yield with_dbname(pg_admin_url, name)
    _admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """A database with no schema at all."""
    name = f"nightcrew_e_{os.getpid()}_{next(_counter)}"
    _admin(pg_admin_url, f"CREATE DATABASE {name}")
    yield with_dbname(pg_admin_url, name)
    _admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
async def db(fresh_db_url: str) -> AsyncIterator[Database]:
    database = await Database.open(fresh_db_url)
    try:
        yield database
    finally:
        await database.close()


def _test_settings(database_url: str, env: dict[str, str] | None) -> Settings:
    return Settings.model_validate({"DATABASE_URL": database_url, **(env or {})})


def _stand_ins(db: Database, clock: Clock) -> dict[str, Any]:
    """What a test runtime gets unless it says otherwise: nothing that reaches outside the
    test's own database (no broker, bucket, feed worker, Stripe or Resend)."""
    return {
        "queues": PostgresQueueProducer(db, clock),
        "store": open_store("memory://"),
        "feedcache": RecordingFeedCache(),
        "billing": NoBilling(),
        "mail": RecordingMailer(),
    }


@asynccontextmanager
async def open_test_runtime(
    db: Database,
    clock: Clock,
    database_url: str,
    *,
    env: dict[str, str] | None = None,
    **adapters: Any,
) -> AsyncIterator[Runtime]:
    """A Runtime assembled by open_runtime on a real database: the adapters a test names
    replace the stand-ins, and everything else open_runtime builds from Settings (``env``)."""
    overrides = {**_stand_ins(db, clock), **adapters}
    async with open_runtime(_test_settings(database_url, env), clock, db=db, **overrides) as rt:
        yield rt


# The runtimes make_runtime opened for the current test, closed when it ends.
_OPENED: ContextVar[AsyncExitStack | None] = ContextVar("nightcrew_test_runtimes", default=None)
# The parser pool of the current test's hand-built fetch rules and news adapters.
_PARSERS: ContextVar[ParserPool | None] = ContextVar("nightcrew_test_parsers", default=None)


@asynccontextmanager
async def offline_runtime(clock: Clock) -> AsyncIterator[Runtime]:
    """The real assembly with in-memory adapters, over a pool that is never opened: for tests
    whose code touches no database, where one that did would fail at once rather than reach a
    server."""
    settings = Settings.model_validate({"DATABASE_URL": "postgresql://unused@127.0.0.1/unused"})
    never_opened = Database(AsyncConnectionPool(settings.database_url, open=False), "unused")
    async with open_runtime(
        settings,
        clock,
        db=never_opened,
        queues=MemoryQueueProducer(clock),
        store=open_store("memory://"),
        feedcache=RecordingFeedCache(),
        billing=NoBilling(),
    ) as runtime:
        yield runtime


@pytest.fixture(autouse=True)
async def _close_test_runtimes() -> AsyncIterator[None]:
    # a pool for every test costs nothing until one parses (its workers start on first use);
    # closed after the runtimes, in case one of them was handed it
    async with ParserPool() as parsers, AsyncExitStack() as opened:
        tokens = _OPENED.set(opened), _PARSERS.set(parsers)
        try:
            yield
        finally:
            _OPENED.reset(tokens[0])
            _PARSERS.reset(tokens[1])


def parsers_for_test() -> ParserPool:
    """The current test's parser pool (its workers stopped when the test ends), for the news
    adapters and fetch rules a test builds by hand (``deps_for``, ``FeedRules``); a runtime
    from open_runtime has its own."""
    parsers = _PARSERS.get()
    if parsers is None:
        raise RuntimeError("parsers_for_test() outside a test: open a ParserPool of your own")
    return parsers


async def make_runtime(
    db: Database,
    clock: Clock,
    database_url: str,
    *,
    env: dict[str, str] | None = None,
    **adapters: Any,
) -> Runtime:
    """open_test_runtime for the many tests that want a runtime without a block of their own:
    closed when the test ends (a script outside pytest leaves it to the process exit)."""
    opening = open_test_runtime(db, clock, database_url, env=env, **adapters)
    opened = _OPENED.get()
    if opened is None:
        return await opening.__aenter__()
    return await opened.enter_async_context(opening)


@pytest.fixture
async def runtime(db: Database, clock: FrozenClock, fresh_db_url: str) -> AsyncIterator[Runtime]:
    async with open_test_runtime(db, clock, fresh_db_url) as rt:
        yield rt


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for adapters under test (news tests override it with their own)."""
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture(scope="session")
def _loopback_servers() -> Iterator[tuple[RecordingServer, RecordingServer, RecordingServer]]:
    with recording_server() as stripe, recording_server() as feed, recording_server() as resend:
        yield stripe, feed, resend


@pytest.fixture
def stripe_server(_loopback_servers: tuple[RecordingServer, ...]) -> RecordingServer:
    """A loopback Stripe stand-in that records requests (reset for every test)."""
    server = _loopback_servers[0]
    server.reset()
    return server


@pytest.fixture
def feed_server(_loopback_servers: tuple[RecordingServer, ...]) -> RecordingServer:
    """A loopback feed worker that records requests (reset for every test)."""
    server = _loopback_servers[1]
    server.reset()
    return server


@pytest.fixture
def resend_server(_loopback_servers: tuple[RecordingServer, ...]) -> RecordingServer:
    """A loopback Resend stand-in that records requests (reset for every test)."""
    server = _loopback_servers[2]
    server.reset()
    return server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One moto S3 server on loopback for the whole session."""
    with moto_s3() as endpoint:
        yield endpoint


def real_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """A store of ``kind``: local files under tmp_path, memory, or a fresh bucket on moto."""
    if kind == "file":
        return open_store(f"file://{tmp_path / 'media'}")
    if kind == "memory":
        return open_store("memory://")
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"media-{uuid.uuid4().hex[:12]}"
    create_bucket(endpoint, bucket)
    return open_store(
        f"s3://{bucket}?endpoint={endpoint}&region=us-east-1", credentials=S3_CREDENTIALS
    )


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The same test against local files and against S3 (moto)."""
    return real_store(request.param, request, tmp_path)
