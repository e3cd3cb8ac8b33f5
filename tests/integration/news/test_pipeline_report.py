"""The pass's report in pipeline mode is a run report: spec 001's fields say what the pass found
and decided (after its fetches), and the workers' results since the shard's previous report are
reported under ``workers``, as theirs — written, reviewed, the review waits, what the workers
noted (fetches put off behind a lease, Redis failures); and an article count that fails is
reported, with the pass and the workers going on."""

from __future__ import annotations

import itertools
from pathlib import Path

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline import notes, stages
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.steps.entries import LINK_TOO_LONG, NO_LINK
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
        "reason": "waiting: test",
        "attempts": 0,
        "not_before": None,
        "admitted_at": None,
        **columns,
    }
    await db.execute(
        "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage, state,"
        " reason, attempts, not_before, admitted_at, created_at, updated_at) VALUES (%(url)s,"
        " %(source)s, 's', 't', 's', %(stage)s, %(state)s, %(reason)s, %(attempts)s,"
        " %(not_before)s, %(admitted_at)s, now(), now())",
        {"url": url, "source": source["id"], **row},
    )


async def _written(db: Database, n: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates WHERE state <> 'rejected'")
    return waiting == 0 and await count(db, "SELECT count(*) FROM news.articles") == n


async def test_a_pass_reports_what_it_found_and_the_workers_results_since_the_last_pass(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=2, items=3) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime):
                first = (await run_pass(runtime, SystemClock(), "s")).to_json()
                await wait_for(lambda: _written(db, 6), within=60, what="6 articles written")
            assert first["enqueuedSources"] == 2 and first["unfetchedSources"] == 0
            assert first["queuedCount"] == 6 and first["admittedCount"] == 6
            assert first["queuedBySource"] == {"Feed 0 (s)": 3, "Feed 1 (s)": 3}
            # the pass wrote nothing itself: the workers did, after it
            assert first["processedCount"] == first["aiReviewedCount"] == 0
            assert first["workers"]["since"] is None
            assert first["backpressureDbArticleCount"] == 0
            assert first["backpressureDbArticleCountError"] is None
            assert first["redisEnabled"] is False and first["lockedCount"] == 0
            assert first["deferredCount"] == 0 and first["deferredReasons"] == []

            now = SystemClock().now()
            # left for the next pass: two candidates waiting to be admitted, one the model
            # failed for now (waiting too, its attempt counted), and one an earlier pass
            # admitted, parked behind a review lease another worker holds
            await _candidate(db, f"{farm.url}/extra/1")
            await _candidate(db, f"{farm.url}/extra/2")
            await _candidate(db, f"{farm.url}/extra/3", attempts=1)
            await _candidate(db, f"{farm.url}/extra/4", state="queued", admitted_at=now)
            await db.execute(  # as the review stage parks it, finding its lease held elsewhere
                stages.SQL["park"],
                {
                    "url": f"{farm.url}/extra/4",
                    "stage": "review",
                    "reason": "its review lease is held elsewhere; sent again once it is free",
                    "wait": 3600,
                    "now": now,
                },
            )
            second = (await run_pass(runtime, SystemClock(), "s")).to_json()

        accepted = await count(db, "SELECT count(*) FROM news.reviews WHERE accepted")
        assert second["enqueuedSources"] == 0  # nothing is due yet
        assert second["queuedCount"] == 4 and second["admittedCount"] == 3
        assert second["processedCount"] == 0 and second["resentCount"] == 0
        assert second["deferredCount"] == 0 and second["deferredReasons"] == []
        assert second["stages"]["review"] == {"held": 1, "queued": 3}
        workers = second["workers"]
        first_saved = await db.fetch_one(
            "SELECT started_at FROM news.worker_reports WHERE shard = 's' ORDER BY id LIMIT 1"
        )
        assert first_saved is not None
        # the window runs from where the first pass stopped reading to this pass's reading
        assert workers["since"] == first["workers"]["until"]
        assert workers["since"] > first_saved["started_at"].isoformat()
        # the workers' writes, reported once: what they noted before the first pass read its
        # notes (it ran beside them), and the rest by this one
        both = {
            name: first["workers"][name] + workers[name]
            for name in ("processedCount", "aiReviewedCount", "acceptedCount", "rejectedCount")
        }
        assert both["processedCount"] == 6 and both["aiReviewedCount"] == 6
        assert both["acceptedCount"] == accepted
        assert both["acceptedCount"] + both["rejectedCount"] == 6
        assert workers["reviewRetryCount"] == 1 and workers["redisAiReviewLockSkippedCount"] == 1
        assert workers["writeErrors"] == [] and workers["redisEnabled"] is True
        # retriedCount is the no-thumbnail retry's (none due)
        assert second["retriedCount"] == 0
        assert second["fetchErrors"] == second["writeErrors"] == second["droppedItems"] == []
        assert second["reviewer"] == "model" and second["translatedCount"] == 0
        assert second["backpressureDbArticleCount"] == 6


async def _written(db: Database, n: int) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates WHERE state <> 'rejected'")
    return waiting == 0 and await count(db, "SELECT count(*) FROM news.articles") == n


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
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime) as summary:
            report = (await run_pass(runtime, SystemClock(), "s")).to_json()
            assert report["backpressureDbArticleCount"] is None
            assert "the count is down for the test" in report["backpressureDbArticleCountError"]
            # it went on: the held candidate and the 4 new ones admitted (the queue limit
            # still applied), the due sources enqueued, the report saved
            assert report["admittedCount"] == 5 and report["enqueuedSources"] == 2
            saved = await db.fetch_one(
                "SELECT report FROM news.worker_reports WHERE shard = 's' ORDER BY id DESC"
            )
            assert saved is not None
            assert saved["report"]["backpressureDbArticleCountError"] is not None
            await wait_for(lambda: _count_at_least(db, 4), within=60, what="the 4 feed articles")
        assert summary.failed == {} and summary.dead_lettered == {}
        assert set(model.reviews) >= farm.article_urls()


async def _count_at_least(db: Database, n: int) -> bool:
    return await count(db, "SELECT count(*) FROM news.articles") >= n


@needs_redis
async def test_what_the_workers_note_reaches_the_next_pass_once(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Dropped items and Redis failures leave no row of their own: the worker that saw them
    notes them; the next pass reports them — the dropped items as its fetches' own, the Redis
    failure as the workers' — and the one after does not."""
    env = {**pipeline_env(fresh_db_url, prefix, model, tmp_path), "REDIS_URL": REDIS_URL}
    clock = SystemClock()
    async with pipeline_runtime(env, db) as runtime:
        first = (await run_pass(runtime, clock, "s")).to_json()
        assert first["redisEnabled"] is True  # configured, and answering the pass

        now = clock.now()
        dropped = {LINK_TOO_LONG: 2, NO_LINK: 1}
        await notes.note_dropped(db, shard="s", source="long", dropped=dropped, now=now)
        await notes.note_dropped(db, shard="another", source="x", dropped=dropped, now=now)
        # a worker's housekeeping: nothing failed yet, then its breaker sees Redis fail
        adapters = runtime.news_adapters()
        breaker = adapters.redis_breaker
        assert breaker is not None
        since = await notes.note_redis_trouble(db, adapters, since=None, now=now)
        assert await count(db, "SELECT count(*) FROM news.report_notes") == 4  # no Redis note
        breaker.failure("connection refused (test)")
        await notes.note_redis_trouble(db, adapters, since=since, now=now)
        breaker.success()  # back: only the note can tell the pass about it

        second = (await run_pass(runtime, clock, "s")).to_json()
        third = (await run_pass(runtime, clock, "s")).to_json()

    assert second["droppedItems"] == [
        {"source": "long", "reason": LINK_TOO_LONG, "count": 2},
        {"source": "long", "reason": NO_LINK, "count": 1},
    ]
    # the pass's own Redis answered; a worker's failed since the previous report
    assert second["redisEnabled"] is True and second["workers"]["redisEnabled"] is False
    # reported once: the next window starts after them
    assert third["droppedItems"] == [] and third["workers"]["redisEnabled"] is True
    # the shard's notes are forgotten once reported; the other shard's and Redis's stay
    left = await db.fetch("SELECT shard, kind FROM news.report_notes ORDER BY kind, shard")
    assert [(r["shard"], r["kind"]) for r in left] == [
        ("another", "dropped_items"),
        ("another", "dropped_items"),
        (None, "redis_failed"),
    ]


async def test_a_fetch_put_off_behind_another_workers_lease_is_the_workers_not_the_shard_lock(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """lockedCount means spec 001's shard lock in both engines (a pass that found it held is
    skipped): a fetch a worker put off because another worker held its source's lease is the
    workers' ``fetchLeaseSkippedCount``, reported once by the next pass."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    clock = SystemClock()
    async with pipeline_runtime(env, db) as runtime:
        first = (await run_pass(runtime, clock, "s")).to_json()
        await notes.note_fetch_locked(db, shard="s", now=clock.now())
        second = (await run_pass(runtime, clock, "s")).to_json()
        third = (await run_pass(runtime, clock, "s")).to_json()

    assert first["lockedCount"] == 0 and first["status"] == "completed"
    assert second["lockedCount"] == 0 and second["workers"]["fetchLeaseSkippedCount"] == 1
    assert third["workers"]["fetchLeaseSkippedCount"] == 0


async def test_passes_back_to_back_report_each_workers_result_once(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    """Passes run one after another while the workers write, so writes land during passes:
    each pass's window of the workers' results starts where the previous one stopped reading,
    and the windows add up to exactly what was written and reviewed — nothing twice, nothing
    missed."""
    with ModelStandIn(delay=0.2) as model, FeedFarm(feeds=2, items=6, thumbnails=True) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
        await add_farm_sources(db, farm)
        reports = []
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime, concurrency=1):
            while await count(db, "SELECT count(*) FROM news.articles") < 12:
                reports.append((await run_pass(runtime, SystemClock(), "s")).to_json())
            reports.append((await run_pass(runtime, SystemClock(), "s")).to_json())

    workers = [r["workers"] for r in reports]
    assert len(reports) > 3, "the writes should have spread over several passes"
    assert sum(w["processedCount"] for w in workers) == 12, workers
    assert sum(w["aiReviewedCount"] for w in workers) == 12
    # each window starts where the one before it stopped
    assert all(b["since"] == a["until"] for a, b in itertools.pairwise(workers))
