"""The feed-invalidation outbox, shared by the reconciler and the overage escalation: record an
intent inside the caller's transaction; mark it delivered only on a confirmed 2xx."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)


async def record(
    db: Database | Tx, podcast_ids: list[str], reason: str, now: datetime
) -> list[dict[str, Any]]:
    """One intent per podcast; returns their ``id`` and ``podcast_id``."""
    if not podcast_ids:
        return []
    return await db.fetch(SQL["record"], {"podcast_ids": podcast_ids, "reason": reason, "now": now})


async def mark_delivered(db: Database, ids: list[str], now: datetime) -> None:
    await db.execute(SQL["delivered"], {"ids": ids, "now": now})


async def mark_failed(db: Database, ids: list[str], error: str) -> None:
    await db.execute(SQL["failed"], {"ids": ids, "error": error})
