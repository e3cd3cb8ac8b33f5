"""Leases and fences, for both engines.

A lease keeps a second worker off work that is under way: the inline run's shard lease (and its
per-article review locks, ``review.review_lock_name``), the pipeline's stage leases. Each is
decided by PostgreSQL (the adapters' leases: ``PairedLeases`` with a Redis copy when Redis is
configured).
A fence keeps out the *results* of a holder whose lease ran out: every new holder of a shard
draws a higher fence, and a write goes in only under a fence at least as new as any used.
"""

from __future__ import annotations

import hashlib

from nightcrew.adapters.locks import Lease, Leases
from nightcrew.config import Settings
from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, warning

SQL = load_queries(__file__)


class StaleLease(NightcrewError):
    """A newer holder of the shard has written: this run's writes are refused (inline)."""


class Superseded(NightcrewError):
    """A newer holder took the candidate (its fence moved on): this result is not saved
    (pipeline)."""


def shard_lock_name(shard: str) -> str:
    return f"news:shard:{shard}"


async def acquire_shard(leases: Leases, settings: Settings, shard: str) -> Lease | None:
    """Spec 001's shard lock, for a run or a pass alike (UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS):
    None when another run or pass of the shard holds it."""
    return await leases.acquire(shard_lock_name(shard), settings.worker_lock_ttl_seconds)


async def extend_shard(leases: Leases, settings: Settings, lease: Lease) -> bool:
    """The shard lock extended before expensive work (holder-only, the TTL replaced); False
    when it is lost."""
    return await leases.extend(lease, settings.worker_lock_ttl_seconds)


def shard_renewal_seconds(settings: Settings) -> float:
    """How often work that runs long under the shard lock extends it (a third of its TTL)."""
    return settings.worker_lock_ttl_seconds / 3


def stage_lease_name(stage: str, key: str) -> str:
    """A pipeline stage's lease on one candidate (or source): hashed, so a URL of any length
    makes a short key."""
    return f"news:{stage}:" + hashlib.sha256(key.encode()).hexdigest()[:32]


async def release_quietly(leases: Leases, lease: Lease, *, forget: bool = False) -> bool:
    """A lease that cannot be released now (its backend is down) runs out its TTL meanwhile:
    False, logged, never raised. (The pipeline's stages release this way, and remember what
    they could not release; the inline run lets a failed release raise.) ``forget``: as
    ``Leases.release``."""
    try:
        await leases.release(lease, forget=forget)
    except NightcrewError as exc:
        warning("news.lease_release_failed", lease=lease.name, error=describe_error(exc))
        return False
    return True


async def draw_fence(db: Database, shard: str) -> int:
    """A new holder's fence for ``shard``: higher than any drawn before, so an older holder
    (one whose lease ran out and was taken over) is fenced out."""
    drawn = await db.fetch_value(int, SQL["draw_fence"], {"shard": shard})
    assert drawn is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always yields the row
    return drawn


async def holds_fence(db: Database | Tx, shard: str, fence: int) -> bool:
    """Whether ``fence`` is still at least the newest any writer of ``shard`` has used (and
    records it as used): False means a newer holder has written."""
    return await db.fetch_one(SQL["claim_fence"], {"shard": shard, "fence": fence}) is not None
