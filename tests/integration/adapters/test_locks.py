"""Leases on real PostgreSQL (and their copy in real Redis): one holder, holder-only
extend/release, fencing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest

from nightcrew.adapters.locks import Leases, PairedLeases, PostgresLeases
from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from tests.support.services import REDIS_URL, needs_redis

# Far longer than any test takes, however loaded the machine: a lease expires only when a test
# makes it (the clock moved past it), never by a slow step.
TTL = 60


class Backend:
    def __init__(self, leases: Leases, expire: Callable[[str], Awaitable[None]]) -> None:
        self.leases = leases
        self.expire = expire  # let the lease of that name run out


@pytest.fixture(params=["postgres", pytest.param("postgres+redis", marks=needs_redis)])
async def backend(
    request: pytest.FixtureRequest, db: Database, clock: FrozenClock
) -> AsyncIterator[Backend]:
    async def advance(name: str) -> None:
        clock.advance(timedelta(seconds=TTL + 1))

    if request.param == "postgres":
        yield Backend(PostgresLeases(db, clock), advance)
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    try:
        # PostgreSQL decides; the copy in Redis must not change a single answer
        yield Backend(PairedLeases(PostgresLeases(db, clock), client, RedisBreaker()), advance)
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
    forged = type(mine)(name=name, fence=mine.fence, ttl_seconds=TTL, token="not-the-token")
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


async def test_a_forgotten_lease_leaves_no_row_and_only_its_holder_can_forget_it(
    backend: Backend, db: Database
) -> None:
    """A per-article lease released with ``forget`` (review locks, stage leases) goes with its
    row, so the table holds what is in flight, not every article ever processed."""
    names = [_name() for _ in range(3)]
    held = await backend.leases.acquire_many(names, TTL)
    forged = type(held[names[0]])(name=names[0], fence=1, ttl_seconds=TTL, token="not-it")

    assert not await backend.leases.release(forged, forget=True)
    await backend.leases.release_many([held[n] for n in names[1:]], forget=True)
    rows = await db.fetch("SELECT name FROM nightcrew.leases WHERE name = ANY(%(n)s)", {"n": names})
    assert [r["name"] for r in rows] == [names[0]]  # the forged release touched nothing
    assert await backend.leases.acquire(names[1], TTL) is not None  # free again, fence anew
    assert await backend.leases.release(held[names[0]], forget=True)
    assert (
        await db.fetch("SELECT name FROM nightcrew.leases WHERE name = %(n)s", {"n": names[0]})
        == []
    )


@needs_redis
async def test_extend_replaces_the_ttl_it_never_adds_in_both_places(
    db: Database, clock: FrozenClock
) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    try:
        leases = PairedLeases(PostgresLeases(db, clock), client, RedisBreaker())
        name = _name()
        lease = await leases.acquire(name, 10)
        assert lease is not None
        for _ in range(3):
            assert await leases.extend(lease, 10)
        assert 9000 < await client.pttl(name) <= 10000  # not 40 s
        row = await db.fetch_one(
            "SELECT expires_at FROM nightcrew.leases WHERE name = %(n)s", {"n": name}
        )
        assert row is not None and row["expires_at"] == clock.now() + timedelta(seconds=10)
        await leases.release(lease)
        assert not await client.exists(name)
    finally:
        await client.aclose()
