"""A news run against real PostgreSQL (and the test Redis when it answers), feeds and article pages
on a loopback server: the order, de-duplication, backpressure, locks and fencing."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace
from typing import Any

import httpx
import pytest
from werkzeug import Request, Response

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.adapters.locks import PostgresLeases
from nightcrew.adapters.news import NewsAdapters, news_adapters
from nightcrew.adapters.reviewer import OfflineReviewer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.report import SUPERSEDED_REASON
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.runtime import Runtime
from tests.conftest import NOW, make_runtime, parsers_for_test
from tests.integration.news.conftest import LOOPBACK
from tests.support.servers import RecordingServer
from tests.support.services import REDIS_URL, needs_redis


def rss(base: str, count: int, prefix: str = "story") -> bytes:
    items = "".join(
        f"<item><title>{prefix} number {n} about the council</title>"
        f"<link>{base}/articles/{prefix}-{n}</link>"
        f"<description>A long enough description of event {n} for the rules.</description>"
        "</item>"
        for n in range(count)
    )
    return (
        f'<?xml version="1.0"?><rss version="2.0"><channel><title>T</title>{items}'
        "</channel></rss>".encode()
    )


def article_page() -> Response:
    """Every article's page: an og:image on the same (loopback, allowed) server."""
    return Response(
        '<html><head><meta property="og:image" content="/img/1.jpg"></head></html>',
        content_type="text/html",
    )


def site(
    server: RecordingServer, feeds: dict[str, bytes], *, slow: float = 0.0, etag: bool = False
) -> list[int]:
    """Feeds under /feeds/ and article pages under /articles/. With ``etag``, each feed has an
    ETag and a request that sends it back gets 304. Returns the feed statuses sent."""
    statuses: list[int] = []

    def respond(request: Request) -> Response:
        if request.path in feeds:
            if slow:
                import time

                time.sleep(slow)
            tag = f'"v1-{len(feeds[request.path])}"'
            if etag and request.headers.get("If-None-Match") == tag:
                statuses.append(304)
                return Response(status=304)
            statuses.append(200)
            headers = {"ETag": tag} if etag else {}
            return Response(
                feeds[request.path], content_type="application/rss+xml", headers=headers
            )
        if request.path.startswith("/articles/"):
            return article_page()
        return Response(status=404)

    server.responder = respond
    return statuses


def deps_for(db: Database, clock: FrozenClock, http: UntrustedHttp, **kw: Any) -> NewsAdapters:
    """The news adapters a test runtime gets (``replace(runtime, news=...)``): PostgreSQL
    leases, the offline reviewer and the loopback policy unless a test says otherwise;
    ``redis=`` a client assembles them as production does with Redis (PostgreSQL's leases
    copied to Redis, Redis's processed-URL set); ``leases=`` replaces the leases. Feeds are
    parsed in the test's parser pool, stopped when the test ends."""
    leases = kw.pop("leases", None)
    deps = news_adapters(
        db,
        clock,
        http=http,
        parsers=kw.pop("parsers", None) or parsers_for_test(),
        reviewer=kw.pop("reviewer", OfflineReviewer()),
        policy=kw.pop("policy", LOOPBACK),
        redis=kw.pop("redis", None),
        **kw,
    )
    return replace(deps, leases=leases) if leases is not None else deps


async def runtime_for(db: Database, clock: FrozenClock, url: str, **env: str) -> Runtime:
    return await make_runtime(db, clock, url, env=env, store=open_store("memory://"))


def page_requests(server: RecordingServer) -> list[str]:
    return [r.path for r in server.requests if r.path.startswith("/articles/")]


async def test_a_run_processes_once_and_the_next_run_does_nothing_per_item(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    site(feed_server, {"/feeds/a": rss(feed_server.url, 5)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    report = await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1")
    r = report.to_json()
    assert r["queuedCount"] == 5 and r["processedCount"] == 5
    assert r["aiReviewedCount"] == 5 and r["acceptedCount"] == 5 and r["lockedCount"] == 0
    assert r["reviewer"] == "offline rules"  # the count is of rule verdicts: no model ran
    assert r["queuedBySource"] == {"A (s1)": 5} and r["redisEnabled"] is False
    assert len(page_requests(feed_server)) == 5  # one hydration per article
    rows = await db.fetch("SELECT image_url, status, fence FROM news.articles")
    assert {row["status"] for row in rows} == {"accepted"}
    assert {row["image_url"] for row in rows} == {feed_server.url + "/img/1.jpg"}
    snapshot = json.loads(await runtime.store.get("news/snapshots/s1.json") or b"{}")
    assert len(snapshot["articles"]) == 5
    saved = await db.fetch("SELECT report FROM news.worker_reports")
    assert saved[0]["report"]["processedCount"] == 5
    # the review locks went with their rows: only the shard's lease is left
    leases = await db.fetch("SELECT name FROM nightcrew.leases")
    assert [r["name"] for r in leases] == [shard_lock_name("s1")]

    feed_server.reset()
    site(feed_server, {"/feeds/a": rss(feed_server.url, 5)})
    clock.advance(__import__("datetime").timedelta(hours=1))
    again = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1")
    ).to_json()
    assert again["queuedCount"] == 0 and again["processedCount"] == 0
    assert page_requests(feed_server) == []  # no per-item work beyond the bulk de-dupe


async def test_251_queued_works_the_limits_worth_oldest_first_and_defers_the_rest(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """Over the queue limit (250) the run no longer defers everything (that never
    drains): it works a batch of the limit's worth, oldest first, and defers the rest."""
    site(feed_server, {"/feeds/big": rss(feed_server.url, 251)})
    await add_source(db, url=feed_server.url + "/feeds/big", name="Big", shard="s1", now=NOW)
    report = (
        await run_shard(
            replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
            clock,
            "s1",
        )
    ).to_json()
    assert report["queuedCount"] == 251 and report["deferredCount"] == 1
    assert report["deferredReasons"] == [
        "backlog over the queue limit: processing 250 of 251 "
        "(INGESTION_BACKPRESSURE_QUEUE_LIMIT 250)"
    ]
    assert report["processedCount"] == 250 and report["aiReviewedCount"] == 250
    assert len(page_requests(feed_server)) == 250  # one image fetch per article of the batch
    held = await db.fetch("SELECT url FROM news.candidates WHERE state = 'held'")
    assert [r["url"] for r in held] == [f"{feed_server.url}/articles/story-250"]  # the newest
    assert (await db.fetch("SELECT report FROM news.worker_reports"))[0]["report"][
        "deferredReasons"
    ]


async def test_the_database_limit_defers_too(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    runtime = await runtime_for(
        db, clock, fresh_db_url, INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT="0"
    )
    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1")
    ).to_json()
    assert report["backpressureDbArticleCount"] == 0
    assert report["deferredReasons"] == [
        "database limit: 0 articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT 0"
    ]
    assert page_requests(feed_server) == []


async def test_a_held_shard_lock_answers_locked_and_does_nothing(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    site(feed_server, {"/feeds/a": rss(feed_server.url, 3)}, slow=0.5)
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    other_db = await Database.open(fresh_db_url)
    try:
        reports = await asyncio.gather(
            run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1"),
            run_shard(
                replace(
                    await runtime_for(other_db, clock, fresh_db_url),
                    news=deps_for(other_db, clock, http),
                ),
                clock,
                "s1",
            ),
        )
    finally:
        await other_db.close()
    locked = [r for r in reports if r.skipped]
    done = [r for r in reports if not r.skipped]
    assert len(locked) == 1 and len(done) == 1
    assert locked[0].locked_count == 1 and locked[0].processed_count == 0
    assert done[0].processed_count == 3


class FenceBumpingReviewer(OfflineReviewer):
    """While this run reviews, a newer holder of the shard writes with a higher fence."""

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.db = db

    async def review(self, article: Any, scope: Any = None) -> Any:
        await self.db.execute(
            "INSERT INTO news.shard_fences VALUES ('s1', 1000)"
            " ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence"
        )
        return await super().review(article)


async def test_a_late_holder_is_refused_by_the_fence(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    # an earlier holder's fence (7) is below this run's: its lease draws a fence above it
    await db.execute("INSERT INTO news.shard_fences VALUES ('s1', 7)")
    reviewer = FenceBumpingReviewer(db)
    report = await run_shard(
        replace(
            await runtime_for(db, clock, fresh_db_url),
            news=deps_for(db, clock, http, reviewer=reviewer),
        ),
        clock,
        "s1",
    )
    # fenced out: superseded (reported and saved), not a failure
    assert report.status == "superseded" and report.processed_count == 0
    assert report.deferred_count == 2 and report.deferred_reasons[-1] == SUPERSEDED_REASON
    saved = await db.fetch("SELECT report FROM news.worker_reports")
    assert [r["report"]["status"] for r in saved] == ["superseded"]
    assert await db.fetch("SELECT 1 FROM news.articles") == []
    # nothing lost: both candidates still wait for the holder that may write
    held = await db.fetch("SELECT url FROM news.candidates WHERE state = 'held'")
    assert len(held) == 2
    # and the late holder's lease was released on the way out
    released = await db.fetch_one(
        "SELECT token FROM nightcrew.leases WHERE name = %(n)s", {"n": shard_lock_name("s1")}
    )
    assert released is not None and released["token"] == ""
    assert await PostgresLeases(db, clock).acquire(shard_lock_name("s1"), 60) is not None


async def test_a_lease_drawn_after_another_backend_wrote_is_above_its_fence(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """Redis wrote fence 57; Redis is down now and the PostgreSQL lease counter is at 1: the run
    still writes, because a lease draws its fence above the newest one written."""
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    await db.execute("INSERT INTO news.shard_fences VALUES ('s1', 57)")
    report = await run_shard(
        replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
        clock,
        "s1",
    )
    assert report.processed_count == 2
    fences = await db.fetch("SELECT DISTINCT fence FROM news.articles")
    assert [r["fence"] for r in fences] == [58]


async def test_redis_down_mid_run_falls_back_and_nothing_is_processed_twice(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    import redis.asyncio as aioredis

    site(feed_server, {"/feeds/a": rss(feed_server.url, 3)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    dead = aioredis.from_url(f"redis://127.0.0.1:{dead_port}/0", socket_connect_timeout=0.5)
    runtime = await runtime_for(db, clock, fresh_db_url)
    try:
        first = (
            await run_shard(
                replace(runtime, news=deps_for(db, clock, http, redis=dead)), clock, "s1"
            )
        ).to_json()
    finally:
        await dead.aclose()
    assert first["redisEnabled"] is False and first["processedCount"] == 3
    clock.advance(__import__("datetime").timedelta(hours=1))
    second = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1")
    ).to_json()
    assert second["processedCount"] == 0 and second["queuedCount"] == 0


@needs_redis
async def test_with_real_redis_the_processed_set_and_locks_are_used(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    import uuid

    import redis.asyncio as aioredis

    from nightcrew.adapters.processed import PROCESSED_SET

    client = aioredis.from_url(REDIS_URL)
    shard = f"r-{uuid.uuid4().hex[:6]}"
    site(feed_server, {"/feeds/r": rss(feed_server.url, 2, prefix=shard)})
    await add_source(db, url=feed_server.url + "/feeds/r", name="R", shard=shard, now=NOW)
    try:
        other = deps_for(db, clock, http, redis=client).leases  # another process's
        held = await other.acquire(shard_lock_name(shard), 30)
        assert held is not None
        assert await client.get(shard_lock_name(shard)) == held.token.encode()  # the copy
        locked = await run_shard(
            replace(
                await runtime_for(db, clock, fresh_db_url),
                news=deps_for(db, clock, http, redis=client),
            ),
            clock,
            shard,
        )
        assert locked.skipped and locked.locked_count == 1 and locked.redis_enabled
        await other.release(held)
        done = await run_shard(
            replace(
                await runtime_for(db, clock, fresh_db_url),
                news=deps_for(db, clock, http, redis=client),
            ),
            clock,
            shard,
        )
        assert done.processed_count == 2
        urls = [r["url"] for r in await db.fetch("SELECT url FROM news.articles")]
        assert all(await client.smismember(PROCESSED_SET, urls))
        await client.srem(PROCESSED_SET, *urls)
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("body", "event_name"),
    [
        ("BEGIN RAISE EXCEPTION 'count endpoint down'; END", "worker.backpressure.db_count_failed"),
        ("BEGIN RETURN NULL; END", "worker.backpressure.db_count_parse_failed"),
    ],
)
async def test_a_failing_article_count_is_reported_and_the_run_goes_on(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    body: str,
    event_name: str,
) -> None:
    from structlog.testing import capture_logs

    await db.execute(
        "CREATE OR REPLACE FUNCTION news.article_count() RETURNS bigint"
        f" LANGUAGE plpgsql AS $$ {body} $$"
    )
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    with capture_logs() as logs:
        report = (
            await run_shard(
                replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
                clock,
                "s1",
            )
        ).to_json()
    assert report["backpressureDbArticleCount"] is None
    assert report["backpressureDbArticleCountError"]
    assert report["processedCount"] == 2  # the run continued
    assert event_name in [e["event"] for e in logs]


class ClockJumpingReviewer(OfflineReviewer):
    """Takes so long on its first article that the shard lease runs out, and another run
    takes the shard over and writes first."""

    def __init__(self, db: Database, clock: FrozenClock, ttl: int) -> None:
        super().__init__()
        self.db, self.clock, self.ttl = db, clock, ttl
        self.seen_expiry: Any = None
        self.jumped = False

    async def review(self, article: Any, scope: Any = None) -> Any:
        if not self.jumped:
            self.jumped = True
            row = await self.db.fetch_one(
                "SELECT expires_at FROM nightcrew.leases WHERE name = %(n)s",
                {"n": shard_lock_name("s1")},
            )
            self.seen_expiry = row["expires_at"] if row else None
            self.clock.advance(__import__("datetime").timedelta(seconds=self.ttl + 1))
            taker = await PostgresLeases(self.db, self.clock).acquire(shard_lock_name("s1"), 60)
            assert taker is not None
            await self.db.execute(
                "INSERT INTO news.shard_fences VALUES ('s1', %(f)s)"
                " ON CONFLICT (shard) DO UPDATE SET fence = excluded.fence",
                {"f": taker.fence},
            )
        return await super().review(article)


async def test_a_lease_that_expires_mid_run_is_extended_first_then_fenced_out_keeping_its_reviews(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url, UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS="30")
    reviewer = ClockJumpingReviewer(db, clock, 30)
    report = await run_shard(
        replace(runtime, news=deps_for(db, clock, http, reviewer=reviewer)), clock, "s1"
    )
    assert report.status == "superseded" and report.processed_count == 0
    # the lease had been extended (TTL replaced from "now") before the expensive steps
    assert reviewer.seen_expiry == NOW + __import__("datetime").timedelta(seconds=30)
    assert await db.fetch("SELECT 1 FROM news.articles") == []  # the late holder wrote nothing
    # ... and kept the two reviews it paid for on the held candidates, ready to write: once the
    # taker's lease (60 s) runs out, the next run writes both and asks the model nothing
    assert report.ai_reviewed_count == 2
    kept = await db.fetch(
        "SELECT url, stage, verdict->>'reviewer' AS reviewer FROM news.candidates ORDER BY url"
    )
    assert len(kept) == 2 and {r["stage"] for r in kept} == {"write"}
    clock.advance(__import__("datetime").timedelta(seconds=61))
    second = CountingReviewer()
    again = await run_shard(
        replace(runtime, news=deps_for(db, clock, http, reviewer=second)), clock, "s1"
    )
    assert again.status == "completed" and again.processed_count == 2
    assert second.asked == [] and again.ai_reviewed_count == 0
    reviews = await db.fetch(
        "SELECT a.url, r.reviewer FROM news.reviews r JOIN news.articles a ON a.id = r.article_id"
        " ORDER BY a.url"
    )
    assert [(r["url"], r["reviewer"]) for r in reviews] == [(k["url"], k["reviewer"]) for k in kept]


class CountingReviewer(OfflineReviewer):
    """The offline rules, counting what it was asked (a model's calls, as far as cost goes)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def review(self, article: Any, scope: Any = None) -> Any:
        self.asked.append(article.url)
        return await super().review(article)


async def test_scheduled_shard_slots_run_once_across_replicas_and_reports_are_served(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    from nightcrew.http import ServiceParts, create_app
    from nightcrew.metrics import Metrics
    from nightcrew.news.report import latest_reports
    from nightcrew.news.schedule import news_schedules
    from nightcrew.scheduler import Scheduler

    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    other_db = await Database.open(fresh_db_url)
    try:
        fired = []
        for database in (db, other_db):
            runtime = await runtime_for(
                database, clock, fresh_db_url, NEWS_SHARDS="s1", NEWS_RUN_INTERVAL_MINUTES="5"
            )
            [schedule] = news_schedules(
                replace(runtime, news=deps_for(database, clock, http)), clock
            )
            assert schedule.cron == "*/5 * * * *"
            fired.append(await Scheduler(runtime, clock, (schedule,)).fire(schedule.name, NOW))
    finally:
        await other_db.close()
    assert sorted(fired) == [False, True]
    rows = await db.fetch("SELECT lane, status FROM nightcrew.runs")
    assert rows == [{"lane": "news:s1", "status": "completed"}]

    async def reports() -> list[dict[str, Any]]:
        return await latest_reports(db)

    transport = httpx.ASGITransport(app=create_app(Metrics(), ServiceParts(news_reports=reports)))
    async with httpx.AsyncClient(transport=transport, base_url="http://nc") as client:
        body = (await client.get("/news/reports")).json()
    [latest] = body["reports"]
    assert latest["shard"] == "s1" and latest["report"]["processedCount"] == 2


async def test_a_model_reviews_translates_and_the_backlog_is_caught_up(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    stripe_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    from tests.support.standins import chat_reviewer

    llm = stripe_server  # a second loopback recorder plays the model

    def model(request: Request) -> tuple[int, dict[str, Any]]:
        system = request.get_json()["messages"][0]["content"]
        content = (
            "Übersetzt."
            if system.startswith("Translate")
            else ('{"accept": true, "reason": "news", "summary": "A short summary."}')
        )
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}

    llm.responder = model
    site(feed_server, {"/feeds/a": rss(feed_server.url, 2)})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)
    reviewer = chat_reviewer(llm.url, model="m")
    try:
        runtime = await runtime_for(db, clock, fresh_db_url)
        report = (
            await run_shard(
                replace(runtime, news=deps_for(db, clock, http, reviewer=reviewer)), clock, "s1"
            )
        ).to_json()
        assert report["acceptedCount"] == 2
        rows = await db.fetch("SELECT summary, translation FROM news.reviews")
        assert [(r["summary"], r["translation"]) for r in rows] == [
            ("A short summary.", "Übersetzt.")
        ] * 2

        # a translation that failed earlier is caught up by the next run, under the same lease
        await db.execute("UPDATE news.reviews SET translation = NULL")
        clock.advance(__import__("datetime").timedelta(hours=1))
        again = (
            await run_shard(
                replace(runtime, news=deps_for(db, clock, http, reviewer=reviewer)), clock, "s1"
            )
        ).to_json()
        assert again["processedCount"] == 0 and again["translatedCount"] == 2
        rows = await db.fetch("SELECT translation FROM news.reviews")
        assert {r["translation"] for r in rows} == {"Übersetzt."}
    finally:
        await reviewer.aclose()


@needs_redis
async def test_two_runs_started_together_on_redis_one_processes_one_is_locked(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    import uuid

    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    shard = f"t-{uuid.uuid4().hex[:6]}"
    site(feed_server, {"/feeds/t": rss(feed_server.url, 3, prefix=shard)}, slow=0.5)
    await add_source(db, url=feed_server.url + "/feeds/t", name="T", shard=shard, now=NOW)
    try:
        runtimes = [
            replace(
                await runtime_for(db, clock, fresh_db_url),
                news=deps_for(db, clock, http, redis=client),
            )
            for _ in range(2)
        ]
        reports = await asyncio.gather(*(run_shard(rt, clock, shard) for rt in runtimes))
        assert sorted(r.locked_count for r in reports) == [0, 1]
        assert sorted(r.processed_count for r in reports) == [0, 3]
        urls = [r["url"] for r in await db.fetch("SELECT url FROM news.articles")]
        await client.srem("news:processed", *urls)
    finally:
        await client.aclose()


async def test_a_malformed_link_is_skipped_and_a_transient_review_failure_retried(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    from nightcrew.adapters.reviewer import ReviewError

    body = rss(feed_server.url, 2).replace(
        b"</channel>",
        b"<item><title>Broken link that should be skipped entirely</title>"
        b"<link>http://example.com:99999/x</link></item></channel>",
    )
    site(feed_server, {"/feeds/a": body})
    await add_source(db, url=feed_server.url + "/feeds/a", name="A", shard="s1", now=NOW)

    class Flaky(OfflineReviewer):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        async def review(self, article: Any, scope: Any = None) -> Any:
            self.calls += 1
            if self.calls == 1:
                raise ReviewError("the model answered 503", transient=True)
            return await super().review(article)

    runtime = await runtime_for(db, clock, fresh_db_url)
    first = (
        await run_shard(
            replace(runtime, news=deps_for(db, clock, http, reviewer=Flaky())), clock, "s1"
        )
    ).to_json()
    assert first["queuedCount"] == 2  # the malformed link never became a candidate
    assert first["processedCount"] == 1  # the 503 one is left for the next run
    clock.advance(__import__("datetime").timedelta(hours=1))
    second = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s1")
    ).to_json()
    assert second["queuedCount"] == 1 and second["processedCount"] == 1
    assert await db.fetch_one("SELECT count(*) AS n FROM news.articles") == {"n": 2}
