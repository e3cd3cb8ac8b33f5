"""Snapshot: a shard's public snapshot — its newest accepted articles as JSON in the object
store (``news/snapshots/{shard}.json``), what the news feed serves.

Both engines publish through ``publish_snapshot``. The inline run publishes once at the end of
its run, under its fence; the pipeline's write stage marks the shard stale (``mark_stale``) and
its workers publish stale shards at most once per NEWS_SNAPSHOT_DEBOUNCE_SECONDS
(``refresh_stale``): many writes, one snapshot per interval.
"""

from __future__ import annotations

import json
from datetime import datetime

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)

SNAPSHOT_SIZE = 50


async def publish_snapshot(db: Database, store: ObjectStore, shard: str, now: datetime) -> None:
    """The shard's public snapshot: its newest accepted articles."""
    latest = await db.fetch(SQL["snapshot"], {"shard": shard, "limit": SNAPSHOT_SIZE})
    document = {"shard": shard, "generatedAt": now.isoformat(), "articles": latest}
    await store.put(f"news/snapshots/{shard}.json", json.dumps(document, default=str).encode())


# --- the pipeline's debounce ---------------------------------------------------------------------
async def mark_stale(tx: Tx, shard: str, now: datetime) -> None:
    """``shard``'s snapshot is behind its articles (it stays stale since the first such write)."""
    await tx.execute(SQL["stale_snapshot"], {"shard": shard, "now": now})


async def any_due(db: Database, now: datetime, *, debounce_seconds: float) -> bool:
    """Whether a stale snapshot is due (``refresh_stale`` would publish one)."""
    due = await db.fetch_value(bool, SQL["any_due"], {"now": now, "debounce": debounce_seconds})
    return bool(due)


async def refresh_stale(
    db: Database, store: ObjectStore, now: datetime, *, debounce_seconds: float
) -> int:
    """Publish every stale shard snapshot not published within ``debounce_seconds``; how many.
    One that fails to publish is marked stale again (and the error raised), so it is not lost."""
    shards = await db.fetch_values(
        str, SQL["claim_snapshots"], {"now": now, "debounce": debounce_seconds}
    )
    for shard in shards:
        try:
            await publish_snapshot(db, store, shard, now)
        except Exception:
            await db.execute(SQL["restale_snapshot"], {"shard": shard, "now": now})
            raise
    return len(shards)
