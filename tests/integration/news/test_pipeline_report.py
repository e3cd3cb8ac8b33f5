"""The pass's report (spec 001's fields) in pipeline mode: what the pass admitted, the workers'
results since the shard's previous report, the review waits, what the workers noted (dropped
items, backlog translations, Redis failures), a pass that finds the shard's lock held, and an
article count that fails reported — with the pass and the workers going on."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news import report
from nightcrew.news.fetch import LINK_TOO_LONG, NO_LINK
from nightcrew.news.pipeline import run_pass
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.services import REDIS_URL, needs_rabbitmq, needs_redis
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq


async def _candidate(db: Database, url: str, **columns: object) -> None:
    source = await db.fetch_one("SELECT id FROM news.sources ORDER BY id LIMIT 1")
    assert source is not None
    row = {
        "stage": "review",
        "state": "held",
        "reason": "review queue limit: test",
        "attempts": 0,
        "not_before": None,
        **columns,
    }
    await db.execute(
        "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage, state,"
        " reason, attempts, not_before, created_at, updated_at) VALUES (%(url)s, %(source)s,"
        " 's', 't', 's', %(stage)s, %(state)s, %(reason)s, %(attempts)s, %(not_before)s,"
        " now(), now())",
        {"url": url, "source": source["id"], **row},
    )


async def _written(db: Database, n: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates WHERE state <> 'rejected'")
    return waiting == 0 and await count(db, "SELECT count(*) FROM news.articles") == n


async def test_a_pass_reports_what_it_admitted_and_the_workers_results_since_the_last_pass(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=2, items=3) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            first = (await run_pass(runtime, SystemClock(), "s")).to_json()
            assert first["enqueuedSources"] == 2 and first["processedCount"] == 0
            assert first["resultsSince"] is None and first["writtenCount"] == 0
            assert first["backpressureDbArticleCount"] == 0
            assert first["backpressureDbArticleCountError"] is None
            assert first["redisEnabled"] is False and first["lockedCount"] == 0
            async with worker_running(runtime):
                await wait_for(lambda: _written(db, 6), within=60, what="6 articles written")

            # left for the next pass: two held candidates it may release, one waiting for
            # another review attempt, one parked behind a review lease another worker holds
            await _candidate(db, f"{farm.url}/extra/1")
            await _candidate(db, f"{farm.url}/extra/2")
            await _candidate(
                db,
                f"{farm.url}/extra/3",
                attempts=1,
                reason="the model failed for now; sent again after a backoff",
                not_before=datetime(2999, 1, 1, tzinfo=SystemClock().now().tzinfo),
            )
            await _candidate(
                db,
                f"{farm.url}/extra/4",
                reason="its review lease is held elsewhere; sent again once it is free",
                not_before=datetime(2999, 1, 1, tzinfo=SystemClock().now().tzinfo),
            )
            second = (await run_pass(runtime, SystemClock(), "s")).to_json()

        accepted = await count(db, "SELECT count(*) FROM news.reviews WHERE accepted")
        assert second["releasedCount"] == 2 and second["resentCount"] == 0
        # spec 001's processedCount means articles written, in both engines: here the workers'
        # since the previous report (the pass's own admissions are releasedCount)
        assert second["processedCount"] == second["writtenCount"] == 6
        assert second["enqueuedSources"] == 0  # nothing is due yet
        first_saved = await db.fetch_one(
            "SELECT started_at FROM news.worker_reports WHERE shard = 's' ORDER BY id LIMIT 1"
        )
        assert first_saved is not None  # the window runs from the first pass to this one
        assert second["resultsSince"] == first_saved["started_at"].isoformat()
        assert second["writtenCount"] == 6 and second["aiReviewedCount"] == 6
        assert second["acceptedCount"] == accepted
        assert second["acceptedCount"] + second["rejectedCount"] == 6
        # retriedCount is the no-thumbnail retry's (none due); the model's retries are the
        # pipeline's own figure
        assert second["retriedCount"] == 0 and second["reviewRetryCount"] == 1
        assert second["redisAiReviewLockSkippedCount"] == 1
        assert second["fetchErrors"] == second["writeErrors"] == second["droppedItems"] == []
        assert second["reviewer"] == "model" and second["translatedCount"] == 0
        assert second["backpressureDbArticleCount"] == 6
        assert second["deferredCount"] == 2  # the two that may not go yet


async def test_an_article_count_that_fails_is_reported_and_the_pass_and_workers_go_on(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=2, items=2) as farm:
        await add_farm_sources(db, farm)
        await _candidate(db, f"{farm.url}/articles/held-before")
        # the count endpoint is down (an operator's estimate that broke, a timeout): spec 001
        # reports backpressureDbArticleCountError and continues
        await db.execute(
            "CREATE OR REPLACE FUNCTION news.article_count() RETURNS bigint LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'the count is down for the test'; END $$"
        )
        async with pipeline_runtime(env, db) as runtime:
            report = (await run_pass(runtime, SystemClock(), "s")).to_json()
            assert report["backpressureDbArticleCount"] is None
            assert "the count is down for the test" in report["backpressureDbArticleCountError"]
            # it went on: the held candidate admitted (under a savepoint, in the same
            # transaction that released it), the due sources enqueued, the report saved
            assert report["releasedCount"] == 1 and report["enqueuedSources"] == 2
            saved = await db.fetch_one(
                "SELECT report FROM news.worker_reports WHERE shard = 's' ORDER BY id DESC"
            )
            assert saved is not None
            assert saved["report"]["backpressureDbArticleCountError"] is not None
            # the workers' admissions go on too, the queue limit still applied
            async with worker_running(runtime) as summary:
                await wait_for(
                    lambda: _count_at_least(db, 4), within=60, what="the 4 feed articles"
                )
        assert summary.failed == {} and summary.dead_lettered == {}
        assert set(model.reviews) >= farm.article_urls()


async def _count_at_least(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.articles") >= n


@needs_redis
async def test_what_the_workers_note_reaches_the_next_pass_once(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Dropped items, backlog translations and Redis failures leave no row of their own: the
    worker that saw them notes them, the next pass reports them, the one after does not."""
    env = {**pipeline_env(fresh_db_url, prefix, model, tmp_path), "REDIS_URL": REDIS_URL}
    clock = SystemClock()
    async with pipeline_runtime(env, db) as runtime:
        first = (await run_pass(runtime, clock, "s")).to_json()
        assert first["redisEnabled"] is True  # configured, and answering the pass

        now = clock.now()
        dropped = {LINK_TOO_LONG: 2, NO_LINK: 1}
        await report.note_dropped(db, shard="s", source="long", dropped=dropped, now=now)
        await report.note_translated(db, shard="s", count=3, now=now)
        await report.note_translated(db, shard="another", count=5, now=now)  # not this shard's
        # a worker's housekeeping: nothing failed yet, then its breaker sees Redis fail
        adapters = runtime.news_adapters()
        breaker = adapters.redis_breaker
        assert breaker is not None
        since = await report.note_redis_trouble(db, adapters, since=None, now=now)
        assert await count(db, "SELECT count(*) FROM news.report_notes") == 4  # no Redis note
        breaker.failure("connection refused (test)")
        await report.note_redis_trouble(db, adapters, since=since, now=now)
        breaker.success()  # back: only the note can tell the pass about it

        second = (await run_pass(runtime, clock, "s")).to_json()
        third = (await run_pass(runtime, clock, "s")).to_json()

    assert second["droppedItems"] == [
        {"source": "long", "reason": LINK_TOO_LONG, "count": 2},
        {"source": "long", "reason": NO_LINK, "count": 1},
    ]
    assert second["translatedCount"] == 3 and second["redisEnabled"] is False
    # reported once: the next window starts after them
    assert third["droppedItems"] == [] and third["translatedCount"] == 0
    assert third["redisEnabled"] is True
    # the shard's notes are forgotten once reported; the other shard's and Redis's stay
    left = await db.fetch("SELECT shard, kind FROM news.report_notes ORDER BY kind")
    assert [(r["shard"], r["kind"]) for r in left] == [
        (None, "redis_failed"),
        ("another", "translated"),
    ]


async def test_work_put_off_behind_another_workers_lease_is_the_pipelines_locked_count(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """A pass takes no shard lock (it never stands in an inline run's way, nor one in its
    own): the pipeline's lock skips are the fetches and enrichments put off because another
    worker held their lease, since the previous report — reported once."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    clock = SystemClock()
    with FeedFarm(feeds=1, items=1) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            first = (await run_pass(runtime, clock, "s")).to_json()
            await report.note_fetch_locked(db, shard="s", now=clock.now())
            await _candidate(
                db,
                f"{farm.url}/extra/1",
                stage="enrich",
                reason="its enrich lease is held elsewhere; sent again once it is free",
                not_before=datetime(2999, 1, 1, tzinfo=clock.now().tzinfo),
            )
            second = (await run_pass(runtime, clock, "s")).to_json()
            third = (await run_pass(runtime, clock, "s")).to_json()

    assert first["lockedCount"] == 0 and first["status"] == "completed"
    assert second["lockedCount"] == 2 and second["status"] == "completed"
    assert second["skipped"] is False and second["redisAiReviewLockSkippedCount"] == 0
    assert third["lockedCount"] == 0
