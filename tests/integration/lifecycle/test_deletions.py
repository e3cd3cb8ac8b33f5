"""Hard deletion against real PostgreSQL and two real stores: local files and S3 (moto)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.queues import RSS_INVALIDATION, MemoryQueueProducer
from nightcrew.adapters.storage import DeleteOutcome, ObjectStore, StoredObject, open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects.deliver import deliver_effects
from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.support.servers import (
    RecordingServer,
)


async def _keys(store: ObjectStore, prefix: str = "") -> list[str]:
    return sorted([o.key async for page in store.list_prefix(prefix) for o in page])


async def _doomed_podcast(
    db: Database, store: ObjectStore, *, objects: int = 5, due: Any = None
) -> str:
    podcast = await f.podcast(
        db, status="pending_deletion", deletion_scheduled_at=due or NOW - timedelta(days=1)
    )
    episode = await f.episode(db, podcast)
    await db.execute(
        "INSERT INTO public.automation_jobs (episode_id, trigger_type) VALUES (%(e)s, 'time')",
        {"e": episode},
    )
    imp = await f.podcast_import(db, podcast, status="completed")
    await f.import_item(db, imp, status="completed", updated_at=NOW)
    for n in range(objects):
        await store.put(f"podcasts/{podcast}/e/{episode}/audio-{n}.mp3", b"\x00" * 100)
    return podcast


async def _runtime(
    db: Database, clock: FrozenClock, url: str, store: ObjectStore, **kw: Any
) -> Runtime:
    return await make_runtime(db, clock, url, store=store, **kw)


async def test_deletes_the_row_its_children_its_objects_and_invalidates(
    db: Database, clock: FrozenClock, fresh_db_url: str, store: ObjectStore
) -> None:
    doomed = await _doomed_podcast(db, store, objects=5)
    kept = await _doomed_podcast(db, store, objects=2, due=NOW + timedelta(days=1))
    slug = (
        await db.fetch_one("SELECT slug FROM public.podcasts WHERE id = %(p)s", {"p": doomed}) or {}
    )["slug"]
    with capture_logs() as logs:
        report = await hard_delete_expired_podcasts(
            await _runtime(db, clock, fresh_db_url, store), clock
        )

    assert report.counts() == {
        "podcasts_deleted": 1,
        "deletion_failed": 0,
        "objects_deleted": 5,
        "cleanup_leftovers": 0,
    }
    remaining = await db.fetch("SELECT id::text FROM public.podcasts")
    assert [r["id"] for r in remaining] == [kept]
    for table in ("episodes", "automation_jobs", "podcast_imports", "import_items"):
        row = await db.fetch_one(f"SELECT count(*) AS n FROM public.{table}")
        assert row == {"n": 1}, table  # only the kept podcast's
    assert await _keys(store, f"podcasts/{doomed}/") == []
    assert len(await _keys(store, f"podcasts/{kept}/")) == 2

    [message] = await f.queue_messages(db, RSS_INVALIDATION)
    assert isinstance(message["body"].pop("effect_id"), int)  # consumers de-duplicate by it
    assert message["body"] == {
        "type": "podcast.deleted",
        "podcast_id": doomed,
        "podcast_slug": slug,
    }
    names = [e["event"] for e in logs]
    assert names == ["podcast_hard_deleted", "r2_cleanup_completed"]
    assert logs[1]["count"] == 5 and logs[1]["bytes"] == 500
    record = await db.fetch_one("SELECT * FROM nightcrew.podcast_deletions")
    assert record is not None and record["storage_cleaned_at"] == NOW
    assert record["invalidated_at"] == NOW and record["objects_deleted"] == 5


@pytest.mark.parametrize(("offset", "expected"), [(-1, True), (0, True), (+1, False)])
async def test_due_boundary(
    db: Database, runtime: Runtime, clock: FrozenClock, offset: int, expected: bool
) -> None:
    podcast = await _doomed_podcast(
        db, runtime.store, objects=1, due=NOW + timedelta(seconds=offset)
    )
    report = await hard_delete_expired_podcasts(runtime, clock)
    assert report.counts()["podcasts_deleted"] == (1 if expected else 0)
    left = await db.fetch_one(
        "SELECT count(*) AS n FROM public.podcasts WHERE id = %(p)s", {"p": podcast}
    )
    assert left == {"n": 0 if expected else 1}


@pytest.mark.slow
async def test_a_podcast_with_2500_objects_is_fully_removed(
    db: Database, clock: FrozenClock, fresh_db_url: str, store: ObjectStore
) -> None:
    podcast = await _doomed_podcast(db, store, objects=0)
    import asyncio

    sem = asyncio.Semaphore(32)

    async def put(n: int) -> None:
        async with sem:
            await store.put(f"podcasts/{podcast}/e/ep{n % 50}/{n}.mp3", b"x")

    await asyncio.gather(*(put(n) for n in range(2500)))
    await store.put(f"podcasts/{podcast}/images/cover.jpg", b"img")
    store.stats.delete_requests = store.stats.list_pages = 0
    report = await hard_delete_expired_podcasts(
        await _runtime(db, clock, fresh_db_url, store), clock
    )
    assert report.counts()["objects_deleted"] == 2501
    # 2,501 objects: 3 delete batches of <= 1000 keys, 3 listing pages, 1 verification list
    assert store.stats.delete_requests == 3
    assert store.stats.list_pages == 4
    assert await _keys(store, f"podcasts/{podcast}/") == []


class HalfFailingStore:
    """The real store, except that deleting every other key fails (a sick backend)."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.description = inner.description
        self.stats = inner.stats

    def list_prefix(self, prefix: str) -> AsyncIterator[list[StoredObject]]:
        return self._inner.list_prefix(prefix)

    async def head(self, key: str) -> StoredObject | None:
        return await self._inner.head(key)

    async def put(self, key: str, data: bytes) -> None:
        await self._inner.put(key, data)

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
        healthy = [k for i, k in enumerate(sorted(keys)) if i % 2 == 0]
        outcome = await self._inner.delete(healthy)
        for key in sorted(keys):
            if key not in healthy:
                outcome.failed[key] = "StoreError: 503 SlowDown"
        return outcome


async def test_a_store_failing_half_its_deletes_never_blocks_the_row_and_is_reported_until_done(
    db: Database, clock: FrozenClock, fresh_db_url: str, store: ObjectStore
) -> None:
    podcast = await _doomed_podcast(db, store, objects=10)
    sick = HalfFailingStore(store)
    with capture_logs() as logs:
        first = await hard_delete_expired_podcasts(
            await _runtime(db, clock, fresh_db_url, sick), clock
        )
    assert first.counts()["podcasts_deleted"] == 1
    assert await db.fetch_one("SELECT count(*) AS n FROM public.podcasts") == {"n": 0}
    [failed] = [e for e in logs if e["event"] == "r2_cleanup_failed"]
    assert failed["failed"] == 5 and failed["left"] == 5 and len(failed["failed_keys"]) == 5
    assert [lo.podcast_id for lo in first.leftovers] == [podcast]
    assert first.leftovers[0].objects_left == 5
    assert first.errors[0]["event"] == "r2_cleanup_failed"
    # the cleanup ended, failed in part: the feed's invalidation is released and sent all the
    # same (spec 000: R2 failures are logged and never hold back the rest)
    assert first.deleted[0].invalidated_via == "queue"
    [message] = await f.queue_messages(db, RSS_INVALIDATION)
    assert message["body"]["podcast_id"] == podcast

    # next day, still sick: the leftover is retried and still reported
    clock.advance(timedelta(days=1))
    second = await hard_delete_expired_podcasts(
        await _runtime(db, clock, fresh_db_url, sick), clock
    )
    assert second.counts()["podcasts_deleted"] == 0
    assert [lo.podcast_id for lo in second.leftovers] == [podcast]
    assert second.leftovers[0].attempts == 2 and second.leftovers[0].objects_left < 5

    # the store heals: the leftover is cleaned and disappears from the report
    clock.advance(timedelta(days=1))
    third = await hard_delete_expired_podcasts(
        await _runtime(db, clock, fresh_db_url, store), clock
    )
    assert third.leftovers == [] and third.retried[0].storage_cleaned is True
    assert await _keys(store, f"podcasts/{podcast}/") == []
    fourth = await hard_delete_expired_podcasts(
        await _runtime(db, clock, fresh_db_url, store), clock
    )
    assert fourth.retried == [] and fourth.leftovers == []


async def test_queue_send_failing_falls_back_to_http_with_the_secret(
    db: Database, clock: FrozenClock, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    store = open_store("memory://")
    podcast = await _doomed_podcast(db, store, objects=1)
    feed = feed_server
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db,
            clock,
            fresh_db_url,
            store,
            queues=MemoryQueueProducer(clock, failing_queues=frozenset({RSS_INVALIDATION})),
            feedcache=HttpFeedCache(http, feed.url, "feed-secret-xyz"),
        )
        report = await hard_delete_expired_podcasts(runtime, clock)
    assert report.deleted[0].invalidated_via == "http"
    [call] = feed.requests
    assert (call.method, call.path) == ("POST", "/_internal/invalidate")
    assert call.headers["Authorization"] == "Bearer feed-secret-xyz"
    assert call.json() == {"id": podcast}
    assert "wait" not in call.query


async def test_queue_and_http_both_failing_is_cache_invalidation_failed_and_retried(
    db: Database, clock: FrozenClock, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    store = open_store("memory://")
    podcast = await _doomed_podcast(db, store, objects=1)
    down = MemoryQueueProducer(clock, failing_queues=frozenset({RSS_INVALIDATION}))
    feed = feed_server
    feed.status = 503
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db,
            clock,
            fresh_db_url,
            store,
            queues=down,
            feedcache=HttpFeedCache(http, feed.url, "s"),
        )
        with capture_logs() as logs:
            first = await hard_delete_expired_podcasts(runtime, clock)
        assert [e for e in logs if e["event"] == "cache_invalidation_failed"]
        assert first.leftovers[0].invalidation_pending is True
        assert first.leftovers[0].storage_cleaned is True
        assert first.leftovers[0].invalidation_state == "retrying"
        feed.status = 204
        # the minute lane delivers it, within minutes rather than at the next daily run
        clock.advance(timedelta(minutes=1))
        drained = await deliver_effects(runtime, clock)
        assert drained.delivered == 1
        second = await hard_delete_expired_podcasts(runtime, clock)
    assert second.retried[0].invalidated_via == "deliverEffects" and second.leftovers == []
    assert [c.json() for c in feed.requests] == [{"id": podcast}, {"id": podcast}]


async def test_one_podcast_whose_deletion_throws_does_not_stop_the_next(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    stuck = await _doomed_podcast(db, runtime.store, objects=1, due=NOW - timedelta(days=2))
    fine = await _doomed_podcast(db, runtime.store, objects=1, due=NOW - timedelta(days=1))
    # Something outside the reference schema still points at `stuck` with NO ACTION.
    await db.execute("CREATE TABLE public.invoices (podcast_id uuid REFERENCES public.podcasts)")
    await db.execute("INSERT INTO public.invoices VALUES (%(p)s)", {"p": stuck})
    with capture_logs() as logs:
        report = await hard_delete_expired_podcasts(runtime, clock)
    assert [d.podcast_id for d in report.deleted] == [fine]
    [failed] = [e for e in logs if e["event"] == "podcast_deletion_failed"]
    assert failed["podcast_id"] == stuck and "foreign key" in failed["error"]
    assert report.counts()["deletion_failed"] == 1
    left = await db.fetch("SELECT id::text FROM public.podcasts")
    assert [r["id"] for r in left] == [stuck]
    assert len(await _keys(runtime.store, f"podcasts/{stuck}/")) == 1  # its files untouched


LOCK = "SELECT pg_advisory_lock(hashtextextended('nightcrew.podcast_deletion:' || %s, 0))"


async def test_a_podcast_another_run_is_cleaning_is_left_to_that_run(
    db: Database, clock: FrozenClock, fresh_db_url: str, store: ObjectStore
) -> None:
    """Two daily runs at once (a manual run beside the scheduled one) never work on one podcast
    together: the second would settle and count the first's page in flight a second time."""
    doomed = await _doomed_podcast(db, store, objects=10)
    other_run = await psycopg.AsyncConnection.connect(fresh_db_url, autocommit=True)
    try:
        await other_run.execute(LOCK, (doomed,))
        skipped = await hard_delete_expired_podcasts(
            await _runtime(db, clock, fresh_db_url, store), clock
        )
        assert skipped.deleted == [] and skipped.errors == []
        assert await db.fetch_one("SELECT count(*) AS n FROM public.podcasts") == {"n": 1}

        await other_run.execute("SELECT pg_advisory_unlock_all()")
        sick = HalfFailingStore(store)
        first = await hard_delete_expired_podcasts(
            await _runtime(db, clock, fresh_db_url, sick), clock
        )
        assert [lo.podcast_id for lo in first.leftovers] == [doomed]
        counted = await db.fetch_one("SELECT objects_deleted FROM nightcrew.podcast_deletions")

        # its leftover, while another run holds it: not retried, nothing counted
        await other_run.execute(LOCK, (doomed,))
        clock.advance(timedelta(days=1))
        busy = await hard_delete_expired_podcasts(
            await _runtime(db, clock, fresh_db_url, store), clock
        )
        assert busy.retried == [] and busy.leftovers == []
        assert (
            await db.fetch_one("SELECT objects_deleted FROM nightcrew.podcast_deletions") == counted
        )
        assert len(await _keys(store, f"podcasts/{doomed}/")) == 5
    finally:
        await other_run.close()  # a holder that goes away takes its lock with it

    done = await hard_delete_expired_podcasts(await _runtime(db, clock, fresh_db_url, store), clock)
    assert done.retried[0].storage_cleaned is True and done.leftovers == []
    assert await _keys(store, f"podcasts/{doomed}/") == []
    assert await db.fetch_one("SELECT objects_deleted FROM nightcrew.podcast_deletions") == {
        "objects_deleted": 10
    }


class BlockingStore(HalfFailingStore):
    """The real store, whose deletes wait for ``go`` (a long cleanup, caught in the middle)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        import asyncio

        self.deleting = asyncio.Event()
        self.go = asyncio.Event()

    async def delete(self, keys: Sequence[str]) -> DeleteOutcome:
        self.deleting.set()
        await self.go.wait()
        return await self._inner.delete(keys)


@pytest.mark.parametrize("crash", [False, True])
async def test_the_feed_is_invalidated_only_after_the_storage_cleanup(
    db: Database, clock: FrozenClock, fresh_db_url: str, crash: bool
) -> None:
    """Spec 000's order: DELETE → R2 cleanup → RSS invalidation. The minute lane's drain runs
    while the cleanup is in the middle: the invalidation is not due yet. It goes once the
    cleanup ends — or, for a run that died mid-cleanup, once the next daily run finishes it."""
    import asyncio

    store = open_store("memory://")
    podcast = await _doomed_podcast(db, store, objects=3)
    blocking = BlockingStore(store)
    runtime = await _runtime(db, clock, fresh_db_url, blocking)  # type: ignore[arg-type]
    run = asyncio.create_task(hard_delete_expired_podcasts(runtime, clock))
    await asyncio.wait_for(blocking.deleting.wait(), 10)
    gone = await db.fetch_one("SELECT 1 FROM public.podcasts WHERE id = %(id)s", {"id": podcast})
    assert gone is None  # the row is deleted, the cleanup under way
    drained = await deliver_effects(runtime, clock)  # the minute lane, meanwhile
    assert drained.delivered == 0 and await f.queue_messages(db, RSS_INVALIDATION) == []
    if crash:
        run.cancel()  # the daily run dies mid-cleanup
        with pytest.raises(asyncio.CancelledError):
            await run
        clock.advance(timedelta(minutes=5))
        assert (await deliver_effects(runtime, clock)).delivered == 0  # still held
        clock.advance(timedelta(days=1))  # the next daily run finishes the cleanup
        blocking.go.set()
        report = await hard_delete_expired_podcasts(runtime, clock)
        assert report.retried[0].storage_cleaned is True
    else:
        blocking.go.set()
        report = await run
        assert report.deleted[0].invalidated_via == "queue"
    assert await _keys(store, f"podcasts/{podcast}/") == []
    [message] = await f.queue_messages(db, RSS_INVALIDATION)
    assert message["body"]["podcast_id"] == podcast
