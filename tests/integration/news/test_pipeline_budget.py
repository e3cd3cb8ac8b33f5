"""Spec 001's cost bound and backpressure in the pipeline engine, on a real RabbitMQ: a pass
admits at most MAX_AI_REVIEWS model reviews (the rest kept for later passes — no worker's
housekeeping admits them), backpressure counted per shard (a busy shard never holds another's
work), a new shard of 300 drained with the default limits, and the translation backlog retried
by later passes under the shard lock."""

from __future__ import annotations

import json
import time
from pathlib import Path

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.message_outbox import resend_due
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.runtime import Runtime
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


async def _written(db: Database, shard: str = "s") -> int:
    return await count(db, "SELECT count(*) FROM news.articles WHERE shard = %(s)s", {"s": shard})


async def _settled(db: Database) -> bool:
    """Nothing in flight: no candidate queued for a stage, no fetch owed, no message unsent.
    (Held candidates wait for a pass or for room.)"""
    return (
        await count(db, "SELECT count(*) FROM news.candidates WHERE state = 'queued'") == 0
        and await count(db, "SELECT count(*) FROM news.sources WHERE fetch_queued_at IS NOT NULL")
        == 0
        and await count(db, "SELECT count(*) FROM news.outbox") == 0
    )


async def _pass(runtime: Runtime, shard: str = "s") -> dict[str, object]:
    report = await run_pass(runtime, SystemClock(), shard)
    return report.to_json()


async def test_max_ai_reviews_5_bounds_a_pass_to_5_model_calls_and_keeps_the_rest(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """20 new articles, MAX_AI_REVIEWS=5: each pass admits 5, so 5 model calls; the other
    candidates wait (not dropped, not dead-lettered), a worker's housekeeping does not send
    them, and later passes admit them — each reviewed once."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path, MAX_AI_REVIEWS="5")
    with FeedFarm(feeds=4, items=5, thumbnails=True) as farm:  # straight to review
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime) as summary:
            calls: list[int] = []
            reports = []
            for _ in range(4):
                reports.append(await _pass(runtime))
                await wait_for(lambda: _settled(db), within=60, what="the pass worked off")
                calls.append(sum(model.reviews.values()) - sum(calls))
                if calls == [5]:
                    held = await db.fetch(
                        "SELECT reason, admitted_at FROM news.candidates WHERE state = 'held'"
                    )
                    assert len(held) == 15 and all(h["admitted_at"] is None for h in held)
                    assert {h["reason"] for h in held} == {"MAX_AI_REVIEWS 5 reached"}
                    assert await _written(db) == 5
                    # a worker's housekeeping re-sends nothing that waits for a pass: called
                    # here as housekeeping calls it, and given a housekeeping round to try
                    assert await resend_due(db, SystemClock().now()) == []
                    await housekept(summary)
                    assert sum(model.reviews.values()) == 5
                    assert await count(db, "SELECT count(*) FROM news.candidates") == 15
        assert summary.dead_lettered == {} and summary.failed == {}

    assert calls == [5, 5, 5, 5]
    assert set(model.reviews) == farm.article_urls() and max(model.reviews.values()) == 1
    assert await _written(db) == 20
    assert await count(db, "SELECT count(*) FROM news.reviews") == 20
    assert await count(db, "SELECT count(*) FROM news.candidates") == 0
    # each pass says what the budget left for later
    assert [r["queuedCount"] for r in reports] == [20, 15, 10, 5]
    assert [r["admittedCount"] for r in reports] == [5, 5, 5, 5]
    assert [r["deferredReasons"] for r in reports] == [["MAX_AI_REVIEWS 5 reached"]] * 3 + [[]]


async def test_two_shards_one_over_its_queue_limit_the_others_articles_flow(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Shard ``busy`` has 5 admitted candidates still in flight (limit 5); shard ``calm`` has
    room. The queue is counted per shard: calm's articles are reviewed and written while busy's
    wait for a later pass."""
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, INGESTION_BACKPRESSURE_QUEUE_LIMIT="5"
    )
    with (
        FeedFarm(feeds=2, items=3, thumbnails=True) as busy,
        FeedFarm(feeds=2, items=2, thumbnails=True) as calm,
    ):
        await add_farm_sources(db, busy, shard="busy")
        await add_farm_sources(db, calm, shard="calm")
        source = await db.fetch_one("SELECT id FROM news.sources WHERE shard = 'busy' LIMIT 1")
        assert source is not None
        await db.execute(
            "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage, state,"
            " reason, admitted_at, created_at, updated_at) SELECT"
            " 'http://127.0.0.1:1/backlog-' || n, %(s)s, 'busy', 't', 's', 'review', 'queued',"
            " 'backlog', now(), now(), now() FROM generate_series(1, 5) AS n",
            {"s": source["id"]},
        )
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime, ["fetch"]):
            report = await _pass(runtime, "busy")
            await _pass(runtime, "calm")
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
            await wait_for(lambda: _calm_done(db), within=60, what="calm's 4 articles written")

    assert await _written(db, "calm") == 4 and await _written(db, "busy") == 0
    assert set(model.reviews) == calm.article_urls()  # nothing of busy's reached the model
    held = await db.fetch(
        "SELECT reason FROM news.candidates WHERE shard = 'busy' AND state = 'held'"
    )
    why = (
        "backlog over the queue limit: processing 0 of 6 (5 admitted earlier still in flight"
        " in shard busy, INGESTION_BACKPRESSURE_QUEUE_LIMIT 5)"
    )
    assert [h["reason"] for h in held] == [why] * 6
    assert report["deferredCount"] == 6 and report["admittedCount"] == 0
    assert report["deferredReasons"] == [why]


async def _calm_done(db: Database) -> bool:
    waiting = await count(db, "SELECT count(*) FROM news.candidates WHERE shard = 'calm'")
    return waiting == 0 and await _written(db, "calm") == 4


async def test_a_new_shard_of_30_feeds_by_10_items_is_written_within_three_passes(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """The default limits (queue 250 per shard, MAX_AI_REVIEWS 25, the offline rules): 300
    new candidates, over the queue limit. The first pass admits the limit's worth and the next
    the rest, oldest first — all 300 written within three passes."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    for name in ("NEWS_AI_BASE_URL", "NEWS_AI_MODEL", "MAX_AI_REVIEWS"):
        env.pop(name)  # the defaults: no model, MAX_AI_REVIEWS 25
    with FeedFarm(feeds=30, items=10) as farm:  # no thumbnails: every article is hydrated
        await add_farm_sources(db, farm)
        started = time.perf_counter()
        async with pipeline_runtime(env, db) as runtime, worker_running(runtime):
            assert runtime.settings.ingestion_backpressure_queue_limit == 250
            passes = 0
            while passes < 3 and await _written(db) < 300:
                await _pass(runtime)
                passes += 1
                await wait_for(lambda: _settled(db), within=90, what="the pass worked off")
        elapsed = time.perf_counter() - started

    urls = {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}
    assert urls == farm.article_urls()
    assert await count(db, "SELECT count(*) FROM news.reviews") == 300
    assert await count(db, "SELECT count(*) FROM news.candidates") == 0
    assert model.reviews == {}  # the offline rules judged them: no model configured
    assert passes <= 3 and elapsed < 120, (passes, elapsed)


class TranslatingModel(ModelStandIn):
    """Accepts every article with a summary to translate; translations fail (500) while
    ``translation_down``."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self.translation_down = True
        self.translation_requests = 0

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if method != "POST" or not path.endswith("/chat/completions"):
            return 404, "text/plain", b"not found"
        messages = json.loads(body)["messages"]
        if not messages[0]["content"].startswith("Translate"):
            url = str(json.loads(messages[-1]["content"])["url"])  # the article, as data
            with self.lock:
                self.reviews[url] += 1
            return _completion({"accept": True, "reason": "news", "summary": f"About {url}"})
        with self.lock:
            self.translation_requests += 1
        if self.translation_down:
            return 500, "application/json", b'{"error": "down"}'
        return _completion(f"Translated: {messages[-1]['content']}")


def _completion(content: object) -> tuple[int, str, bytes]:
    text = content if isinstance(content, str) else json.dumps(content)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    return 200, "application/json", json.dumps(answer).encode()


async def _untranslated(db: Database) -> int:
    return await count(
        db, "SELECT count(*) FROM news.reviews WHERE accepted AND translation IS NULL"
    )


async def test_a_failed_translation_in_pipeline_mode_is_retried_by_a_later_pass(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    """The review stage's translation fails: the article is written untranslated (the backlog).
    A pass works the backlog (as the inline run does) under the shard lock: while the model
    still fails it stays; a pass that finds the lock held elsewhere is skipped and leaves it;
    the next pass once the model answers translates it."""
    with TranslatingModel() as model, FeedFarm(feeds=1, items=3, thumbnails=True) as farm:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            async with worker_running(runtime):
                await _pass(runtime)
                await wait_for(lambda: _settled(db), within=60, what="3 articles written")
            assert await _written(db) == 3 and await _untranslated(db) == 3
            assert model.translation_requests == 3  # the review stage's, all failed

            await _pass(runtime)  # the model still fails: retried, kept in the backlog
            assert model.translation_requests == 6 and await _untranslated(db) == 3

            model.translation_down = False
            leases = runtime.news_adapters().leases
            other = await leases.acquire(shard_lock_name("s"), 60)  # another pass or run
            assert other is not None
            await _pass(runtime)
            assert model.translation_requests == 6 and await _untranslated(db) == 3
            await leases.release(other)

            await _pass(runtime)
        assert model.translation_requests == 9 and await _untranslated(db) == 0
        rows = await db.fetch("SELECT summary, translation FROM news.reviews")
        assert {r["translation"] for r in rows} == {f"Translated: {r['summary']}" for r in rows}
        assert max(model.reviews.values()) == 1 and len(model.reviews) == 3


async def test_a_pass_retries_an_accepted_article_without_a_thumbnail(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    """Spec 001's no-thumbnail retry in pipeline mode: a pass tries an accepted article still
    without an image (older than the retry age) again, as the inline run does — once."""
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    with FeedFarm(feeds=1, items=1) as farm:
        await add_farm_sources(db, farm)
        await db.execute("UPDATE news.sources SET enabled = false")  # no fetch: the retry only
        source = await db.fetch_one("SELECT id FROM news.sources")
        assert source is not None
        await db.execute(
            "INSERT INTO news.articles (url, source_id, shard, title, summary, status, fence,"
            " created_at) VALUES (%(u)s, %(s)s, 's', 'old', 'old', 'accepted', 1,"
            " now() - interval '7 hours')",
            {"u": f"{farm.url}/articles/0-0", "s": source["id"]},
        )
        async with pipeline_runtime(env, db) as runtime:
            await _pass(runtime)
            await _pass(runtime)  # tried a moment ago: not again before the retry age
        image = await db.fetch_one("SELECT image_url FROM news.articles")
        assert image is not None and image["image_url"] == f"{farm.url}/img/articles/0-0.jpg"
        assert farm.page_requests == 1
