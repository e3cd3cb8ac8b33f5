"""One lock authority: PostgreSQL decides every lease, Redis carries a copy under a
per-process circuit breaker. Real PostgreSQL, real Redis, and a TCP proxy in front of Redis
that the test cuts or silences."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from nightcrew.adapters.locks import PairedLeases, PostgresLeases
from nightcrew.adapters.processed import (
    PROCESSED_SET_TTL_SECONDS,
    ProcessedUrlsDown,
    RedisProcessedUrls,
)
from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from tests.support.proxy import TcpProxy
from tests.support.services import REDIS_URL, needs_redis

pytestmark = needs_redis
TTL = 60


@pytest.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(REDIS_URL)
    relay = TcpProxy(target.port or 6379, target.hostname or "127.0.0.1")
    await relay.start()
    try:
        yield relay
    finally:
        await relay.cut()


def _client(port: int | None = None) -> Any:
    import redis.asyncio as aioredis

    url = urlsplit(REDIS_URL)
    if port is not None:
        url = url._replace(netloc=f"127.0.0.1:{port}")
    # the timeouts the runtime uses (adapters/news.py)
    return aioredis.from_url(url.geturl(), socket_connect_timeout=1, socket_timeout=1)


def _name() -> str:
    return f"nightcrew:test:paired-{uuid.uuid4().hex[:8]}"


async def test_postgres_decides_and_redis_carries_the_copy(
    db: Database, clock: FrozenClock
) -> None:
    direct = _client()
    try:
        leases = PairedLeases(PostgresLeases(db, clock), direct, RedisBreaker())
        name = _name()
        lease = await leases.acquire(name, TTL)
        assert lease is not None
        assert await direct.get(name) == lease.token.encode()
        assert 55_000 < await direct.pttl(name) <= 60_000
        assert await leases.acquire(name, TTL) is None  # one holder
        assert await leases.extend(lease, 10)
        assert 9_000 < await direct.pttl(name) <= 10_000  # replaced, not added
        assert await leases.release(lease)
        assert await direct.exists(name) == 0
        assert await direct.exists(name + ":fence") == 0  # no fence key left behind
    finally:
        await direct.aclose()


async def test_a_redis_copy_never_decides(db: Database, clock: FrozenClock) -> None:
    """A stale copy left in Redis (its release lost while Redis was cut) blocks nobody, and a
    holder that only Redis knows is not a holder."""
    direct = _client()
    try:
        name = _name()
        await direct.set(name, "someone-elses-token", px=TTL * 1000)
        leases = PairedLeases(PostgresLeases(db, clock), direct, RedisBreaker())
        lease = await leases.acquire(name, TTL)
        assert lease is not None
        assert await direct.get(name) == lease.token.encode()  # the copy is the holder's now
        await leases.release(lease)
    finally:
        await direct.aclose()


async def test_redis_cut_mid_lease_one_authority_and_no_wait_per_call(
    db: Database, clock: FrozenClock, proxy: TcpProxy
) -> None:
    client = _client(proxy.port)
    breaker = RedisBreaker()
    try:
        first = PairedLeases(PostgresLeases(db, clock), client, breaker)
        name = _name()
        held = await first.acquire(name, TTL)
        assert held is not None and not breaker.is_open

        await proxy.cut()
        # the holder keeps its lease: PostgreSQL answers; the copy's failure opens the breaker
        assert await first.extend(held)
        assert breaker.is_open and breaker.last_error
        # a second run (another process: its own breaker) cannot take it, Redis or not
        second = PairedLeases(PostgresLeases(db, clock), _client(proxy.port), RedisBreaker())
        assert await second.acquire(name, TTL) is None
        # with the breaker open, no call waits on Redis
        started = time.perf_counter()
        for _ in range(20):
            assert await first.extend(held)
        assert time.perf_counter() - started < 1.0
        assert await first.release(held)
        assert await second.acquire(name, TTL) is not None
    finally:
        await client.aclose()


async def test_a_silent_redis_costs_one_timeout_then_the_breaker_skips_it(
    db: Database, clock: FrozenClock, proxy: TcpProxy
) -> None:
    client = _client(proxy.port)
    breaker = RedisBreaker()
    try:
        processed = RedisProcessedUrls(
            client, f"nightcrew:test:{uuid.uuid4().hex}", breaker=breaker
        )
        leases = PairedLeases(PostgresLeases(db, clock), client, breaker)
        assert await processed.seen(["https://a.example/1"]) == set()
        proxy.blackhole()
        started = time.perf_counter()
        with pytest.raises(ProcessedUrlsDown):
            await processed.seen(["https://a.example/1"])
        assert time.perf_counter() - started < 3.0  # one short read timeout, not 5 s
        since = breaker.now()
        started = time.perf_counter()
        for _ in range(10):
            assert await leases.acquire(_name(), TTL) is not None  # PostgreSQL's
            with pytest.raises(ProcessedUrlsDown, match="skipped"):
                await processed.add(["https://a.example/2"])
        assert time.perf_counter() - started < 1.0
        assert breaker.failed_since(since)
    finally:
        await proxy.restore()
        await client.aclose()


async def test_the_processed_set_has_a_ttl() -> None:
    client = _client()
    key = f"nightcrew:test:{uuid.uuid4().hex}"
    try:
        processed = RedisProcessedUrls(client, key)
        await processed.add(["https://a.example/1", "https://a.example/2"])
        assert await processed.seen(["https://a.example/2", "https://a.example/3"]) == {
            "https://a.example/2"
        }
        assert PROCESSED_SET_TTL_SECONDS - 5 < await client.ttl(key) <= PROCESSED_SET_TTL_SECONDS
    finally:
        await client.delete(key)
        await client.aclose()


def test_the_breaker_half_opens_after_its_pause() -> None:
    now = [100.0]
    breaker = RedisBreaker(retry_after_seconds=30, monotonic=lambda: now[0])
    assert not breaker.is_open and not breaker.failed_since(0)
    breaker.failure("ConnectionError: refused")
    assert breaker.is_open and breaker.failed_since(100.0)
    now[0] = 129.9
    assert breaker.is_open
    now[0] = 130.0
    assert not breaker.is_open  # one call may try again
    assert breaker.failed_since(99.0) and not breaker.failed_since(101.0)
    breaker.success()
    assert not breaker.is_open
