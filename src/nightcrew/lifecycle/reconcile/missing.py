"""Missing objects: always reported; quarantined only with ``quarantine_missing``, one
transaction per episode."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from nightcrew.db.records import as_records
from nightcrew.lifecycle import feed_outbox
from nightcrew.lifecycle.reconcile.core import (
    SAMPLE_KEYS,
)
from nightcrew.lifecycle.reconcile.listing import HEAD_CONCURRENCY
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import Missing, MissingSample
from nightcrew.lifecycle.reconcile.scope import RunScope
from nightcrew.log import event
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime


@dataclass(frozen=True, kw_only=True, slots=True)
class MissingCandidate:
    """missing_candidates: an enclosure whose key is not in the listing, as the scan saw it."""

    id: UUID
    status: str
    audio_url: str
    key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class _Locked:
    """lock_episode: the episode's current state, locked for its quarantine."""

    podcast_id: UUID
    status: str
    audio_url: str | None


async def find_missing(scope: RunScope) -> Missing:
    runtime, conn, options = scope.runtime, scope.conn, scope.options
    prefix, now, tick = scope.prefix, scope.now, scope.tick
    count = candidates = quarantined = 0
    sample: list[MissingSample] = []
    failures: list[Failure] = []
    gate = asyncio.Semaphore(HEAD_CONCURRENCY)
    store = runtime.store

    async def present(key: str) -> bool:
        async with gate:
            return await store.head(key) is not None

    async for rows in conn.stream(SQL["missing_candidates"], {"prefix": prefix}):
        batch = as_records(MissingCandidate, rows)
        # One HEAD per candidate (it may have been uploaded after the listing passed its key),
        # a batch of them at a time.
        uploaded_since = await asyncio.gather(*(present(c.key) for c in batch))
        for candidate, late in zip(batch, uploaded_since, strict=True):
            candidates += 1
            if late:
                continue
            count += 1
            episode_id = str(candidate.id)
            if len(sample) < SAMPLE_KEYS:
                sample.append(
                    MissingSample(episode_id=episode_id, key=candidate.key, status=candidate.status)
                )
            if not (options.apply and options.quarantine_missing):
                continue
            # rolled back whole on a failure; the next run rediscovers it
            with one_item(failures, "reconcile_quarantine_failed", episode_id=episode_id):
                if await quarantine_episode(runtime, candidate, now):
                    quarantined += 1
        tick("missing objects", candidates)
    return Missing(
        count=count,
        candidates=candidates,
        quarantined=quarantined,
        sample=tuple(sample),
        failures=tuple(failures),
    )


async def quarantine_episode(runtime: Runtime, scanned: MissingCandidate, now: datetime) -> bool:
    """The complete transition, in one transaction, by the episode's CURRENT state."""
    async with runtime.db.transaction() as tx:
        current = await tx.fetch_one_as(_Locked, SQL["lock_episode"], {"id": scanned.id})
        if current is None or current.audio_url != scanned.audio_url:
            return False  # deleted, or re-uploaded since the scan
        await tx.execute(SQL["quarantine_episode"], {"id": scanned.id, "now": now})
        if current.status in ("published", "scheduled"):
            await tx.execute(SQL["cancel_time_automation"], {"id": scanned.id, "now": now})
        if current.status == "published":
            await feed_outbox.record(tx, [str(current.podcast_id)], "quarantine_missing", now)
    event(
        "reconcile_episode_quarantined",
        episode_id=str(scanned.id),
        previous_status=current.status,
    )
    return True
