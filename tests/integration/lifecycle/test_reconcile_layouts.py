"""The size backfill over every audio_url layout (spec 000: "for every episode with audio_url,
derive the R2 key and HEAD it"), run by the daily lane against real PostgreSQL and real stores:
a flat ``podcasts/{p}/e/{file}`` key is measured by the listing, a legacy key outside
``podcasts/`` by a HEAD; neither is swept; a URL not under R2_PUBLIC_URL is reported."""

from __future__ import annotations

from typing import Any

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import run_lane
from tests import factories as f
from tests.integration.lifecycle.test_reconcile import World, later, rt

FOREIGN = "https://cdn.elsewhere.example/shows/old.mp3"


async def _reconcile_report(runtime: Any, clock: Any) -> dict[str, Any]:
    report = await run_lane(runtime, clock, "daily")
    assert report is not None and report.errors == []
    [job] = [j for j in report.jobs if j.name == "runReconcile"]
    assert job.report is not None
    return job.report["report"]


async def test_flat_and_legacy_keys_get_their_sizes_and_are_never_swept(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    w = await World(db, store).setup()
    flat = await w.obj(f"podcasts/{w.podcast}/e/flat.mp3", 300)
    legacy = await w.obj("uploads/2019/legacy.mp3", 400)
    orphan = await w.obj(w.key("old-upload.mp3", episode="e9"), 50)
    flat_ep = await w.episode(flat, audio_file_size_bytes=None, status="published")
    legacy_ep = await w.episode(legacy, audio_file_size_bytes=None, status="draft")
    gone_ep = await w.episode("uploads/2018/gone.mp3", audio_file_size_bytes=7, status="draft")
    foreign_ep = await w.episode(None, status="draft")
    await db.execute(
        "UPDATE public.episodes SET audio_url = %(u)s WHERE id = %(e)s",
        {"u": FOREIGN, "e": foreign_ep},
    )
    clock = later(days=2)  # every object is past the 24 h orphan age
    runtime = await rt(db, clock, fresh_db_url, store)

    report = await _reconcile_report(runtime, clock)

    sizes = report["sizeBackfill"]
    assert (await w.row(flat_ep))["audio_file_size_bytes"] == 300
    assert (await w.row(legacy_ep))["audio_file_size_bytes"] == 400
    assert sizes["written"] == 2
    assert (sizes["measuredByListing"], sizes["measuredByHead"], sizes["heads"]) == (1, 1, 2)
    assert sizes["notUnderPublicUrl"] == 1
    assert sizes["notUnderPublicUrlSample"] == [{"episodeId": foreign_ep, "audioUrl": FOREIGN}]
    # the flat episode is published: its feed's enclosure length changed
    intents = await db.fetch(
        "SELECT podcast_id::text FROM public.feed_invalidation_outbox"
        " WHERE reason = 'size_backfill'"
    )
    assert intents == [{"podcast_id": w.podcast}]
    # the absent legacy object is the missing check's, HEADed again there, not measured
    assert report["missing"]["count"] == 1
    assert [s["episodeId"] for s in report["missing"]["sample"]] == [gone_ep]
    assert (await w.row(gone_ep))["audio_file_size_bytes"] == 7
    # the sweep ran (it took the unreferenced upload) and left both measured objects
    assert report["orphans"]["deleted"] == 1 and not await w.exists(orphan)
    assert await w.exists(flat) and await w.exists(legacy)

    again = await _reconcile_report(runtime, clock)

    assert again["sizeBackfill"]["written"] == 0 and again["sizeBackfill"]["mismatched"] == 0
    assert again["sizeBackfill"]["heads"] == 2
    assert await w.exists(flat) and await w.exists(legacy)


async def test_a_legacy_key_over_the_cap_is_blocked_like_a_listed_one(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    await db.execute(
        "INSERT INTO public.plan_limits VALUES ('tiny', 'storage_gb_per_account', 0.000001)"
    )
    w = World(db, store)
    w.podcast = await f.podcast(db, billing_account_id=await f.account(db, plan="tiny"))
    legacy = await w.obj("uploads/big.mp3", 5000)
    episode = await w.episode(legacy, audio_file_size_bytes=None, status="published")
    clock = later(days=1)

    report = await _reconcile_report(await rt(db, clock, fresh_db_url, store), clock)

    sizes = report["sizeBackfill"]
    assert sizes["measuredByHead"] == 1 and sizes["written"] == 0
    [blocked] = sizes["blockedOverCap"]
    assert blocked["episodeId"] == episode and blocked["measured"] == 5000
    assert (await w.row(episode))["audio_file_size_bytes"] is None


async def test_a_published_legacy_episode_measured_by_head_gets_its_feed_intent(
    db: Database, fresh_db_url: str, store: ObjectStore
) -> None:
    """The outbox rule holds for a size measured by a HEAD as for one from the listing: a
    published episode's new enclosure length owes its feed an invalidation, written with it."""
    w = await World(db, store).setup()
    legacy = await w.obj("uploads/2019/published.mp3", 900)
    episode = await w.episode(legacy, audio_file_size_bytes=None, status="published")
    clock = later(days=1)

    report = await _reconcile_report(await rt(db, clock, fresh_db_url, store), clock)

    assert report["sizeBackfill"]["measuredByHead"] == 1
    assert (await w.row(episode))["audio_file_size_bytes"] == 900
    intents = await db.fetch(
        "SELECT podcast_id::text FROM public.feed_invalidation_outbox"
        " WHERE reason = 'size_backfill'"
    )
    assert intents == [{"podcast_id": w.podcast}]
