"""Leases (named, expiring, holder-only locks): Redis when configured, PostgreSQL otherwise.

Both backends give the same guarantees:

* ``acquire`` succeeds for one holder at a time and returns a lease carrying a random token
  (never logged) and a fencing number that grows with every new holder;
* ``extend`` and ``release`` work only for the holder (the token is checked atomically), and
  ``extend`` *replaces* the TTL — redis-py's ``Lock.extend`` adds to the remaining TTL unless
  told ``replace_ttl=True``, a classic source of immortal locks;
* a lease whose TTL ran out can be taken by someone else, whose fence is higher (within one
  backend: a caller that may switch backends — the news shard — draws its fence elsewhere).

Redis locks are redis-py ``Lock`` objects with explicit tokens and ``thread_local=False``: the
default thread-local token is shared by every task of one event loop. When Redis itself fails
(connection refused or cut, a timeout), ``acquire`` raises ``LeaseBackendDown`` so the caller can
fall back to PostgreSQL, and ``extend``/``release`` answer False: a lease that cannot be proven
is treated as lost, never as held.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from nightcrew.adapters.processed import redis_failures
from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.clock import Clock
from nightcrew.db.database import Database
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, warning

FENCE_SUFFIX = ":fence"
# A fence must only grow while a holder of an older one can still be alive: at most the
# longest lease (the review lock, 30 min) plus a write in flight. A day is far past that, and
# the key still goes (every key nightcrew writes has a TTL).
FENCE_TTL_SECONDS = 24 * 3600
ACQUIRE_WITH_FENCE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = redis.call('incr', KEYS[2])
    redis.call('pexpire', KEYS[2], ARGV[3])
    return fence
end
return 0
"""
# The mirror of a PostgreSQL lease in Redis: written over whatever is there (the authority
# granted it), extended and deleted only under the holder's token.
MIRROR_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
MIRROR_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class LeaseBackendDown(NightcrewError):
    """The lease backend (Redis) could not be reached; the message says how."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    name: str
    fence: int
    ttl_seconds: float
    token: str = field(repr=False)
    handle: Any = field(default=None, repr=False, compare=False)


class Leases(Protocol):
    backend: str

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None: ...

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        """Every lease of ``names`` that was free, in as few round trips as the backend can."""
        ...

    async def release_many(self, leases: list[Lease]) -> None: ...

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool: ...

    async def renew(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        """``extend``, except that a backend that cannot be reached raises LeaseBackendDown
        rather than answering False: a caller that reports which backend it used (the news
        run's ``redisEnabled``) needs to tell a lost lease from a lost Redis."""
        ...

    async def release(self, lease: Lease) -> bool: ...


T = TypeVar("T")


async def with_fallback(
    leases: Leases,
    fallback: Leases,
    take: Callable[[Leases], Awaitable[T]],
    on_down: Callable[[LeaseBackendDown], None],
) -> tuple[Leases, T]:
    """``take`` from ``leases``; when their backend (Redis) cannot be reached, ``on_down`` is
    told and ``take`` runs on ``fallback`` (PostgreSQL's) instead — Redis trouble never stops
    the work (spec 001). Returns the leases that answered: release and extend go to them."""
    try:
        return leases, await take(leases)
    except LeaseBackendDown as exc:
        on_down(exc)
        return fallback, await take(fallback)


class RedisLeases:
    backend = "redis"

    def __init__(self, redis: Any) -> None:
        self._redis = redis

    async def acquire(self, name: str, ttl_seconds: float, *, fence_floor: int = 0) -> Lease | None:
        from redis.asyncio.lock import Lock

        token = secrets.token_hex(16)
        # Lock and fence in one atomic step: a holder that stalls between the two could
        # otherwise draw a newer fence than the holder that replaced it.
        try:
            fence = int(
                await self._redis.eval(
                    ACQUIRE_WITH_FENCE,
                    2,
                    name,
                    name + FENCE_SUFFIX,
                    token,
                    int(ttl_seconds * 1000),
                    FENCE_TTL_SECONDS * 1000,
                )
            )
        except redis_failures() as exc:
            raise LeaseBackendDown(f"Redis lease {name}: {describe_error(exc)}") from exc
        if fence == 0:
            return None
        lock = Lock(self._redis, name, timeout=ttl_seconds, blocking=False, thread_local=False)
        lock.local.token = token.encode()  # the Lock extends and releases with our token
        return Lease(name=name, fence=fence, ttl_seconds=ttl_seconds, token=token, handle=lock)

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        leases = {}
        for name in names:  # one round trip each: Redis answers in microseconds
            lease = await self.acquire(name, ttl_seconds)
            if lease is not None:
                leases[name] = lease
        return leases

    async def release_many(self, leases: list[Lease]) -> None:
        for lease in leases:
            await self.release(lease)

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        try:
            return await self.renew(lease, ttl_seconds)
        except LeaseBackendDown:
            return False

    async def renew(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        from redis.exceptions import LockError

        try:
            return bool(
                await lease.handle.extend(ttl_seconds or lease.ttl_seconds, replace_ttl=True)
            )
        except LockError:  # LockNotOwnedError included: expired, or someone else holds it
            return False
        except redis_failures() as exc:
            warning("lease.redis_unavailable", lease=lease.name, error=describe_error(exc))
            raise LeaseBackendDown(f"Redis lease {lease.name}: {describe_error(exc)}") from exc

    async def release(self, lease: Lease) -> bool:
        from redis.exceptions import LockError

        try:
            await lease.handle.release()
        except LockError:
            return False
        except redis_failures() as exc:  # it expires by its TTL
            warning("lease.redis_unavailable", lease=lease.name, error=describe_error(exc))
            return False
        return True


class PostgresLeases:
    backend = "postgres"

    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def acquire(self, name: str, ttl_seconds: float, *, fence_floor: int = 0) -> Lease | None:
        return (await self._acquire([name], ttl_seconds, fence_floor)).get(name)

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        return await self._acquire(names, ttl_seconds, 0)

    async def _acquire(
        self, names: list[str], ttl_seconds: float, fence_floor: int
    ) -> dict[str, Lease]:
        if not names:
            return {}
        now = self._clock.now()
        token = secrets.token_hex(16)  # one token for the batch; names keep them apart
        rows = await self._db.fetch(
            "INSERT INTO nightcrew.leases AS l (name, token, fence, expires_at)"
            " SELECT n, %(token)s, 1, %(expires)s FROM unnest(%(names)b::text[]) AS n"
            " ON CONFLICT (name) DO UPDATE"
            "   SET token = excluded.token, fence = l.fence + 1, expires_at = excluded.expires_at"
            "   WHERE l.expires_at <= %(now)s"
            " RETURNING name, fence",
            {
                "names": names,
                "token": token,
                "now": now,
                "expires": now + timedelta(seconds=ttl_seconds),
            },
        )
        return {
            r["name"]: Lease(
                name=r["name"], fence=int(r["fence"]), ttl_seconds=ttl_seconds, token=token
            )
            for r in rows
        }

    async def release_many(self, leases: list[Lease]) -> None:
        by_token: dict[str, list[str]] = {}
        for lease in leases:
            by_token.setdefault(lease.token, []).append(lease.name)
        for token, names in by_token.items():
            await self._expire(names, token)

    async def _expire(self, names: list[str], token: str) -> int:
        # Expire rather than delete: the row keeps the fence, which must only grow.
        return await self._db.execute(
            "UPDATE nightcrew.leases SET token = '', expires_at = '-infinity'"
            " WHERE name = ANY(%(names)b::text[]) AND token = %(token)s",
            {"names": names, "token": token},
        )

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        now = self._clock.now()
        touched = await self._db.execute(
            "UPDATE nightcrew.leases SET expires_at = %(expires)s"
            " WHERE name = %(name)s AND token = %(token)s AND expires_at > %(now)s",
            {
                "name": lease.name,
                "token": lease.token,
                "now": now,
                "expires": now + timedelta(seconds=ttl_seconds or lease.ttl_seconds),
            },
        )
        return touched == 1

    async def renew(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        return await self.extend(lease, ttl_seconds)

    async def release(self, lease: Lease) -> bool:
        return await self._expire([lease.name], lease.token) == 1


class PairedLeases:
    """One lock authority, PostgreSQL, mirrored in Redis.

    A lease is decided by PostgreSQL alone (``nightcrew.leases``: token-checked, fenced), so two
    holders can never hold one name in two places that cannot see each other — not when Redis
    is cut mid-run, not when it comes back. Redis carries a copy of every held lease (the
    spec's key, the holder's token, the same TTL) for whoever watches Redis; writing the copy
    is best effort, under the process's circuit breaker: one Redis failure and the copies stop
    for ``REDIS_RETRY_AFTER_SECONDS``, with no timeout paid per call, while the leases go on.
    """

    backend = "postgres+redis"

    def __init__(self, authority: PostgresLeases, redis: Any, breaker: RedisBreaker) -> None:
        self._authority = authority
        self._redis = redis
        self._breaker = breaker

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        lease = await self._authority.acquire(name, ttl_seconds)
        if lease is not None:
            await self._mirror([lease], "set")
        return lease

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        leases = await self._authority.acquire_many(names, ttl_seconds)
        await self._mirror(list(leases.values()), "set")
        return leases

    async def release_many(self, leases: list[Lease]) -> None:
        await self._authority.release_many(leases)
        await self._mirror(leases, "release")

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        held = await self._authority.extend(lease, ttl_seconds)
        if held:
            await self._mirror([lease], "extend", ttl_seconds)
        return held

    async def renew(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        return await self.extend(lease, ttl_seconds)

    async def release(self, lease: Lease) -> bool:
        released = await self._authority.release(lease)
        await self._mirror([lease], "release")
        return released

    async def _mirror(
        self, leases: list[Lease], action: str, ttl_seconds: float | None = None
    ) -> None:
        if not leases or self._breaker.is_open:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for lease in leases:
                    ttl_ms = int((ttl_seconds or lease.ttl_seconds) * 1000)
                    if action == "set":
                        pipe.set(lease.name, lease.token, px=ttl_ms)
                    elif action == "extend":
                        pipe.eval(MIRROR_EXTEND, 1, lease.name, lease.token, ttl_ms)
                    else:
                        pipe.eval(MIRROR_RELEASE, 1, lease.name, lease.token)
                await pipe.execute()
        except redis_failures() as exc:
            error = describe_error(exc)
            self._breaker.failure(error)
            warning("lease.redis_unavailable", lease=leases[0].name, error=error)
            return
        self._breaker.success()
