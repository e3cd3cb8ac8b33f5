"""Deferred means later, not never: what a run does not write waits in
``news.candidates`` and comes back first, although the feed answers 304 from then on."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.adapters.locks import PostgresLeases
from nightcrew.adapters.reviewer import OfflineReviewer, ReviewError
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.news.steps.review import REVIEW_FAILED_FOR_NOW
from tests.conftest import NOW
from tests.integration.news.model_reviewer import RulesModel
from tests.integration.news.test_run import deps_for, page_requests, rss, runtime_for, site
from tests.support.servers import RecordingServer


def etag_site(server: RecordingServer, feeds: dict[str, bytes]) -> list[int]:
    return site(server, feeds, etag=True)


async def _articles(db: Database) -> set[str]:
    return {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}


async def test_a_100_item_feed_with_a_model_and_max_ai_reviews_25_is_written_in_four_runs(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """MAX_AI_REVIEWS bounds model reviews (the offline rules spend none: see
    test_backpressure_drains.py), over feeds that answer 304 from the second run on."""
    statuses = etag_site(feed_server, {"/feeds/big": rss(feed_server.url, 100)})
    await add_source(db, url=feed_server.url + "/feeds/big", name="Big", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url, MAX_AI_REVIEWS="25")
    model = RulesModel()
    reports = []
    for _ in range(4):
        reports.append(
            (
                await run_shard(
                    replace(runtime, news=deps_for(db, clock, http, reviewer=model)), clock, "s"
                )
            ).to_json()
        )
        clock.advance(timedelta(hours=1))

    assert statuses == [200, 304, 304, 304]
    assert [r["queuedCount"] for r in reports] == [100, 75, 50, 25]
    assert [r["processedCount"] for r in reports] == [25, 25, 25, 25]
    assert [r["deferredCount"] for r in reports] == [75, 50, 25, 0]
    assert reports[0]["deferredReasons"] == ["MAX_AI_REVIEWS 25 reached"]
    assert len(await _articles(db)) == 100
    assert len(model.reviews) == 100 and max(model.reviews.values()) == 1
    assert await db.fetch("SELECT 1 FROM news.candidates") == []
    # oldest first: the first run's 25 are stories 0-24, in feed order
    first = await db.fetch("SELECT url FROM news.articles ORDER BY id LIMIT 25")
    assert [r["url"].rsplit("-", 1)[1] for r in first] == [str(n) for n in range(25)]


async def test_a_backpressure_deferred_batch_is_written_once_pressure_drops(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    statuses = etag_site(feed_server, {"/feeds/a": rss(feed_server.url, 8)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    pressured = await runtime_for(db, clock, fresh_db_url, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5")
    first = (
        await run_shard(replace(pressured, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    # over the queue limit: a batch of the limit's worth, oldest first; the rest wait
    assert first["deferredCount"] == 3 and first["processedCount"] == 5
    assert first["deferredReasons"] == [
        "backlog over the queue limit: processing 5 of 8 (INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"
    ]
    assert len(await _articles(db)) == 5
    held = await db.fetch("SELECT reason FROM news.candidates WHERE state = 'held'")
    assert len(held) == 3
    assert all(
        r["reason"].startswith("backlog over the queue limit: processing 5 of 8") for r in held
    )

    clock.advance(timedelta(hours=1))
    calm = await runtime_for(db, clock, fresh_db_url)
    second = (await run_shard(replace(calm, news=deps_for(db, clock, http)), clock, "s")).to_json()
    assert statuses == [200, 304]
    assert second["queuedCount"] == 3 and second["processedCount"] == 3
    assert second["deferredCount"] == 0 and len(await _articles(db)) == 8


async def test_a_lock_skip_report_is_saved_with_what_waits(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    etag_site(feed_server, {"/feeds/a": rss(feed_server.url, 4)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url, INGESTION_BACKPRESSURE_QUEUE_LIMIT="1")
    await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")  # 1; 3 wait
    holder = await PostgresLeases(db, clock).acquire(shard_lock_name("s"), 600)
    assert holder is not None
    skipped = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert skipped["skipped"] is True and skipped["lockedCount"] == 1
    assert skipped["deferredCount"] == 3
    saved = await db.fetch("SELECT report FROM news.worker_reports ORDER BY id")
    assert len(saved) == 2 and saved[1]["report"]["deferredCount"] == 3


async def test_retried_count_is_known_before_the_backpressure_stop(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    etag_site(feed_server, {"/feeds/a": rss(feed_server.url, 3)})
    source = await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    await db.execute(
        "INSERT INTO news.articles (url, source_id, shard, title, summary, status, fence,"
        " created_at) VALUES ('https://old.example/x', %(s)s, 's', 'old', 'old', 'accepted', 1,"
        " %(t)s)",
        {"s": source.id, "t": NOW - timedelta(hours=7)},
    )
    # the article limit stops the run (the queue limit no longer does: it bounds the batch)
    runtime = await runtime_for(
        db, clock, fresh_db_url, INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT="1"
    )
    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert report["deferredCount"] == 3 and report["retriedCount"] == 1
    assert report["processedCount"] == 0
    assert [r.path for r in feed_server.requests] == ["/feeds/a"]  # no page fetched


class FlakyReviewer(OfflineReviewer):
    """The model is down (transiently) for the first ``failures`` reviews."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def review(self, article: Any, scope: Any = None) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise ReviewError("the model answered 503", transient=True)
        return await super().review(article)


async def test_a_transient_review_failure_is_held_and_reviewed_next_run_despite_304(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    statuses = etag_site(feed_server, {"/feeds/a": rss(feed_server.url, 3)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    first = (
        await run_shard(
            replace(runtime, news=deps_for(db, clock, http, reviewer=FlakyReviewer(2))), clock, "s"
        )
    ).to_json()
    assert first["processedCount"] == 1 and first["deferredCount"] == 2
    assert "2 reviews failed for now; retried next run" in first["deferredReasons"]
    held = await db.fetch("SELECT reason, attempts FROM news.candidates")
    assert [(r["reason"], r["attempts"]) for r in held] == [(REVIEW_FAILED_FOR_NOW, 1)] * 2
    clock.advance(timedelta(hours=1))
    second = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert statuses == [200, 304]
    assert second["processedCount"] == 2 and len(await _articles(db)) == 3


async def test_one_article_the_database_refuses_is_rejected_alone(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """The batch write fails on one row; the run falls back to one transaction per article,
    writes the rest, rejects that one with the database's reason, and never retries it."""
    base = feed_server.url
    etag_site(feed_server, {"/feeds/a": rss(base, 4), "/feeds/b": rss(base, 2, prefix="b")})
    await add_source(db, url=base + "/feeds/a", name="A", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/b", name="B", shard="s", now=NOW)
    await db.execute(
        "ALTER TABLE news.articles ADD CONSTRAINT test_no_story_2 CHECK (url NOT LIKE '%%/story-2')"
    )
    runtime = await runtime_for(db, clock, fresh_db_url)
    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert report["processedCount"] == 5
    assert [e["url"] for e in report["writeErrors"]] == [f"{base}/articles/story-2"]
    assert "test_no_story_2" in report["writeErrors"][0]["error"]
    assert await _articles(db) == {f"{base}/articles/story-{n}" for n in (0, 1, 3)} | {
        f"{base}/articles/b-0",
        f"{base}/articles/b-1",
    }
    rejected = await db.fetch("SELECT url, state FROM news.candidates")
    assert [(r["url"], r["state"]) for r in rejected] == [(f"{base}/articles/story-2", "rejected")]
    clock.advance(timedelta(hours=1))
    again = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert again["queuedCount"] == 0 and again["writeErrors"] == []


@pytest.mark.parametrize(("queued", "deferred"), [(4, False), (5, False), (6, True)])
async def test_the_queue_limit_defers_only_above_it(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    queued: int,
    deferred: bool,
) -> None:
    """INGESTION_BACKPRESSURE_QUEUE_LIMIT=5: 4 and 5 queued run whole; 6 is over it (spec:
    "more than"), and the run works a batch of 5, oldest first, the sixth deferred."""
    etag_site(feed_server, {"/feeds/a": rss(feed_server.url, queued)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5")
    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert report["queuedCount"] == queued
    assert bool(report["deferredReasons"]) is deferred
    assert report["processedCount"] == min(queued, 5)
    assert report["deferredCount"] == queued - min(queued, 5)
    assert len(page_requests(feed_server)) == min(queued, 5)


class _StuckReviewer(OfflineReviewer):
    """Reviews the first article, then never answers again: the run is stopped mid-review."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.stuck = asyncio.Event()

    async def review(self, article: Any, scope: Any = None) -> Any:
        self.calls += 1
        if self.calls > 1:
            self.stuck.set()
            await asyncio.Event().wait()
        return await super().review(article)


async def test_a_run_stopped_before_its_writes_saves_no_fetch_state_and_the_next_fetches_again(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """A run keeps the new items it writes itself in memory, not as rows: stopped between
    its fetch and its writes it leaves neither rows nor the feeds' ETag and body hash, so the
    next run fetches them again (200, not 304) and writes every item."""
    statuses = etag_site(feed_server, {"/feeds/a": rss(feed_server.url, 4)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    reviewer = _StuckReviewer()
    run = asyncio.create_task(
        run_shard(replace(runtime, news=deps_for(db, clock, http, reviewer=reviewer)), clock, "s")
    )
    await asyncio.wait_for(reviewer.stuck.wait(), 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run

    assert await db.fetch("SELECT url FROM news.candidates") == []
    assert await _articles(db) == set()
    [source] = await db.fetch("SELECT etag, body_hash, next_check_at FROM news.sources")
    assert (source["etag"], source["body_hash"], source["next_check_at"]) == (None, None, None)

    again = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert statuses == [200, 200]
    assert again["processedCount"] == 4 and len(await _articles(db)) == 4
    [source] = await db.fetch("SELECT etag, body_hash FROM news.sources")
    assert source["etag"] is not None and source["body_hash"] is not None


async def test_a_new_item_that_became_a_row_meanwhile_is_in_the_batch_once(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run looks its new URLs up (``candidates.known``) before it reads the shard's held
    rows; a holder whose lease ran out may store one of them as a row in between. Simulated
    by a look-up that finds nothing: the URL held by the first run (over the queue limit) is
    also new to the second. It is reviewed and written once, with one review."""
    base = feed_server.url
    served = {"/feeds/a": rss(base, 3)}
    site(feed_server, served)
    await add_source(db, url=base + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url, INGESTION_BACKPRESSURE_QUEUE_LIMIT="2")
    first = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert first["processedCount"] == 2 and first["deferredCount"] == 1
    [held] = await db.fetch("SELECT url FROM news.candidates WHERE state = 'held'")

    async def finds_nothing(db: Database, urls: list[str]) -> set[str]:
        return set()

    monkeypatch.setattr("nightcrew.news.steps.candidates.known", finds_nothing)
    served["/feeds/a"] = rss(base, 3) + b" "  # a new body: read again, its items looked up
    clock.advance(timedelta(hours=1))
    second = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    assert second["processedCount"] == 1 and second["aiReviewedCount"] == 1, second
    reviews = await db.fetch(
        "SELECT a.url FROM news.reviews r JOIN news.articles a ON a.id = r.article_id"
    )
    assert sorted(r["url"] for r in reviews) == sorted(
        f"{base}/articles/story-{n}" for n in range(3)
    )
    assert held["url"] in {r["url"] for r in reviews}
    assert await db.fetch("SELECT url FROM news.candidates") == []
