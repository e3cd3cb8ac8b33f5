"""The feed-invalidation outbox (``public.feed_invalidation_outbox``), shared by the reconciler
and the overage escalation: record an intent inside the caller's transaction, together with
the ``feed_invalidate`` effect that delivers it; mark intents delivered only on a confirmed 2xx.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.effects.outbox import Effect, adopt_feed_outbox

SQL = load_queries(__file__)


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
