"""The size backfill's batched writes against real PostgreSQL and its real storage
cap trigger: SIZE_WRITE_BATCH rows a statement, and a row the trigger refuses (23514) found,
listed under blockedOverCap and left out while every other row of its batch is written.

The store only feeds the listing here, so these run on local files alone."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.database import Database
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.sizes import SIZE_WRITE_BATCH
from tests import factories as f
from tests.conftest import real_store
from tests.integration.lifecycle.test_reconcile import APPLY, BASE, World, later, rt

# Scan order is by episode id: these two come first, this one last.
FIRST = "00000000-0000-4000-8000-000000000001"
SECOND = "00000000-0000-4000-8000-000000000002"
LAST = "ffffffff-ffff-4fff-bfff-ffffffffffff"


@pytest.fixture
def world_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    return real_store("file", request, tmp_path)


async def _wrong_sizes(w: World, count: int) -> dict[str, str]:
    """``count`` episodes whose object holds 100 bytes but whose recorded size is 99, every
    other one published; returns id → status."""
    keys = [w.key("a.mp3", episode=f"b{i}") for i in range(count)]
    for key in keys:
        await w.obj(key, 100)
    rows = await w.db.fetch(
        "INSERT INTO public.episodes (podcast_id, status, audio_url, audio_file_size_bytes)"
        " SELECT %(p)s, CASE WHEN n %% 2 = 0 THEN 'published' ELSE 'draft' END,"
        "        %(base)s || '/' || k, 99"
        "   FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS t (k, n)"
        " RETURNING id::text, status",
        {"p": w.podcast, "base": BASE, "keys": keys},
    )
    return {r["id"]: r["status"] for r in rows}


async def _capped_podcast(db: Database, store: ObjectStore) -> World:
    """A podcast of an account whose storage cap is 1,000 bytes."""
    await db.execute(
        "INSERT INTO public.plan_limits VALUES ('tiny', 'storage_gb_per_account', 0.000001)"
    )
    w = World(db, store)
    w.podcast = await f.podcast(db, billing_account_id=await f.account(db, plan="tiny"))
    return w


async def _capped_episode(w: World, episode_id: str, size: int) -> str:
    key = await w.obj(w.key("big.mp3", episode=episode_id), size)
    return await w.episode(key, id=episode_id, audio_file_size_bytes=None, status="published")


async def _intents(db: Database) -> list[str]:
    rows = await db.fetch(
        "SELECT podcast_id::text FROM public.feed_invalidation_outbox"
        " WHERE reason = 'size_backfill' ORDER BY podcast_id"
    )
    return [r["podcast_id"] for r in rows]


async def _sizes(db: Database) -> dict[str, tuple[int | None, datetime]]:
    rows = await db.fetch(
        "SELECT id::text, audio_file_size_bytes, updated_at FROM public.episodes ORDER BY id"
    )
    return {r["id"]: (r["audio_file_size_bytes"], r["updated_at"]) for r in rows}


async def test_a_row_the_cap_refuses_is_listed_and_the_rest_of_its_batch_is_written(
    db: Database, fresh_db_url: str, world_store: ObjectStore
) -> None:
    capped = await _capped_podcast(db, world_store)
    # each fits the 1,000-byte cap alone, not both: the per-row path wrote the first in scan
    # order and refused the second, with its trigger seeing the first one written
    await _capped_episode(capped, FIRST, 600)
    await _capped_episode(capped, SECOND, 600)
    w = await World(db, world_store).setup()
    others = await _wrong_sizes(w, 6)
    assert len(others) + 2 < SIZE_WRITE_BATCH  # one batch holds them all

    clock = later(days=1)
    report = await run_reconcile(await rt(db, clock, fresh_db_url, world_store), clock, APPLY)

    backfill = report.size_backfill
    assert backfill.mismatched == 8 and backfill.written == 7
    [blocked] = backfill.blocked_over_cap
    assert (blocked.episode_id, blocked.podcast_id, blocked.measured) == (
        SECOND,
        capped.podcast,
        600,
    )
    assert blocked.error.startswith("storage cap exceeded for billing account")
    sizes = await _sizes(db)
    assert sizes[FIRST][0] == 600 and sizes[SECOND][0] is None
    assert all(sizes[e][0] == 100 for e in others)
    # an intent per published episode written, in its batch's transaction; none for the refused
    published = [e for e, status in others.items() if status == "published"]
    assert sorted(await _intents(db)) == sorted([w.podcast] * len(published) + [capped.podcast])
    assert report.to_json()["sizeBackfill"]["blockedOverCap"] == [
        {"episodeId": SECOND, "podcastId": capped.podcast, "measured": 600, "error": blocked.error}
    ]


async def test_more_rows_than_a_batch_are_all_written_and_a_second_apply_writes_nothing(
    db: Database, fresh_db_url: str, world_store: ObjectStore
) -> None:
    capped = await _capped_podcast(db, world_store)
    await _capped_episode(capped, LAST, 5000)  # refused, in the last batch
    w = await World(db, world_store).setup()
    others = await _wrong_sizes(w, SIZE_WRITE_BATCH + 7)
    clock = later(days=1)
    runtime = await rt(db, clock, fresh_db_url, world_store)

    report = await run_reconcile(runtime, clock, APPLY)

    assert report.size_backfill.mismatched == SIZE_WRITE_BATCH + 8
    assert report.size_backfill.written == SIZE_WRITE_BATCH + 7
    assert [b.episode_id for b in report.size_backfill.blocked_over_cap] == [LAST]
    sizes = await _sizes(db)
    assert all(sizes[e][0] == 100 for e in others) and sizes[LAST][0] is None
    published = sum(1 for status in others.values() if status == "published")
    assert await _intents(db) == [w.podcast] * published

    clock.advance(timedelta(minutes=5))  # a rewrite would stamp a later updated_at
    again = await run_reconcile(runtime, clock, APPLY)

    # equal sizes are not rewritten: no write, no updated_at bump, no intent
    assert again.size_backfill.written == 0
    assert again.size_backfill.mismatched == 1  # the refused one, refused again
    assert [b.episode_id for b in again.size_backfill.blocked_over_cap] == [LAST]
    assert await _sizes(db) == sizes
    assert await _intents(db) == [w.podcast] * published


async def test_the_cap_bypass_writes_every_batch_in_one_transaction(
    db: Database, fresh_db_url: str, world_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three batches of 2 in the bypass's one transaction, the refused row among them
    monkeypatch.setattr("nightcrew.lifecycle.reconcile.sizes.SIZE_WRITE_BATCH", 2)
    capped = await _capped_podcast(db, world_store)
    await _capped_episode(capped, SECOND, 5000)
    w = await World(db, world_store).setup()
    others = await _wrong_sizes(w, 5)
    clock = later(days=1)

    report = await run_reconcile(
        await rt(db, clock, fresh_db_url, world_store),
        clock,
        ReconcileOptions(mode="apply", bypass_cap_for_backfill=True),
    )

    assert report.size_backfill.written == 6 and report.size_backfill.blocked_over_cap == ()
    assert report.size_backfill.cap_bypass_fallback is False
    sizes = await _sizes(db)
    assert sizes[SECOND][0] == 5000 and all(sizes[e][0] == 100 for e in others)
    trigger = await db.fetch_one(
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'trigger_enforce_storage_account_cap'"
    )
    assert trigger == {"tgenabled": "O"}  # enabled again
    published = sum(1 for status in others.values() if status == "published")
    assert sorted(await _intents(db)) == sorted([w.podcast] * published + [capped.podcast])
