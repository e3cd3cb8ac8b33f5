"""Daily lane, job 2: hard-delete expired podcasts, clean their storage, invalidate their feed.

For each due podcast, one transaction deletes the row (cascading to everything under it),
records the deletion in ``nightcrew.podcast_deletions`` and owes the feed invalidation as an
effect (``rss-invalidation`` queue, the feed worker's endpoint if the queue refuses). After the
commit:

1. every object under ``podcasts/{id}/`` is deleted, in pages of 1000, then re-listed;
2. the invalidation effect — held until now (spec 000's order: DELETE → R2 cleanup → RSS
   invalidation), so the minute lane cannot deliver it while the cleanup runs — is released
   and gets its first attempt; the minute lane retries it within minutes until it is
   confirmed. A run that dies mid-cleanup leaves it held: the next daily run finishes the
   cleanup and releases it (and, should no daily run come, it is due after CLEANUP_HOLD).

A storage or invalidation failure never undoes the database deletion. It is logged under the
spec's event, reported, and left on the record; every later daily run retries the storage and
reports both until they are done — so nothing is forgotten after a crash or an outage either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.adapters.storage import PrefixDeletion, StoredObject, delete_prefix
from nightcrew.clock import Clock
from nightcrew.db.database import Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import Delivery, deliver_now
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.log import describe_error, error, event
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# Earlier deletions whose cleanup is retried per run (oldest first): bounds a run's work when
# a store has been failing for days.
DELETION_FOLLOWUP_MAX = 200
# Failed keys quoted per podcast in events and the report; the count is always complete.
FAILED_KEY_SAMPLE = 20
# HEADs at once when a crashed cleanup's in-flight page is settled (at most one page of keys).
IN_FLIGHT_HEAD_CONCURRENCY = 10


# How long a deletion's feed invalidation is held for its storage cleanup at most: the cleanup
# releases it when it ends; a run that died mid-cleanup leaves it to the next daily run (a day
# later), and should none come, the minute lane delivers it after this.
CLEANUP_HOLD = timedelta(days=2)


def podcast_prefix(podcast_id: str) -> str:
    return f"podcasts/{podcast_id}/"


@dataclass(kw_only=True, slots=True)
class Cleanup:
    podcast_id: str
    slug: str
    objects_deleted: int = 0
    bytes_deleted: int = 0
    objects_left: int | None = None
    storage_done: bool = False
    invalidated_via: str | None = None  # "queue" | "http" | "earlier run" | None (not yet)
    invalidated_at: datetime | None = None
    invalidation_effect_id: int | None = None
    invalidation_state: str | None = None  # while not confirmed: "retrying" | "dead"
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "podcast_id": self.podcast_id,
            "slug": self.slug,
            "objects_deleted": self.objects_deleted,
            "bytes_deleted": self.bytes_deleted,
            "objects_left": self.objects_left,
            "storage_cleaned": self.storage_done,
            "invalidated_via": self.invalidated_via,
            "invalidation_effect_id": self.invalidation_effect_id,
            "errors": self.errors,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class DeletionsReport:
    deleted: list[dict[str, Any]] = field(default_factory=list)
    retried: list[dict[str, Any]] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        cleanups = [*self.deleted, *self.retried]
        return {
            "podcasts_deleted": len(self.deleted),
            "deletion_failed": sum(
                1 for e in self.errors if e["event"] == "podcast_deletion_failed"
            ),
            "objects_deleted": sum(c["objects_deleted"] for c in cleanups),
            "cleanup_leftovers": len(self.leftovers),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "podcasts": self.deleted,
            "retried": self.retried,
            "leftovers": self.leftovers,
            "errors": self.errors,
        }


async def hard_delete_expired_podcasts(runtime: Runtime, clock: Clock) -> DeletionsReport:
    now = clock.now()
    errors: list[Failure] = []
    deleted: list[Cleanup] = []

    for podcast in await runtime.db.fetch(SQL["due_deletions"], {"now": now}):
        async with _exclusive(runtime, str(podcast["id"])) as mine:
            if not mine:
                continue  # another run is deleting it right now
            cleanup = await _delete_one(runtime, clock, podcast, errors)
        if cleanup is not None:
            deleted.append(cleanup)

    # Earlier deletions whose storage or feed is still dirty: retry, and keep reporting them.
    retried: list[Cleanup] = []
    leftovers: list[dict[str, Any]] = []
    earlier = await runtime.db.fetch(
        SQL["unfinished_deletions"],
        {"exclude": [c.podcast_id for c in deleted], "limit": DELETION_FOLLOWUP_MAX},
    )
    for record in earlier:
        cleanup = Cleanup(
            podcast_id=str(record["podcast_id"]),
            slug=record["slug"],
            invalidation_effect_id=record["invalidation_effect_id"],
        )
        async with _exclusive(runtime, cleanup.podcast_id) as mine:
            if not mine:
                continue  # another run is cleaning it up right now: its report says how far
            if record["storage_cleaned_at"] is None:
                await _clean_storage(runtime, cleanup, errors)
            else:
                cleanup.storage_done = True
            await _release_invalidation(runtime, clock, cleanup, errors)  # if still held
            if cleanup.invalidated_via is None and cleanup.invalidation_state is None:
                await _follow_invalidation(runtime, clock, cleanup, record, errors)
            await _record(runtime, now, cleanup, errors)
        retried.append(cleanup)
        if not cleanup.storage_done or cleanup.invalidated_via is None:
            leftovers.append(_leftover(cleanup, record["deleted_at"], record["attempts"] + 1))

    for cleanup in deleted:
        if not cleanup.storage_done or cleanup.invalidated_via is None:
            leftovers.append(_leftover(cleanup, now, 1))

    return DeletionsReport(
        deleted=[c.to_json() for c in deleted],
        retried=[c.to_json() for c in retried],
        leftovers=leftovers,
        errors=errors,
    )


@asynccontextmanager
async def _exclusive(runtime: Runtime, podcast_id: str) -> AsyncIterator[bool]:
    """Whether this run may delete and clean up ``podcast_id`` now: held on a connection of
    its own for the whole cleanup, so it ends with that connection if the process dies."""
    async with runtime.db.session() as conn:
        row = await conn.fetch_one(SQL["try_lock_cleanup"], {"id": podcast_id})
        locked = bool(row and row["locked"])
        try:
            yield locked
        finally:
            if locked:  # a connection that died took the lock with it
                with contextlib.suppress(DatabaseUnavailableError):
                    await conn.execute(SQL["unlock_cleanup"], {"id": podcast_id})


async def _delete_one(
    runtime: Runtime, clock: Clock, podcast: dict[str, Any], errors: list[Failure]
) -> Cleanup | None:
    """Delete one due podcast and clean up after it; None when it failed, was restored, or was
    deleted by another replica since the scan."""
    now = clock.now()
    podcast_id, slug = str(podcast["id"]), podcast["slug"]
    owed: effects.Effect | None = None
    row = None
    with one_item(errors, "podcast_deletion_failed", podcast_id=podcast_id, slug=slug) as item:
        async with runtime.db.transaction() as tx:
            row = await tx.fetch_one(SQL["delete_podcast"], {"id": podcast_id, "now": now})
            if row is not None:
                await tx.execute(
                    SQL["record_deletion"], {"id": podcast_id, "slug": slug, "now": now}
                )
                owed = await _owe_invalidation(tx, podcast_id, slug, now)
    if item.failed:
        return None
    if row is None or owed is None:
        return None  # restored, or deleted by another replica, since the scan
    event(
        "podcast_hard_deleted",
        podcast_id=podcast_id,
        slug=slug,
        deletion_scheduled_at=podcast["deletion_scheduled_at"].isoformat(),
        deletion_redirect_url=podcast["deletion_redirect_url"],
    )
    cleanup = Cleanup(podcast_id=podcast_id, slug=slug, invalidation_effect_id=owed.id)
    await _clean_storage(runtime, cleanup, errors)
    await _release_invalidation(runtime, clock, cleanup, errors)
    await _record(runtime, now, cleanup, errors)
    return cleanup


async def _release_invalidation(
    runtime: Runtime, clock: Clock, cleanup: Cleanup, errors: list[Failure]
) -> None:
    """The cleanup has finished (or failed and been recorded): the held invalidation made due,
    and given its first attempt here."""
    if cleanup.invalidation_effect_id is None:
        return
    now = clock.now()
    released = await effects.release(runtime.db, [cleanup.invalidation_effect_id], now)
    if released:
        [delivery] = await deliver_now(runtime, clock, released)
        _invalidation_outcome(cleanup, delivery, now, errors)


async def _owe_invalidation(
    tx: Tx, podcast_id: str, slug: str, now: datetime, *, held: bool = True
) -> effects.Effect:
    """The feed invalidation a deletion owes, recorded in the deletion's transaction — held
    (``held``) until its storage cleanup is over (``_release_invalidation``)."""
    owed = await effects.record(
        tx,
        kind="queue",
        key=f"{RSS_INVALIDATION}:podcast.deleted:{podcast_id}",
        payload={
            "queue": RSS_INVALIDATION,
            "body": {"type": "podcast.deleted", "podcast_id": podcast_id, "podcast_slug": slug},
            "fallback_invalidate": podcast_id,
        },
        now=now,
        held_until=now + CLEANUP_HOLD if held else None,
    )
    await tx.execute(SQL["link_invalidation_effect"], {"id": podcast_id, "effect_id": owed.id})
    return owed


def _invalidation_outcome(
    cleanup: Cleanup, delivery: Delivery, now: datetime, errors: list[Failure]
) -> None:
    if delivery.status == "delivered":
        cleanup.invalidated_via = str(delivery.detail.get("via", "earlier run"))
        cleanup.invalidated_at = now
        return
    cleanup.invalidation_state = "retrying" if delivery.status == "transient" else "dead"
    message = delivery.error or "feed cache invalidation failed"
    cleanup.errors.append(message)
    failure: Failure = {
        "event": "cache_invalidation_failed",
        "podcast_id": cleanup.podcast_id,
        "slug": cleanup.slug,
        "effect_id": cleanup.invalidation_effect_id,
        "retried": delivery.status == "transient",
        "error": message,
    }
    error(**failure)
    errors.append(failure)


async def _follow_invalidation(
    runtime: Runtime,
    clock: Clock,
    cleanup: Cleanup,
    record: dict[str, Any],
    errors: list[Failure],
) -> None:
    """Where an earlier deletion's invalidation stands. The minute lane delivers it; a deletion
    recorded before effects existed gets its effect now."""
    if record["invalidated_at"] is not None:
        cleanup.invalidated_via = "earlier run"
    elif record["effect_delivered_at"] is not None:
        cleanup.invalidated_via = "deliverEffects"
        cleanup.invalidated_at = record["effect_delivered_at"]
    elif record["invalidation_effect_id"] is None:
        try:
            async with runtime.db.transaction() as tx:
                owed = await _owe_invalidation(
                    tx, cleanup.podcast_id, cleanup.slug, clock.now(), held=False
                )
        except DatabaseUnavailableError:
            raise
        except Exception as exc:
            cleanup.errors.append(describe_error(exc))
            return
        cleanup.invalidation_effect_id = owed.id
        [delivery] = await deliver_now(runtime, clock, [owed])
        _invalidation_outcome(cleanup, delivery, clock.now(), errors)
    elif not record["effect_exists"]:
        # `nightcrew effects drop`: the operator decided nothing more is owed. Settle the
        # record (or it would be reported forever), and say so.
        cleanup.invalidated_via = "given up (effect dropped)"
        cleanup.invalidated_at = clock.now()
    else:
        dead = record["effect_dead_at"] is not None
        cleanup.invalidation_state = "dead" if dead else "retrying"
        cleanup.errors.append(
            f"feed invalidation {'dead' if dead else 'retrying'} "
            f"(effect {record['invalidation_effect_id']}, {record['effect_attempts']} attempts): "
            f"{record['effect_error']}"
        )


async def _clean_storage(runtime: Runtime, cleanup: Cleanup, errors: list[Failure]) -> None:
    prefix = podcast_prefix(cleanup.podcast_id)
    failure: Failure

    async def count(objects: int, size: int) -> None:
        await runtime.db.execute(
            SQL["count_deleted"], {"id": cleanup.podcast_id, "objects": objects, "bytes": size}
        )

    async def mark(page: list[StoredObject]) -> None:
        keys = {o.key: o.size for o in page}
        await runtime.db.execute(
            SQL["mark_in_flight"], {"id": cleanup.podcast_id, "keys": json_param(keys)}
        )

    result: PrefixDeletion | None = None
    with one_item(errors, "r2_cleanup_failed", podcast_id=cleanup.podcast_id, prefix=prefix):
        await _settle_in_flight(runtime, cleanup)
        result = await delete_prefix(runtime.store, prefix, on_batch=count, before_batch=mark)
    if result is None:
        cleanup.errors.append(errors[-1]["error"])
        return
    cleanup.objects_deleted += result.deleted
    cleanup.bytes_deleted += result.bytes_deleted
    cleanup.objects_left = result.left
    if result.failed or result.left:
        sample = dict(list(result.failed.items())[:FAILED_KEY_SAMPLE])
        message = (
            f"{len(result.failed)} of {result.listed} deletes failed, "
            f"{result.left} objects left under {prefix}"
        )
        cleanup.errors.append(message)
        failure = {
            "event": "r2_cleanup_failed",
            "podcast_id": cleanup.podcast_id,
            "prefix": prefix,
            "count": result.deleted,
            "failed": len(result.failed),
            "left": result.left,
            "failed_keys": sample,
            "error": message,
        }
        error(**failure)
        errors.append(failure)
        return
    cleanup.storage_done = True
    event(
        "r2_cleanup_completed",
        podcast_id=cleanup.podcast_id,
        prefix=prefix,
        count=result.deleted,
        bytes=result.bytes_deleted,
    )


async def _settle_in_flight(runtime: Runtime, cleanup: Cleanup) -> None:
    """A page an earlier cleanup was deleting when it died: the keys the store no longer has
    were deleted and never counted. Count them (and clear the page) before deleting anything
    else, or the next page's mark would overwrite them. A key still there is deleted, and
    counted, with the listing that follows."""
    row = await runtime.db.fetch_one(SQL["in_flight"], {"id": cleanup.podcast_id})
    pending: dict[str, int] = (row or {}).get("in_flight") or {}
    if not pending:
        return
    limit = asyncio.Semaphore(IN_FLIGHT_HEAD_CONCURRENCY)

    async def gone(key: str) -> bool:
        async with limit:
            return await runtime.store.head(key) is None

    answers = await asyncio.gather(*(gone(key) for key in pending))
    deleted = [key for key, is_gone in zip(pending, answers, strict=True) if is_gone]
    size = sum(int(pending[key]) for key in deleted)
    await runtime.db.execute(
        SQL["count_deleted"], {"id": cleanup.podcast_id, "objects": len(deleted), "bytes": size}
    )
    cleanup.objects_deleted += len(deleted)
    cleanup.bytes_deleted += size
    event(
        "r2_cleanup_settled",
        podcast_id=cleanup.podcast_id,
        in_flight=len(pending),
        count=len(deleted),
        bytes=size,
    )


async def _record(runtime: Runtime, now: datetime, cleanup: Cleanup, errors: list[Failure]) -> None:
    """Write what this run did to the deletion's record. A failure here is reported and the run
    goes on: the record still says what is left, and the next run retries it."""
    # A lost database stops the run (one_item re-raises it); the next run finds the podcast and
    # writes the record.
    with one_item(
        errors,
        "podcast_deletion_record_failed",
        podcast_id=cleanup.podcast_id,
        slug=cleanup.slug,
    ):
        await runtime.db.execute(
            SQL["record_cleanup"],
            {
                "id": cleanup.podcast_id,
                "now": now,
                "storage_done": cleanup.storage_done,
                "objects_left": cleanup.objects_left,
                "invalidated_at": cleanup.invalidated_at,
                "last_error": "; ".join(cleanup.errors) or None,
            },
        )


def _leftover(cleanup: Cleanup, deleted_at: datetime, attempts: int) -> dict[str, Any]:
    return {
        "podcast_id": cleanup.podcast_id,
        "slug": cleanup.slug,
        "deleted_at": deleted_at.isoformat(),
        "prefix": podcast_prefix(cleanup.podcast_id),
        "objects_left": cleanup.objects_left,
        "storage_cleaned": cleanup.storage_done,
        "invalidation_pending": cleanup.invalidated_via is None,
        "invalidation_state": cleanup.invalidation_state,
        "invalidation_effect_id": cleanup.invalidation_effect_id,
        "attempts": attempts,
        "errors": cleanup.errors,
    }
