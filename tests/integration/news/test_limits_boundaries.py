"""The inline news run's limits one below, at and one above their boundary: a `>`
turned into `>=` (or back) must fail a test here. The queue limit's boundaries are in
test_deferral.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.sources.registry import add_source
from tests.conftest import NOW
from tests.integration.news.model_reviewer import RulesModel
from tests.integration.news.test_run import deps_for, page_requests, rss, runtime_for, site
from tests.support.servers import RecordingServer

MAX_AI_REVIEWS = 3
DB_ARTICLE_LIMIT = 3


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
    return (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()


@pytest.mark.parametrize("queued", [MAX_AI_REVIEWS - 1, MAX_AI_REVIEWS, MAX_AI_REVIEWS + 1])
async def test_max_ai_reviews_defers_only_what_is_above_it(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    queued: int,
) -> None:
    """MAX_AI_REVIEWS=3 with a model (the offline rules spend none of it): 2 and 3 queued are
    all reviewed; of 4, 3 are and 1 waits."""
    site(feed_server, {"/feeds/a": rss(feed_server.url, queued)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    model = RulesModel()
    report = await _run(
        db, clock, fresh_db_url, http, reviewer=model, MAX_AI_REVIEWS=str(MAX_AI_REVIEWS)
    )
    assert sum(model.reviews.values()) == min(queued, MAX_AI_REVIEWS)
    over = queued > MAX_AI_REVIEWS
    assert report["queuedCount"] == queued
    assert report["processedCount"] == min(queued, MAX_AI_REVIEWS)
    assert report["aiReviewedCount"] == min(queued, MAX_AI_REVIEWS)
    assert report["deferredCount"] == queued - min(queued, MAX_AI_REVIEWS)
    assert report["deferredReasons"] == (
        [f"MAX_AI_REVIEWS {MAX_AI_REVIEWS} reached"] if over else []
    )
    held = await db.fetch("SELECT reason FROM news.candidates WHERE state = 'held'")
    assert [r["reason"] for r in held] == [f"MAX_AI_REVIEWS {MAX_AI_REVIEWS} reached"] * (
        queued - min(queued, MAX_AI_REVIEWS)
    )


@pytest.mark.parametrize("stored", [DB_ARTICLE_LIMIT - 1, DB_ARTICLE_LIMIT, DB_ARTICLE_LIMIT + 1])
async def test_the_database_article_limit_defers_at_and_above_it(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    stored: int,
) -> None:
    """INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT=3: with 2 articles stored the run goes on; with
    3 or 4 it defers everything before any page is fetched (spec: "at or above")."""
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    # Another shard's rejected articles: counted by the limit, never retried for a thumbnail.
    await db.execute(
        "INSERT INTO news.articles (url, shard, title, status, fence, created_at)"
        " SELECT 'https://stored.example/' || n, 'elsewhere', 'stored', 'rejected', 1, %(t)s"
        " FROM generate_series(1, %(n)s) AS n",
        {"n": stored, "t": NOW},
    )
    report = await _run(
        db,
        clock,
        fresh_db_url,
        http,
        INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT=str(DB_ARTICLE_LIMIT),
    )
    deferred = stored >= DB_ARTICLE_LIMIT
    assert report["backpressureDbArticleCount"] == stored
    assert report["queuedCount"] == 2
    assert report["deferredReasons"] == (
        [
            f"database limit: {stored} articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT "
            f"{DB_ARTICLE_LIMIT}"
        ]
        if deferred
        else []
    )
    assert report["processedCount"] == (0 if deferred else 2)
    assert report["deferredCount"] == (2 if deferred else 0)
    assert len(page_requests(feed_server)) == (0 if deferred else 2)  # no image fetch
