"""Backpressure that drains, and the cost bound on model reviews only, in the inline
engine: over INGESTION_BACKPRESSURE_QUEUE_LIMIT a run works a batch of the limit's worth,
oldest first, and the backlog drains over successive runs instead of being deferred for ever;
MAX_AI_REVIEWS bounds a model's reviews, not the offline rules' verdicts. The pipeline's side
is test_pipeline_budget.py."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.sources.registry import add_source
from tests.conftest import NOW
from tests.integration.news.model_reviewer import RulesModel
from tests.integration.news.test_run import deps_for, page_requests, rss, runtime_for, site
from tests.support.servers import RecordingServer
from tests.support.standins import FeedFarm


async def _written(db: Database) -> list[str]:
    return [r["url"] for r in await db.fetch("SELECT url FROM news.articles ORDER BY id")]


async def _run(
    db: Database,
    clock: FrozenClock,
    url: str,
    http: UntrustedHttp,
    reviewer: Any = None,
    **env: str,
) -> dict[str, Any]:
    runtime = await runtime_for(db, clock, url, **env)
    deps = deps_for(db, clock, http, **({"reviewer": reviewer} if reviewer else {}))
    report = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
    clock.advance(timedelta(hours=1))
    return report


async def test_a_backlog_over_the_queue_limit_drains_in_bounded_batches_over_successive_runs(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """12 queued, INGESTION_BACKPRESSURE_QUEUE_LIMIT=5: 5, 5, then the last 2 — oldest first,
    each batch at most the limit, the feed answering 304 after the first run."""
    statuses = site(feed_server, {"/feeds/a": rss(feed_server.url, 12)}, etag=True)
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    reports = []
    for _ in range(3):
        pages_before = len(page_requests(feed_server))
        reports.append(
            await _run(db, clock, fresh_db_url, http, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5")
        )
        # the expensive steps ran for the batch only: one image fetch per article in it
        assert len(page_requests(feed_server)) - pages_before == reports[-1]["processedCount"]

    assert statuses == [200, 304, 304]
    assert [r["queuedCount"] for r in reports] == [12, 7, 2]
    assert [r["processedCount"] for r in reports] == [5, 5, 2]
    assert [r["deferredCount"] for r in reports] == [7, 2, 0]
    assert [r["deferredReasons"] for r in reports] == [
        ["backlog over the queue limit: processing 5 of 12 (INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"],
        ["backlog over the queue limit: processing 5 of 7 (INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"],
        [],
    ]
    # oldest first: feed order, batch after batch
    assert [u.rsplit("-", 1)[1] for u in await _written(db)] == [str(n) for n in range(12)]
    assert await db.fetch("SELECT 1 FROM news.candidates") == []


async def test_a_new_shard_of_30_feeds_by_10_items_is_written_within_three_inline_runs(
    db: Database, clock: FrozenClock, fresh_db_url: str, http: UntrustedHttp
) -> None:
    """The default limits (queue 250, MAX_AI_REVIEWS 25, the offline rules): 300 candidates on
    the first run, over the queue limit. Once, every run deferred all 300, for ever;
    now 250 then 50."""
    with FeedFarm(feeds=30, items=10) as farm:
        for n, url in enumerate(farm.feed_urls()):
            await add_source(db, url=url, name=f"Feed {n}", shard="s", now=NOW)
        reports = []
        started = time.perf_counter()
        for _ in range(3):
            reports.append(await _run(db, clock, fresh_db_url, http))
            if len(await _written(db)) == 300:
                break
        elapsed = time.perf_counter() - started

    assert sorted(await _written(db)) == sorted(farm.article_urls())
    assert [r["processedCount"] for r in reports] == [250, 50]
    assert reports[0]["queuedCount"] == 300 and reports[0]["deferredCount"] == 50
    assert reports[0]["deferredReasons"] == [
        "backlog over the queue limit: processing 250 of 300 "
        "(INGESTION_BACKPRESSURE_QUEUE_LIMIT 250)"
    ]
    assert reports[0]["reviewer"] == "offline rules" and reports[0]["aiReviewedCount"] == 250
    assert await db.fetch("SELECT 1 FROM news.candidates") == []
    assert elapsed < 60, elapsed


async def test_max_ai_reviews_counts_model_reviews_and_not_the_offline_rules_verdicts(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """MAX_AI_REVIEWS=5 and 12 queued: the offline rules judge all 12 in one run (they cost
    nothing); a model reviews 5, and the 7 others wait for the next run."""
    site(
        feed_server,
        {"/feeds/a": rss(feed_server.url, 12), "/feeds/b": rss(feed_server.url, 12, prefix="b")},
    )
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    offline = await _run(db, clock, fresh_db_url, http, MAX_AI_REVIEWS="5")
    assert offline["reviewer"] == "offline rules"
    assert offline["processedCount"] == 12 and offline["aiReviewedCount"] == 12
    assert offline["deferredCount"] == 0 and offline["deferredReasons"] == []

    await db.execute("UPDATE news.sources SET enabled = false")
    await add_source(db, url=feed_server.url + "/feeds/b", name="B", shard="s", now=NOW)
    model = RulesModel()
    first = await _run(db, clock, fresh_db_url, http, reviewer=model, MAX_AI_REVIEWS="5")
    assert first["reviewer"] == "model"
    assert first["processedCount"] == 5 and first["aiReviewedCount"] == 5
    assert first["deferredCount"] == 7 and first["deferredReasons"] == ["MAX_AI_REVIEWS 5 reached"]
    assert sum(model.reviews.values()) == 5
    second = await _run(db, clock, fresh_db_url, http, reviewer=model, MAX_AI_REVIEWS="5")
    third = await _run(db, clock, fresh_db_url, http, reviewer=model, MAX_AI_REVIEWS="5")
    assert [second["processedCount"], third["processedCount"]] == [5, 2]
    assert len(model.reviews) == 12 and max(model.reviews.values()) == 1
    assert len(await _written(db)) == 24
