"""A pipeline pass means what an inline run means by spec 001's words: it takes the shard lock
(a second pass of the shard meanwhile is skipped and says so, and the feeds are fetched once),
its report is what that pass found and decided after its fetches, and its queue limit gates the
shard's whole queue — at most the limit admitted per pass, oldest first, the rest waiting with
the reason — however fast the workers' housekeeping runs (the default, 5 s). Real PostgreSQL and
RabbitMQ, loopback feeds and model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline import notes
from nightcrew.news.engines.pipeline import worker as news_worker
from nightcrew.news.engines.pipeline.passes import run_pass
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    housekept,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq

BACKLOG = "backlog over the queue limit: processing 5 of "


async def _articles(db: Database, shard: str) -> int:
    return await count(db, "SELECT count(*) FROM news.articles WHERE shard = %(s)s", {"s": shard})


@pytest.mark.slow
async def test_a_pass_admits_at_most_the_queue_limit_and_the_rest_over_later_passes(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """INGESTION_BACKPRESSURE_QUEUE_LIMIT=5, 40 new items, one worker on the default 5 s
    housekeeping: one pass and four housekeeping rounds later (20 s) exactly 5 are written (no
    round admits more); every later pass admits the
    next 5 (oldest first) once the last 5 are done; all 40 over eight passes, each pass but the
    last saying why the rest wait."""
    assert news_worker.HOUSEKEEPING_SECONDS == 5.0  # the default, not pushed out of the way
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5"
    )
    with FeedFarm(feeds=2, items=20) as farm:
        await add_farm_sources(db, farm, "s")
        async with (
            pipeline_runtime(env, db) as runtime,
            worker_running(runtime, concurrency=8) as summary,
        ):
            first = (await run_pass(runtime, SystemClock(), "s")).to_json()
            await housekept(summary, rounds=4, within=40)
            after_four_rounds = await _articles(db, "s")
            reports = [first]
            while await _articles(db, "s") < 40 and len(reports) < 12:
                written = await _articles(db, "s")
                reports.append((await run_pass(runtime, SystemClock(), "s")).to_json())
                await wait_for(
                    lambda w=written: _one_batch_more(db, w),  # type: ignore[misc]
                    within=30,
                    what="the pass's batch written",
                )
            rest = await notes.worker_results(db, shard="s", now=SystemClock().now(), take=True)

    assert after_four_rounds == 5, after_four_rounds
    assert first["queuedCount"] == 40 and first["admittedCount"] == 5
    assert first["deferredCount"] == 35 and first["processedCount"] == 0
    assert first["deferredReasons"] == [f"{BACKLOG}40 (INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"], (
        first["deferredReasons"]
    )
    assert await _articles(db, "s") == 40 and len(reports) == 8
    assert [r["admittedCount"] for r in reports] == [5] * 8
    for n, report in enumerate(reports[:-1]):
        assert any(r.startswith(BACKLOG) for r in report["deferredReasons"]), (n, report)
    assert reports[-1]["deferredReasons"] == [] and reports[-1]["deferredCount"] == 0
    # every write is reported once, as the workers': by the passes, and the last batch's by
    # the pass that takes the workers' notes next
    reported = sum(r["workers"]["processedCount"] for r in reports) + rest.processed_count
    assert reported == 40
    assert model.reviews == {url: 1 for url in farm.article_urls()}


async def _one_batch_more(db: Database, written: int) -> bool:
    return await _articles(db, "s") >= min(written + 5, 40) and not await count(
        db, "SELECT count(*) FROM news.candidates WHERE state = 'queued'"
    )


async def test_a_first_pass_counts_the_queue_after_its_fetches_as_the_inline_run_does(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """The same feeds (two farms of one shape, 2 feeds of 20 items) in two shards: the inline
    run of one and the first pass of the other both report queuedCount 40, by the same
    sources' counts, and the same limits, article count and deferral."""
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5"
    )
    with FeedFarm(feeds=2, items=20) as inline_farm, FeedFarm(feeds=2, items=20) as piped_farm:
        await add_farm_sources(db, inline_farm, "a")
        await add_farm_sources(db, piped_farm, "b")
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime, ["fetch"]):  # the fetches only: nothing written
                piped = (await run_pass(runtime, SystemClock(), "b")).to_json()
            inline = (await run_shard(runtime, SystemClock(), "a")).to_json()

    assert piped["queuedCount"] == inline["queuedCount"] == 40
    assert piped["queuedBySource"] == {"Feed 0 (b)": 20, "Feed 1 (b)": 20}
    assert inline["queuedBySource"] == {"Feed 0 (a)": 20, "Feed 1 (a)": 20}
    for field in (
        "deferredCount",
        "deferredReasons",
        "retriedCount",
        "backpressureQueueLimit",
        "backpressureDbArticleLimit",
        "backpressureDbArticleCount",
        "lockedCount",
        "fetchErrors",
        "droppedItems",
        "status",
    ):
        assert piped[field] == inline[field], field
    assert piped["admittedCount"] == 5 and piped["unfetchedSources"] == 0
    assert inline["processedCount"] == 5  # the run writes its batch; the pass hands it on
    assert piped["processedCount"] == 0


async def test_two_passes_of_one_shard_at_once_one_is_skipped_and_the_feeds_fetched_once(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Spec 001's shard lock in pipeline mode: of two passes started together, one runs and
    one reports skipped (lockedCount 1, the lock named as the reason) — each feed is asked for
    once — and a third pass once both are done runs again."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=3, items=4) as farm:
        await add_farm_sources(db, farm, "s")
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
            both = await asyncio.gather(
                run_pass(runtime, SystemClock(), "s"), run_pass(runtime, SystemClock(), "s")
            )
            await wait_for(lambda: _written(db, 12), within=30, what="12 articles written")
            feed_requests = farm.feed_requests
            third = await run_pass(runtime, SystemClock(), "s")

    reports = sorted((r.to_json() for r in both), key=lambda r: r["status"])
    ran, skipped = reports
    assert (ran["status"], skipped["status"]) == ("completed", "skipped")
    assert skipped["skipped"] is True and skipped["lockedCount"] == 1
    assert skipped["deferredReasons"] == ["another run holds this shard's lock"]
    assert skipped["enqueuedSources"] == 0 and skipped["admittedCount"] == 0
    assert ran["lockedCount"] == 0 and ran["enqueuedSources"] == 3 and ran["admittedCount"] == 12
    assert feed_requests == 3
    assert third.status == "completed" and third.locked_count == 0
    saved = await count(db, "SELECT count(*) FROM news.worker_reports WHERE shard = 's'")
    assert saved == 3


async def _written(db: Database, n: int) -> bool:
    return await _articles(db, "s") == n and not await count(
        db, "SELECT count(*) FROM news.candidates WHERE state IN ('queued', 'held')"
    )


async def test_a_pass_waits_for_its_own_fetches_not_for_an_earlier_passs_lost_one(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """One source's fetch message from an earlier pass is lost (it is still owed, and will be
    sent again only after NEWS_RESEND_AFTER_SECONDS): a pass waits for the fetches it sent
    itself, not for that one, and admits what they found within seconds."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=2, items=2) as farm:
        await add_farm_sources(db, farm, "s")
        await db.execute(
            "UPDATE news.sources SET fetch_queued_at = now()"
            " WHERE id = (SELECT min(id) FROM news.sources)"
        )
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
            started = asyncio.get_running_loop().time()
            report = (await run_pass(runtime, SystemClock(), "s")).to_json()
            took = asyncio.get_running_loop().time() - started

    assert report["enqueuedSources"] == 1 and report["unfetchedSources"] == 0
    assert report["queuedCount"] == 2 and report["admittedCount"] == 2
    assert took < 10, took
