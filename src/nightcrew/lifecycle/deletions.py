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
from uuid import UUID

from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.adapters.storage import PrefixDeletion, StoredObject, delete_prefix
from nightcrew.clock import Clock
from nightcrew.db.database import Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import Delivery, deliver_now
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.jsonable import Jsonable, JsonObject, named, omitted
from nightcrew.lifecycle import feed_outbox
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


@dataclass(frozen=True, kw_only=True, slots=True)
class _DueDeletion:
    """A row of due_deletions."""

    id: UUID
    slug: str
    deletion_scheduled_at: datetime
    deletion_redirect_url: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Unfinished:
    """A row of unfinished_deletions: an earlier deletion, and its invalidation effect's state."""

    podcast_id: UUID
    slug: str
    deleted_at: datetime
    storage_cleaned_at: datetime | None
    invalidated_at: datetime | None
    attempts: int
    invalidation_effect_id: int | None
    effect_exists: bool
    effect_delivered_at: datetime | None
    effect_dead_at: datetime | None
    effect_attempts: int | None
    effect_error: str | None


@dataclass(kw_only=True, slots=True)
class Cleanup(Jsonable):
    """One deleted podcast's cleanup, as this run took it; the report's entry for it (spec
    000's snake_case member names)."""

    podcast_id: str = named("podcast_id")
    slug: str
    objects_deleted: int = named("objects_deleted", default=0)
    bytes_deleted: int = named("bytes_deleted", default=0)
    objects_left: int | None = named("objects_left", default=None)
    storage_cleaned: bool = named("storage_cleaned", default=False)
    # "queue" | "http" | "earlier run" | … | None (not yet)
    invalidated_via: str | None = named("invalidated_via", default=None)
    invalidated_at: datetime | None = omitted(default=None)
    invalidation_effect_id: int | None = named("invalidation_effect_id", default=None)
    invalidation_state: str | None = omitted(default=None)  # not confirmed: "retrying" | "dead"
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class Leftover(Jsonable):
    """A deletion with storage or a feed invalidation still owed after this run."""

    podcast_id: str = named("podcast_id")
    slug: str
    deleted_at: str = named("deleted_at")  # ISO 8601, as the stored report carries it
    prefix: str
    objects_left: int | None = named("objects_left")
    storage_cleaned: bool = named("storage_cleaned")
    invalidation_pending: bool = named("invalidation_pending")
    invalidation_state: str | None = named("invalidation_state")
    invalidation_effect_id: int | None = named("invalidation_effect_id")
    attempts: int
    errors: list[str]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeletionsReport:
    deleted: list[Cleanup] = field(default_factory=list)
    retried: list[Cleanup] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        cleanups = [*self.deleted, *self.retried]
        return {
            "podcasts_deleted": len(self.deleted),
            "deletion_failed": sum(
                1 for e in self.errors if e["event"] == "podcast_deletion_failed"
            ),
            "objects_deleted": sum(c.objects_deleted for c in cleanups),
            "cleanup_leftovers": len(self.leftovers),
        }

    def to_json(self) -> JsonObject:
        return {
            **self.counts(),
            "podcasts": [c.to_json() for c in self.deleted],
            "retried": [c.to_json() for c in self.retried],
            "leftovers": [left.to_json() for left in self.leftovers],
            "errors": self.errors,
        }


async def hard_delete_expired_podcasts(runtime: Runtime, clock: Clock) -> DeletionsReport:
    now = clock.now()
    errors: list[Failure] = []
    deleted: list[Cleanup] = []

    for podcast in await runtime.db.fetch_as(_DueDeletion, SQL["due_deletions"], {"now": now}):
        async with _exclusive(runtime, str(podcast.id)) as mine:
            if not mine:
                continue  # another run is deleting it right now
            cleanup = await _delete_one(runtime, clock, podcast, errors)
        if cleanup is not None:
            deleted.append(cleanup)

    # Earlier deletions whose storage or feed is still dirty: retry, and keep reporting them.
    retried: list[Cleanup] = []
    leftovers: list[Leftover] = []
    earlier = await runtime.db.fetch_as(
        _Unfinished,
        SQL["unfinished_deletions"],
        {"exclude": [c.podcast_id for c in deleted], "limit": DELETION_FOLLOWUP_MAX},
    )
    for record in earlier:
        cleanup = Cleanup(
            podcast_id=str(record.podcast_id),
            slug=record.slug,
            invalidation_effect_id=record.invalidation_effect_id,
        )
        async with _exclusive(runtime, cleanup.podcast_id) as mine:
            if not mine:
                continue  # another run is cleaning it up right now: its report says how far
            if record.storage_cleaned_at is None:
                await _clean_storage(runtime, cleanup, errors)
            else:
                cleanup.storage_cleaned = True
            await _release_invalidation(runtime, clock, cleanup, errors)  # if still held
            if cleanup.invalidated_via is None and cleanup.invalidation_state is None:
                await _follow_invalidation(runtime, clock, cleanup, record, errors)
            await _record(runtime, now, cleanup, errors)
        retried.append(cleanup)
        if not cleanup.storage_cleaned or cleanup.invalidated_via is None:
            leftovers.append(_leftover(cleanup, record.deleted_at, record.attempts + 1))

    for cleanup in deleted:
        if not cleanup.storage_cleaned or cleanup.invalidated_via is None:
            leftovers.append(_leftover(cleanup, now, 1))

    return DeletionsReport(deleted=deleted, retried=retried, leftovers=leftovers, errors=errors)


@asynccontextmanager
async def _exclusive(runtime: Runtime, podcast_id: str) -> AsyncIterator[bool]:
    """Whether this run may delete and clean up ``podcast_id`` now: held on a connection of
    its own for the whole cleanup, so it ends with that connection if the process dies."""
    async with runtime.db.session() as conn:
        locked = bool(await conn.fetch_value(bool, SQL["try_lock_cleanup"], {"id": podcast_id}))
        try:
            yield locked
        finally:
            if locked:  # a connection that died took the lock with it
                with contextlib.suppress(DatabaseUnavailableError):
                    await conn.execute(SQL["unlock_cleanup"], {"id": podcast_id})


async def _delete_one(
    runtime: Runtime, clock: Clock, podcast: _DueDeletion, errors: list[Failure]
) -> Cleanup | None:
    """Delete one due podcast and clean up after it; None when it failed, was restored, or was
    deleted by another replica since the scan."""
    now = clock.now()
    podcast_id, slug = str(podcast.id), podcast.slug
    owed: effects.Effect | None = None
    gone = None
    with one_item(errors, "podcast_deletion_failed", podcast_id=podcast_id, slug=slug) as item:
        async with runtime.db.transaction() as tx:
            gone = await tx.fetch_one(SQL["delete_podcast"], {"id": podcast_id, "now": now})
            if gone is not None:
                await tx.execute(
                    SQL["record_deletion"], {"id": podcast_id, "slug": slug, "now": now}
                )
                owed = await _owe_invalidation(tx, podcast_id, slug, now)
    if item.failed:
        return None
    if gone is None or owed is None:
        return None  # restored, or deleted by another replica, since the scan
    event(
        "podcast_hard_deleted",
        podcast_id=podcast_id,
        slug=slug,
        deletion_scheduled_at=podcast.deletion_scheduled_at.isoformat(),
        deletion_redirect_url=podcast.deletion_redirect_url,
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
    message = feed_outbox.PodcastInvalidation(
        type="podcast.deleted", podcast_id=podcast_id, podcast_slug=slug
    )
    owed = await effects.record(
        tx,
        key=f"{RSS_INVALIDATION}:podcast.deleted:{podcast_id}",
        payload=effects.QueuePayload(
            queue=RSS_INVALIDATION, body=message.to_json(), fallback_invalidate=podcast_id
        ),
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
    record: _Unfinished,
    errors: list[Failure],
) -> None:
    """Where an earlier deletion's invalidation stands. The minute lane delivers it; a deletion
    recorded before effects existed gets its effect now."""
    if record.invalidated_at is not None:
        cleanup.invalidated_via = "earlier run"
    elif record.effect_delivered_at is not None:
        cleanup.invalidated_via = "deliverEffects"
        cleanup.invalidated_at = record.effect_delivered_at
    elif record.invalidation_effect_id is None:
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
    elif not record.effect_exists:
        # `nightcrew effects drop`: the operator decided nothing more is owed. Settle the
        # record (or it would be reported forever), and say so.
        cleanup.invalidated_via = "given up (effect dropped)"
        cleanup.invalidated_at = clock.now()
    else:
        dead = record.effect_dead_at is not None
        cleanup.invalidation_state = "dead" if dead else "retrying"
        cleanup.errors.append(
            f"feed invalidation {'dead' if dead else 'retrying'} "
            f"(effect {record.invalidation_effect_id}, {record.effect_attempts} attempts): "
            f"{record.effect_error}"
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
    cleanup.storage_cleaned = True
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
    pending = await runtime.db.fetch_value(dict, SQL["in_flight"], {"id": cleanup.podcast_id}) or {}
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
                "storage_done": cleanup.storage_cleaned,
                "objects_left": cleanup.objects_left,
                "invalidated_at": cleanup.invalidated_at,
                "last_error": "; ".join(cleanup.errors) or None,
            },
        )


def _leftover(cleanup: Cleanup, deleted_at: datetime, attempts: int) -> Leftover:
    return Leftover(
        podcast_id=cleanup.podcast_id,
        slug=cleanup.slug,
        deleted_at=deleted_at.isoformat(),
        prefix=podcast_prefix(cleanup.podcast_id),
        objects_left=cleanup.objects_left,
        storage_cleaned=cleanup.storage_cleaned,
        invalidation_pending=cleanup.invalidated_via is None,
        invalidation_state=cleanup.invalidation_state,
        invalidation_effect_id=cleanup.invalidation_effect_id,
        attempts=attempts,
        errors=cleanup.errors,
    )
