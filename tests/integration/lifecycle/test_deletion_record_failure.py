"""A deletion whose cleanup record cannot be written never stops the run: the next podcast is
still deleted and cleaned, and the failure is reported as ``podcast_deletion_record_failed``."""

from __future__ import annotations

from datetime import timedelta

from structlog.testing import capture_logs

from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.adapters.storage import ObjectStore
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_deletions import _doomed_podcast, _keys


async def _record(db: Database, podcast: str) -> dict[str, object] | None:
    return await db.fetch_one(
        "SELECT storage_cleaned_at, invalidated_at, objects_deleted, attempts, last_error"
        " FROM nightcrew.podcast_deletions WHERE podcast_id = %(p)s",
        {"p": podcast},
    )


async def test_a_failing_cleanup_record_never_stops_the_next_podcast(
    db: Database, clock: FrozenClock, fresh_db_url: str, store: ObjectStore
) -> None:
    first = await _doomed_podcast(db, store, objects=3, due=NOW - timedelta(days=2))
    second = await _doomed_podcast(db, store, objects=2, due=NOW - timedelta(days=1))
    # PostgreSQL refuses the cleanup record of `first` (the UPDATE that counts an attempt);
    # its deletion record and effect link, in the deletion's own transaction, go through.
    await db.execute(
        "CREATE FUNCTION nightcrew.refuse_record() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.podcast_id = '" + first + "'::uuid"
        " AND NEW.attempts IS DISTINCT FROM OLD.attempts THEN"
        " RAISE EXCEPTION 'podcast_deletions is read-only today'; END IF;"
        " RETURN NEW; END $$"
    )
    await db.execute(
        "CREATE TRIGGER refuse_record BEFORE UPDATE ON nightcrew.podcast_deletions"
        " FOR EACH ROW EXECUTE FUNCTION nightcrew.refuse_record()"
    )
    runtime = await make_runtime(db, clock, fresh_db_url, store=store)

    with capture_logs() as logs:
        report = await hard_delete_expired_podcasts(runtime, clock)

    # both are gone, rows and files alike
    assert [d.podcast_id for d in report.deleted] == [first, second]
    assert await db.fetch("SELECT id FROM public.podcasts") == []
    assert await _keys(store, f"podcasts/{first}/") == []
    assert await _keys(store, f"podcasts/{second}/") == []
    assert report.counts()["podcasts_deleted"] == 2
    assert report.counts()["deletion_failed"] == 0
    # the second's record is written in full
    after = await _record(db, second)
    assert after is not None
    assert after["storage_cleaned_at"] == NOW and after["invalidated_at"] == NOW
    assert after["objects_deleted"] == 2 and after["attempts"] == 1
    # the first's failure is reported, and logged, under its own event
    [failure] = report.errors
    assert failure["event"] == "podcast_deletion_record_failed"
    assert failure["podcast_id"] == first
    assert "read-only today" in failure["error"]
    assert [e["podcast_id"] for e in logs if e["event"] == "podcast_deletion_record_failed"] == [
        first
    ]
    stale = await _record(db, first)
    assert stale is not None and stale["attempts"] == 0 and stale["storage_cleaned_at"] is None
    # both feeds were invalidated regardless
    sent = await f.queue_messages(db, RSS_INVALIDATION)
    assert sorted(m["body"]["podcast_id"] for m in sent) == sorted([first, second])

    # the next run, with the record writable again, settles the first
    await db.execute("DROP TRIGGER refuse_record ON nightcrew.podcast_deletions")
    clock.advance(timedelta(days=1))
    again = await hard_delete_expired_podcasts(runtime, clock)
    assert again.errors == [] and again.leftovers == []
    assert [r.podcast_id for r in again.retried] == [first]
    settled = await _record(db, first)
    assert settled is not None
    assert settled["storage_cleaned_at"] == clock.now() and settled["attempts"] == 1
