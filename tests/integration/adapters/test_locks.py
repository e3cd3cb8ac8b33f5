"""Leases on real Redis and real PostgreSQL: one holder, holder-only extend/release, fencing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from nightcrew.adapters.locks import FENCE_SUFFIX, Leases, PostgresLeases, RedisLeases
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from tests.support.services import REDIS_URL, needs_redis


class Backend:
    def __init__(self, leases: Leases, expire: object) -> None:
        self.leases = leases
        self.expire = expire  # async callable: let every TTL run out


@pytest.fixture(params=["postgres", pytest.param("redis", marks=needs_redis)])
async def backend(
    request: pytest.FixtureRequest, db: Database, clock: FrozenClock
) -> AsyncIterator[Backend]:
    if request.param == "postgres":

        async def advance() -> None:
            clock.advance(timedelta(seconds=2))

        yield Backend(PostgresLeases(db, clock), advance)
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)

    async def wait() -> None:
        await asyncio.sleep(1.2)

    try:
        yield Backend(RedisLeases(client), wait)
    finally:
        await client.aclose()


def _name() -> str:
    return f"nightcrew:test:shard-{uuid.uuid4().hex[:8]}"


async def test_one_holder_at_a_time_and_release_frees_it(backend: Backend) -> None:
    name = _name()
    first = await backend.leases.acquire(name, 1)
    assert first is not None and first.fence == 1
    assert await backend.leases.acquire(name, 1) is None
    assert await backend.leases.release(first)
    again = await backend.leases.acquire(name, 1)
    assert again is not None and again.fence == 2
    assert first.token not in repr(first)  # a token is never printed


async def test_only_the_holder_extends_or_releases(backend: Backend) -> None:
    name = _name()
    mine = await backend.leases.acquire(name, 1)
    assert mine is not None
    forged = type(mine)(
        name=name, fence=mine.fence, ttl_seconds=1, token="not-the-token", handle=None
    )
    if backend.leases.backend == "redis":
        from redis.asyncio.lock import Lock

        lock = Lock(mine.handle.redis, name, timeout=1, thread_local=False)
        lock.local.token = b"not-the-token"
        forged = type(mine)(name=name, fence=mine.fence, ttl_seconds=1, token="x", handle=lock)
    assert not await backend.leases.extend(forged)
    assert not await backend.leases.release(forged)
    assert await backend.leases.extend(mine)
    assert await backend.leases.release(mine)


async def test_an_expired_lease_goes_to_the_next_holder_with_a_higher_fence(
    backend: Backend,
) -> None:
    name = _name()
    old = await backend.leases.acquire(name, 1)
    assert old is not None
    await backend.expire()  # type: ignore[operator]
    new = await backend.leases.acquire(name, 1)
    assert new is not None and new.fence > old.fence
    assert not await backend.leases.extend(old)  # the old holder is fenced out
    assert not await backend.leases.release(old)
    assert await backend.leases.release(new)


@needs_redis
async def test_redis_extend_replaces_the_ttl_it_never_adds() -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    try:
        leases = RedisLeases(client)
        name = _name()
        lease = await leases.acquire(name, 10)
        assert lease is not None
        for _ in range(3):
            assert await leases.extend(lease, 10)
        assert 9000 < await client.pttl(name) <= 10000  # not 40 s
        await leases.release(lease)
        await client.delete(name + FENCE_SUFFIX)
    finally:
        await client.aclose()
