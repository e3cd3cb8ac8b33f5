"""Leases (named, expiring, holder-only locks), decided by PostgreSQL.

* ``acquire`` succeeds for one holder at a time and returns a lease carrying a random token
  (never logged) and a fencing number that grows with every new holder;
* ``extend`` and ``release`` work only for the holder (the token is checked in the statement),
  and ``extend`` *replaces* the TTL — never adds to it, a classic source of immortal locks;
* a lease whose TTL ran out can be taken by someone else, whose fence is higher.

``PostgresLeases`` is the one authority. With Redis configured, ``PairedLeases`` copies every
held lease to Redis (the spec's key, the holder's token, the same TTL) for whoever watches
Redis; Redis never decides a lease, so a Redis cut mid-run cannot let two holders in. (Before
migration 0022 Redis decided and PostgreSQL was a fallback that could not see it: README,
"Upgrading to one lock authority".)
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from nightcrew.adapters.processed import redis_failures
from nightcrew.adapters.redis_breaker import RedisBreaker
from nightcrew.clock import Clock
from nightcrew.db.database import Database
from nightcrew.log import describe_error, warning

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


@dataclass(frozen=True, kw_only=True)
class Lease:
    name: str
    fence: int
    ttl_seconds: float
    token: str = field(repr=False)


class Leases(Protocol):
    backend: str

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None: ...

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        """Every lease of ``names`` that was free, in as few round trips as the backend can."""
        ...

    async def release_many(self, leases: list[Lease], *, forget: bool = False) -> None:
        """``forget``: see ``release``."""
        ...

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool: ...

    async def release(self, lease: Lease, *, forget: bool = False) -> bool:
        """The lease given up (holder-only). ``forget``: its row goes too, and the name's fence
        starts again at 1 — for a name taken once per article (a review lock, a stage's lease
        on one candidate), whose fence nobody reads: kept, such rows would grow with every
        article ever processed."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class _Granted:
    name: str
    fence: int


class PostgresLeases:
    backend = "postgres"

    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def acquire(self, name: str, ttl_seconds: float) -> Lease | None:
        return (await self.acquire_many([name], ttl_seconds)).get(name)

    async def acquire_many(self, names: list[str], ttl_seconds: float) -> dict[str, Lease]:
        if not names:
            return {}
        now = self._clock.now()
        token = secrets.token_hex(16)  # one token for the batch; names keep them apart
        rows = await self._db.fetch_as(
            _Granted,
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
            r.name: Lease(name=r.name, fence=r.fence, ttl_seconds=ttl_seconds, token=token)
            for r in rows
        }

    async def release_many(self, leases: list[Lease], *, forget: bool = False) -> None:
        by_token: dict[str, list[str]] = {}
        for lease in leases:
            by_token.setdefault(lease.token, []).append(lease.name)
        for token, names in by_token.items():
            await self._expire(names, token, forget=forget)

    async def _expire(self, names: list[str], token: str, *, forget: bool) -> int:
        if forget:
            return await self._db.execute(
                "DELETE FROM nightcrew.leases"
                " WHERE name = ANY(%(names)b::text[]) AND token = %(token)s",
                {"names": names, "token": token},
            )
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

    async def release(self, lease: Lease, *, forget: bool = False) -> bool:
        return await self._expire([lease.name], lease.token, forget=forget) == 1


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

    async def release_many(self, leases: list[Lease], *, forget: bool = False) -> None:
        await self._authority.release_many(leases, forget=forget)
        await self._mirror(leases, "release")

    async def extend(self, lease: Lease, ttl_seconds: float | None = None) -> bool:
        held = await self._authority.extend(lease, ttl_seconds)
        if held:
            await self._mirror([lease], "extend", ttl_seconds)
        return held

    async def release(self, lease: Lease, *, forget: bool = False) -> bool:
        released = await self._authority.release(lease, forget=forget)
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
