"""The feed-invalidation outbox (``public.feed_invalidation_outbox``), shared by the reconciler,
the deletions and the overage escalation: record an intent inside the caller's transaction,
together with the ``feed_invalidate`` effect that delivers it; mark intents delivered only on a
confirmed 2xx. The effect's handler (``HANDLER``) is registered at assembly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar
from uuid import UUID

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.db.records import as_record
from nightcrew.effects.deliver import Delivery, EffectHandler, delivered, failed
from nightcrew.effects.outbox import IDEMPOTENT_EFFECT_MAX_AGE, Effect, EffectPayload
from nightcrew.jsonable import Jsonable, named
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# Undelivered intents given an effect per minute-lane run.
ADOPT_MAX = 500


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedInvalidatePayload(EffectPayload):
    """A feed_invalidation_outbox intent to deliver. feed_outbox.sql writes it
    (adopt_feed_outbox), and a revival adds what only a reader of the row needs (``revived``,
    ``last_death``)."""

    kind: ClassVar[str] = "feed_invalidate"
    max_age: ClassVar[timedelta] = IDEMPOTENT_EFFECT_MAX_AGE
    podcast_id: str = named("podcast_id")
    outbox_id: str | None = named("outbox_id", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class PodcastInvalidation(Jsonable):
    """The body of a podcast's cache-invalidation message (``rss-invalidation``,
    ``public-api-invalidation``): ``type`` says what happened to it."""

    type: str  # podcast.deleted, podcast.suspended, podcast.restored
    podcast_id: str = named("podcast_id")
    podcast_slug: str = named("podcast_slug")


async def record(
    db: Database | Tx, podcast_ids: list[str], reason: str, now: datetime
) -> list[Effect]:
    """One intent per podcast, and its effect; returns the effects (payload ``podcast_id``,
    ``outbox_id``) for the caller's first delivery attempt after its commit."""
    if not podcast_ids:
        return []
    intents = await db.fetch_values(
        UUID, SQL["record"], {"podcast_ids": podcast_ids, "reason": reason, "now": now}
    )
    ids = [str(i) for i in intents]
    return await adopt_feed_outbox(db, now, limit=len(ids), ids=ids)


async def count_pending(db: Database) -> int:
    """Undelivered intents, of every podcast: how many invalidations are still owed."""
    return await db.fetch_count(SQL["count_pending"])


async def pending_for_podcast(db: Database, podcast_id: str) -> list[str]:
    intents = await db.fetch_values(UUID, SQL["pending_for_podcast"], {"podcast_id": podcast_id})
    return [str(i) for i in intents]


async def mark_delivered(db: Database, ids: list[str], now: datetime) -> None:
    await db.execute(SQL["delivered"], {"ids": ids, "now": now})


async def mark_failed(db: Database, ids: list[str], error: str) -> None:
    await db.execute(SQL["failed"], {"ids": ids, "error": error})


async def adopt_feed_outbox(
    db: Database | Tx, now: datetime, *, limit: int, ids: Sequence[str] | None = None
) -> list[Effect]:
    """Give undelivered ``feed_invalidation_outbox`` intents (these ``ids``, or any) that have
    no effect the ``feed_invalidate`` effect that drives them; returns the effects created. An
    intent whose effect died is left to ``revive_feed_outbox`` (the reconciler's apply run)."""
    created, _ = await _adopt(db, now, limit=limit, ids=ids, revive=False)
    return created


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedOutboxDrive:
    """What ``revive_feed_outbox`` made due now: effects created, effects revived."""

    created: list[Effect]
    revived: list[Effect]


async def revive_feed_outbox(db: Database | Tx, now: datetime, *, limit: int) -> FeedOutboxDrive:
    """Make every undelivered intent (the oldest ``limit``) due for an attempt now, whatever
    became of its earlier effect: an effect is created where there is none, and one that died,
    or waits out a backoff, is revived in place with a fresh maximum age (feed_outbox.sql says
    why)."""
    created, revived = await _adopt(db, now, limit=limit, ids=None, revive=True)
    return FeedOutboxDrive(created=created, revived=revived)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Adopted:
    """Whether a row of adopt_feed_outbox is an effect revived in place (or one created)."""

    revived: bool


async def _adopt(
    db: Database | Tx,
    now: datetime,
    *,
    limit: int,
    ids: Sequence[str] | None,
    revive: bool,
) -> tuple[list[Effect], list[Effect]]:
    rows = await db.fetch(  # each row feeds two records: the effect, and how it was driven
        SQL["adopt_feed_outbox"],
        {
            "now": now,
            "expires_at": now + FeedInvalidatePayload.max_age,
            "limit": limit,
            "ids": list(ids) if ids is not None else None,
            "revive": revive,
        },
    )
    created: list[Effect] = []
    revived: list[Effect] = []
    for row in rows:
        driven = revived if as_record(_Adopted, row).revived else created
        driven.append(as_record(Effect, row))
    return created, revived


async def _deliver(runtime: Runtime, effects: Sequence[Effect], now: datetime) -> Delivery:
    """One confirmable call per podcast, for every intent of it the given effects drive."""
    intents = [e.read(FeedInvalidatePayload) for e in effects]
    podcast_id = intents[0].podcast_id
    # A confirmation settles every intent of the podcast owed before the call; intents that an
    # earlier confirmation already settled need no call at all.
    owed = await pending_for_podcast(runtime.db, podcast_id)
    mine = [i.outbox_id for i in intents if i.outbox_id]
    if mine and not runtime.dry_run and not set(mine) & set(owed):
        return delivered(via="an earlier confirmed invalidation")
    result = await runtime.feedcache.invalidate(podcast_id, wait=True)
    if result.ok:
        await mark_delivered(runtime.db, owed, now)
        return delivered(status=result.status, intents=len(owed))
    error = result.error or "not confirmed"
    await mark_failed(runtime.db, [i for i in mine if i in owed] or owed, error)
    return failed(error, permanent=result.permanent)


def _podcast(effect: Effect) -> str:
    """A confirmed call settles every intent of its podcast: one attempt per podcast."""
    return effect.read(FeedInvalidatePayload).podcast_id


async def _adopt_owed(db: Database, now: datetime) -> int:
    return len(await adopt_feed_outbox(db, now, limit=ADOPT_MAX))


HANDLER = EffectHandler(
    kind="feed_invalidate", deliver=_deliver, together=_podcast, adopt=_adopt_owed
)
