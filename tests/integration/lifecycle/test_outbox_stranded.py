"""No stranded feed invalidation: an intent whose effect died is attempted again.

Spec 000, the reconciler's invalidation-outbox drain: it "runs on every apply run ... marking
delivered_at only on a confirmed 2xx / else bumping attempts + last_error and leaving the row
pending". A `feed_invalidate` effect that died — a 401 while the feed worker's secret is being
rotated, or its 7-day maximum age — is therefore not where the intent ends: the next apply run
revives it. The minute lane keeps its backoff and leaves the dead alone (no hot loop).
Real PostgreSQL; the feed worker is the loopback stand-in, told to fail.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox as effects_outbox
from nightcrew.effects.deliver import deliver_effects
from nightcrew.lifecycle.reconcile import feed_drain
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.integration.lifecycle.test_reconcile import APPLY, later, rt
from tests.support.servers import RecordingServer

MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)
SECRET = "feed-secret"


async def _runtime(
    db: Database,
    clock: FrozenClock,
    url: str,
    http: httpx.AsyncClient,
    feed: RecordingServer,
    store: ObjectStore,
) -> Runtime:
    """The reconciler's runtime (R2_PUBLIC_URL set) with the real feed-worker client."""
    return await rt(db, clock, url, store, feedcache=HttpFeedCache(http, feed.url, SECRET))


async def _intent(db: Database, podcast: str, reason: str = "quarantine_missing") -> str:
    row = await db.fetch_one(
        "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason)"
        " VALUES (%(p)s, %(r)s) RETURNING id::text",
        {"p": podcast, "r": reason},
    )
    assert row is not None
    return str(row["id"])


async def _row(db: Database, outbox_id: str) -> dict[str, Any]:
    row = await db.fetch_one(
        "SELECT delivered_at, attempts, last_error FROM public.feed_invalidation_outbox"
        " WHERE id = %(id)s",
        {"id": outbox_id},
    )
    assert row is not None
    return row


async def _effect(db: Database, outbox_id: str) -> dict[str, Any]:
    rows = await db.fetch(
        "SELECT * FROM nightcrew.effects WHERE kind = 'feed_invalidate'"
        " AND payload ->> 'outbox_id' = %(id)s",
        {"id": outbox_id},
    )
    [effect] = rows  # one effect per intent, revived in place
    return effect


async def test_a_401_kills_the_effect_and_the_next_apply_run_delivers_the_intent(
    db: Database, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    podcast = await f.podcast(db)
    outbox_id = await _intent(db, podcast)
    store = open_store("memory://")
    orphan = f"podcasts/{podcast}/e/e9/old-upload.mp3"  # what the pending intent protects
    await store.put(orphan, b"\x00" * 100)
    clock = later(days=2)
    feed_server.status = 401  # the secret is being rotated
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(db, clock, fresh_db_url, http, feed_server, store)

        first = await run_reconcile(runtime, clock, APPLY)

        assert first.outbox is not None
        assert (first.outbox.pending, first.outbox.failed, first.outbox.dead) == (1, 1, 1)
        outbox_errors = [
            e for e in first.errors if e["event"] == "reconcile_outbox_delivery_failed"
        ]
        assert len(outbox_errors) >= 1 and "401" in outbox_errors[0]["error"]
        assert first.summary().errors >= 1
        report = first.to_json()
        assert report["outbox"]["pending"] >= 1 and report["summary"]["errors"] >= 1
        assert report["orphans"]["protectedPendingInvalidation"] == 1  # kept while owed
        assert await store.head(orphan) is not None
        effect = await _effect(db, outbox_id)
        assert effect["dead_reason"] == "permanent"  # dead at once: a 4xx
        row = await _row(db, outbox_id)
        assert row["delivered_at"] is None and row["attempts"] == 1
        assert "401" in row["last_error"]
        [call] = feed_server.requests
        assert call.headers["Authorization"] == f"Bearer {SECRET}"
        assert call.query == {"wait": "1"} and call.json() == {"id": podcast}

        # the minute lane keeps its backoff: a dead effect is not re-driven every minute
        for _ in range(5):
            clock.advance(MINUTE)
            drained = await deliver_effects(runtime, clock)
            assert drained.delivered == drained.retried == drained.dead == 0
        assert len(feed_server.requests) == 1

        feed_server.status = 200  # the new secret is live
        clock.advance(DAY)
        with capture_logs() as logs:
            second = await run_reconcile(runtime, clock, APPLY)

    assert second.outbox is not None
    assert second.outbox.delivered == 1 and second.outbox.revived == 1
    assert second.outbox.pending == 0 and second.outbox.failed == 0
    assert second.errors == [] and second.to_json()["outbox"]["pending"] == 0
    revived = [e for e in logs if e["event"] == "reconcile_outbox_revived"]
    assert len(revived) == 1 and revived[0]["outbox_ids"] == [outbox_id]
    row = await _row(db, outbox_id)
    assert row == {"delivered_at": clock.now(), "attempts": 2, "last_error": None}
    effect = await _effect(db, outbox_id)
    assert effect["delivered_at"] == clock.now() and effect["dead_at"] is None
    # the death it came back from stays on the record
    assert effect["payload"]["revived"] == 1
    death = effect["payload"]["last_death"]
    assert death["dead_reason"] == "permanent" and "401" in death["error"]
    assert len(feed_server.requests) == 2
    # the intent delivered, the orphan it protected is swept the same run (drain goes first)
    assert second.orphans.deleted == 1 and await store.head(orphan) is None

    # a delivered intent is never invalidated again, by either lane
    clock.advance(DAY)
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(db, clock, fresh_db_url, http, feed_server, store)
        third = await run_reconcile(runtime, clock, APPLY)
        await deliver_effects(runtime, clock)
    assert third.outbox is not None
    assert (third.outbox.pending, third.outbox.delivered, third.outbox.revived) == (0, 0, 0)
    assert len(feed_server.requests) == 2


async def test_an_intent_whose_effect_died_of_max_age_is_attempted_again(
    db: Database, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    podcast = await f.podcast(db)
    outbox_id = await _intent(db, podcast, "size_backfill")
    clock = later(minutes=1)
    feed_server.status = 503  # down for over a week
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db, clock, fresh_db_url, http, feed_server, open_store("memory://")
        )
        drained = await deliver_effects(runtime, clock)  # adopted, attempted, retried later
        assert drained.adopted == 1 and drained.retried == 1
        clock.advance(effects_outbox.IDEMPOTENT_EFFECT_MAX_AGE + MINUTE)
        drained = await deliver_effects(runtime, clock)
        assert drained.dead == 1
        effect = await _effect(db, outbox_id)
        assert effect["dead_reason"] == "expired" and effect["delivered_at"] is None
        calls = len(feed_server.requests)
        for _ in range(3):  # the minute lane does not revive it
            clock.advance(MINUTE)
            await deliver_effects(runtime, clock)
        assert len(feed_server.requests) == calls

        # still down at the daily apply run: attempted (not skipped), and still owed
        first = await run_reconcile(runtime, clock, APPLY)
        assert first.outbox is not None
        assert first.outbox.revived == 1 and first.outbox.failed == 1
        assert first.outbox.pending == 1 and first.outbox.dead == 0  # transient: retried
        assert len(feed_server.requests) == calls + 1
        assert [e["event"] for e in first.errors] == ["reconcile_outbox_delivery_failed"]

        feed_server.status = 200  # the worker is back
        clock.advance(DAY)
        second = await run_reconcile(runtime, clock, APPLY)

    assert second.outbox is not None
    assert second.outbox.delivered == 1 and second.outbox.pending == 0
    row = await _row(db, outbox_id)
    assert row["delivered_at"] == clock.now() and row["last_error"] is None
    assert row["attempts"] == len(feed_server.requests)  # every call counted on the intent
    effect = await _effect(db, outbox_id)
    assert effect["delivered_at"] == clock.now()
    assert effect["payload"]["last_death"]["dead_reason"] == "expired"
    assert effect["expires_at"] > clock.now()  # revived with a fresh maximum age


async def test_an_apply_run_attempts_an_intent_waiting_out_its_backoff(
    db: Database, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    podcast = await f.podcast(db)
    outbox_id = await _intent(db, podcast)
    clock = later(minutes=1)
    feed_server.status = 500
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db, clock, fresh_db_url, http, feed_server, open_store("memory://")
        )
        drained = await deliver_effects(runtime, clock)
        assert drained.retried == 1  # its next attempt is 30 s away
        feed_server.status = 200
        report = await run_reconcile(runtime, clock, APPLY)  # the same instant
    assert report.outbox is not None
    assert report.outbox.delivered == 1 and report.outbox.pending == 0
    assert (await _row(db, outbox_id))["delivered_at"] == clock.now()
    effect = await _effect(db, outbox_id)
    assert "last_death" not in effect["payload"]  # it never died


async def test_the_apply_run_pages_through_every_intent_past_one_statements_bound(
    db: Database, fresh_db_url: str, feed_server: RecordingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Every apply run attempts every undelivered row": a backlog larger than one
    statement's page (OUTBOX_ADOPT_MAX, here 1) is made due page by page, dead effects among it
    revived, and all of it delivered by the one run."""
    podcasts = [await f.podcast(db) for _ in range(3)]
    ids = [await _intent(db, p) for p in podcasts]
    feed_server.status = 401
    clock = later(minutes=1)
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db, clock, fresh_db_url, http, feed_server, open_store("memory://")
        )
        first = await run_reconcile(runtime, clock, APPLY)
        assert first.outbox is not None and first.outbox.dead == 3 and first.outbox.pending == 3
        monkeypatch.setattr(feed_drain, "OUTBOX_ADOPT_MAX", 1)
        feed_server.status = 200
        feed_server.requests.clear()
        clock.advance(DAY)
        report = await run_reconcile(runtime, clock, APPLY)
    assert report.outbox is not None
    assert report.outbox.to_json() == {
        "pending": 0,
        "delivered": 3,
        "failed": 0,
        "dead": 0,
        "revived": 3,
    }
    for outbox_id in ids:
        assert (await _row(db, outbox_id))["delivered_at"] == clock.now()
    assert sorted(c.json()["id"] for c in feed_server.requests) == sorted(podcasts)


async def test_what_the_apply_runs_drain_budget_leaves_is_due_for_the_minute_lane(
    db: Database, fresh_db_url: str, feed_server: RecordingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply run's drain has a time budget of its own; a dead intent it made due but had no
    time to attempt is not left dead: the next minute's drain delivers it."""
    podcast = await f.podcast(db)
    outbox_id = await _intent(db, podcast)
    feed_server.status = 401
    clock = later(minutes=1)
    async with httpx.AsyncClient() as http:
        runtime = await _runtime(
            db, clock, fresh_db_url, http, feed_server, open_store("memory://")
        )
        await run_reconcile(runtime, clock, APPLY)
        assert (await _effect(db, outbox_id))["dead_reason"] == "permanent"
        monkeypatch.setattr(feed_drain, "OUTBOX_DRAIN_BUDGET_SECONDS", 0.0)
        feed_server.status = 200
        clock.advance(DAY)
        report = await run_reconcile(runtime, clock, APPLY)
        assert report.outbox is not None
        assert (report.outbox.revived, report.outbox.delivered, report.outbox.pending) == (1, 0, 1)
        assert (await _effect(db, outbox_id))["dead_at"] is None  # revived: due, not dead
        minute = await deliver_effects(runtime, clock)
    assert minute.delivered == 1
    assert (await _row(db, outbox_id))["delivered_at"] == clock.now()


async def test_without_r2_public_url_the_daily_lane_still_revives_and_drains_the_outbox(
    db: Database, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    """The reconciler is skipped while R2_PUBLIC_URL is unset (it cannot derive object keys),
    but its outbox drain needs no store: the daily lane still attempts every owed intent."""
    from nightcrew.lifecycle.lanes import run_lane
    from tests.conftest import make_runtime

    podcast = await f.podcast(db)
    outbox_id = await _intent(db, podcast)
    clock = later(days=2)
    feed_server.status = 401
    async with httpx.AsyncClient() as http:
        runtime = await make_runtime(
            db, clock, fresh_db_url, feedcache=HttpFeedCache(http, feed_server.url, SECRET)
        )
        first = await run_lane(runtime, clock, "daily")
        assert first is not None
        assert (await _effect(db, outbox_id))["dead_reason"] == "permanent"
        assert any(e["event"] == "reconcile_outbox_delivery_failed" for e in first.errors)

        feed_server.status = 200
        clock.advance(DAY)
        second = await run_lane(runtime, clock, "daily")
    assert second is not None
    reconcile = second.to_json()["jobs"]["runReconcile"]
    assert reconcile["skipped"] and reconcile["outbox"]["delivered"] == 1, reconcile
    assert reconcile["outbox"]["revived"] == 1 and reconcile["outbox"]["pending"] == 0
    assert (await _row(db, outbox_id))["delivered_at"] == clock.now()
    assert len(feed_server.requests) == 2
