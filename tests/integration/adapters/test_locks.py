"""Leases on real Redis and real PostgreSQL: one holder, holder-only extend/release, fencing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest

from nightcrew.adapters.locks import (
    FENCE_SUFFIX,
    FENCE_TTL_SECONDS,
    Leases,
    PostgresLeases,
    RedisLeases,
)
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from tests.support.services import REDIS_URL, needs_redis

# Far longer than any test takes, however loaded the machine: a lease expires only when a test
# makes it (the clock moved past it, or Redis told to drop the key), never by a slow step.
TTL = 60


class Backend:
    def __init__(self, leases: Leases, expire: Callable[[str], Awaitable[None]]) -> None:
        self.leases = leases
        self.expire = expire  # let the lease of that name run out


@pytest.fixture(params=["postgres", pytest.param("redis", marks=needs_redis)])
async def backend(
    request: pytest.FixtureRequest, db: Database, clock: FrozenClock
) -> AsyncIterator[Backend]:
    if request.param == "postgres":

        async def advance(name: str) -> None:
            clock.advance(timedelta(seconds=TTL + 1))

        yield Backend(PostgresLeases(db, clock), advance)
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)

    async def run_out(name: str) -> None:
        """Redis's own expiry, brought forward: the key's TTL cut to a millisecond, then wait
        (generously) until Redis has dropped it."""
        assert await client.pexpire(name, 1)
        for _ in range(3000):  # 30 s at most
            if not await client.exists(name):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"Redis kept {name} past its TTL")

    try:
        yield Backend(RedisLeases(client), run_out)
    finally:
        await client.aclose()


def _name() -> str:
    return f"nightcrew:test:shard-{uuid.uuid4().hex[:8]}"


async def test_one_holder_at_a_time_and_release_frees_it(backend: Backend) -> None:
    name = _name()
    first = await backend.leases.acquire(name, TTL)
    assert first is not None and first.fence == 1
    assert await backend.leases.acquire(name, TTL) is None
    assert await backend.leases.release(first)
    again = await backend.leases.acquire(name, TTL)
    assert again is not None and again.fence == 2
    assert first.token not in repr(first)  # a token is never printed


async def test_only_the_holder_extends_or_releases(backend: Backend) -> None:
    name = _name()
    mine = await backend.leases.acquire(name, TTL)
    assert mine is not None
    forged = type(mine)(
        name=name, fence=mine.fence, ttl_seconds=TTL, token="not-the-token", handle=None
    )
    if backend.leases.backend == "redis":
        from redis.asyncio.lock import Lock

        lock = Lock(mine.handle.redis, name, timeout=TTL, thread_local=False)
        lock.local.token = b"not-the-token"
        forged = type(mine)(name=name, fence=mine.fence, ttl_seconds=TTL, token="x", handle=lock)
    assert not await backend.leases.extend(forged)
    assert not await backend.leases.release(forged)
    assert await backend.leases.extend(mine)
    assert await backend.leases.release(mine)


async def test_an_expired_lease_goes_to_the_next_holder_with_a_higher_fence(
    backend: Backend,
) -> None:
    name = _name()
    old = await backend.leases.acquire(name, TTL)
    assert old is not None
    await backend.expire(name)
    new = await backend.leases.acquire(name, TTL)
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
        # the fence key goes too, in a day (it must only outlive every older holder)
        assert 0 < await client.ttl(name + FENCE_SUFFIX) <= FENCE_TTL_SECONDS
        await leases.release(lease)
        await client.delete(name + FENCE_SUFFIX)
    finally:
        await client.aclose()
