"""Missing objects: always reported; quarantined only with ``quarantine_missing``, one
transaction per episode."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from nightcrew.db.database import Tx
from nightcrew.effects import feed_outbox
from nightcrew.lifecycle.reconcile.core import (
    SAMPLE_KEYS,
    ReconcileOptions,
)
from nightcrew.lifecycle.reconcile.listing import HEAD_CONCURRENCY
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import Missing, MissingSample, Progress
from nightcrew.log import event
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime


async def find_missing(
    runtime: Runtime,
    conn: Tx,
    options: ReconcileOptions,
    prefix: str,
    now: datetime,
    tick: Progress,
) -> Missing:
    count = candidates = quarantined = 0
    sample: list[MissingSample] = []
    failures: list[Failure] = []
    gate = asyncio.Semaphore(HEAD_CONCURRENCY)
    store = runtime.store

    async def present(key: str) -> bool:
        async with gate:
            return await store.head(key) is not None

    async for rows in conn.stream(SQL["missing_candidates"], {"prefix": prefix}):
        # One HEAD per candidate (it may have been uploaded after the listing passed its key),
        # a batch of them at a time.
        uploaded_since = await asyncio.gather(*(present(r["key"]) for r in rows))
        for row, late in zip(rows, uploaded_since, strict=True):
            candidates += 1
            if late:
                continue
            count += 1
            if len(sample) < SAMPLE_KEYS:
                sample.append(
                    MissingSample(episode_id=str(row["id"]), key=row["key"], status=row["status"])
                )
            if not (options.apply and options.quarantine_missing):
                continue
            # rolled back whole on a failure; the next run rediscovers it
            with one_item(failures, "reconcile_quarantine_failed", episode_id=str(row["id"])):
                if await quarantine_episode(runtime, row, now):
                    quarantined += 1
        tick("missing objects", candidates)
    return Missing(
        count=count,
        candidates=candidates,
        quarantined=quarantined,
        sample=tuple(sample),
        failures=tuple(failures),
    )


async def quarantine_episode(runtime: Runtime, row: dict[str, Any], now: datetime) -> bool:
    """The complete transition, in one transaction, by the row's CURRENT state."""
    async with runtime.db.transaction() as tx:
        current = await tx.fetch_one(SQL["lock_episode"], {"id": row["id"]})
        if current is None or current["audio_url"] != row["audio_url"]:
            return False  # deleted, or re-uploaded since the scan
        await tx.execute(SQL["quarantine_episode"], {"id": row["id"], "now": now})
        if current["status"] in ("published", "scheduled"):
            await tx.execute(SQL["cancel_time_automation"], {"id": row["id"], "now": now})
        if current["status"] == "published":
            await feed_outbox.record(tx, [str(current["podcast_id"])], "quarantine_missing", now)
    event(
        "reconcile_episode_quarantined",
        episode_id=str(row["id"]),
        previous_status=current["status"],
    )
    return True
