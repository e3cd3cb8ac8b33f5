"""One report, two engines (issue 23): the same small shard — loopback feeds, a dead feed, a
feed with an over-long link, a model stand-in that summarises (so summaries are translated) —
run through the inline engine, and through the pipeline (a pass, a worker until idle, a pass).
Every spec 001 field is in both reports, and the counts that must agree do: articles written,
model reviews, verdicts, translations, the dead feed's error, the dropped item. The article
count that fails is reported alike; Redis cut during the run is `redisEnabled: false` in both.
Real PostgreSQL, RabbitMQ and Redis (behind a TCP proxy)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.fetch import LINK_TOO_LONG
from nightcrew.news.inline import run_shard
from nightcrew.news.pipeline import run_pass
from nightcrew.news.report import SPEC_FIELDS
from nightcrew.news.sources import add_source
from nightcrew.runtime import Runtime
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.proxy import TcpProxy
from tests.support.services import REDIS_URL, needs_rabbitmq, needs_redis
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq

FEEDS, ITEMS = 3, 4
WRITTEN = FEEDS * ITEMS + 1  # the farm's stories and the long feed's one keepable item
SUMMARY = "A short summary of the story."


class _Farm(FeedFarm):
    """A FeedFarm that also serves /feeds/long: one story, and one whose link is too long to
    keep (dropped, reported in ``droppedItems``). Anything else unknown answers 404."""

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path == "/feeds/long":
            ok, long = f"{self.url}/articles/long-ok", f"{self.url}/articles/{'x' * 2100}"
            items = "".join(
                f"<item><title>Long feed story {n}</title><link>{link}</link>"
                f"<description>A long enough description of story {n}.</description></item>"
                for n, link in enumerate((ok, long))
            )
            rss = f'<?xml version="1.0"?><rss version="2.0"><channel><title>L</title>{items}'
            return 200, "application/rss+xml", (rss + "</channel></rss>").encode()
        return super().respond(method, path, body)


async def _add_sources(db: Database, farm: _Farm, shard: str) -> None:
    await add_farm_sources(db, farm, shard)
    now = SystemClock().now()
    await add_source(db, url=f"{farm.url}/gone", name="dead", shard=shard, now=now)
    await add_source(db, url=f"{farm.url}/feeds/long", name="long", shard=shard, now=now)


async def _idle(db: Database, shard: str, written: int) -> bool:
    waiting = await count(
        db,
        "SELECT count(*) FROM news.candidates WHERE shard = %(s)s AND state IN ('held', 'queued')",
        {"s": shard},
    )
    fetching = await count(
        db,
        "SELECT count(*) FROM news.sources WHERE shard = %(s)s AND fetch_queued_at IS NOT NULL",
        {"s": shard},
    )
    articles = await count(
        db, "SELECT count(*) FROM news.articles WHERE shard = %(s)s", {"s": shard}
    )
    return waiting == 0 and fetching == 0 and articles == written


async def _through_the_pipeline(
    runtime: Runtime, db: Database, shard: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pass, a worker until the shard is idle, a pass: the two passes' reports."""
    first = (await run_pass(runtime, SystemClock(), shard)).to_json()
    async with worker_running(runtime):
        await wait_for(lambda: _idle(db, shard, WRITTEN), 60, f"shard {shard} written")
    second = (await run_pass(runtime, SystemClock(), shard)).to_json()
    return first, second


async def _articles(db: Database, shard: str) -> int:
    return await count(db, "SELECT count(*) FROM news.articles WHERE shard = %(s)s", {"s": shard})


def _agreeing(report: dict[str, Any]) -> dict[str, Any]:
    """The fields both engines must fill alike for this workload."""
    return {
        "processedCount": report["processedCount"],
        "aiReviewedCount": report["aiReviewedCount"],
        "verdicts": report["acceptedCount"] + report["rejectedCount"],
        "translatedCount": report["translatedCount"],
        "fetchErrors": sorted((e["source"], e["error"]) for e in report["fetchErrors"]),
        "writeErrors": report["writeErrors"],
        "reviewer": report["reviewer"],
        "lockedCount": report["lockedCount"],
        "status": report["status"],
        "redisEnabled": report["redisEnabled"],
        "backpressureDbArticleCountError": report["backpressureDbArticleCountError"],
    }


async def _both_engines(
    db: Database, db_url: str, prefix: str, tmp_path: Path
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], ModelStandIn, ModelStandIn]:
    """(the inline run's report, the pipeline's first and second pass reports, each engine's
    model stand-in)."""
    with (
        _Farm(feeds=FEEDS, items=ITEMS) as inline_farm,
        _Farm(feeds=FEEDS, items=ITEMS) as pipeline_farm,
        ModelStandIn(delay=0.0, summary=SUMMARY) as inline_model,
        ModelStandIn(delay=0.0, summary=SUMMARY) as pipeline_model,
    ):
        await _add_sources(db, inline_farm, "inline")
        await _add_sources(db, pipeline_farm, "rabbit")
        inline_env = {
            **pipeline_env(db_url, prefix, inline_model, tmp_path),
            "NEWS_PIPELINE": "inline",
        }
        async with pipeline_runtime(inline_env, db) as runtime:
            inline = (await run_shard(runtime, SystemClock(), "inline")).to_json()
        async with pipeline_runtime(
            pipeline_env(db_url, prefix, pipeline_model, tmp_path), db
        ) as runtime:
            first, second = await _through_the_pipeline(runtime, db, "rabbit")
    return inline, first, second, inline_model, pipeline_model


async def test_both_engines_report_every_spec_field_and_agree_on_the_counts(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    inline, first, second, inline_model, pipeline_model = await _both_engines(
        db, fresh_db_url, prefix, tmp_path
    )

    for report in (inline, first, second):
        assert set(SPEC_FIELDS) <= set(report), set(SPEC_FIELDS) - set(report)
    assert inline["pipeline"] == "inline" and second["pipeline"] == "rabbitmq"
    # the counts mean the same in both: written, model calls, verdicts, translations
    assert _agreeing(inline) == _agreeing(second), (inline, second)
    assert inline["processedCount"] == await _articles(db, "inline") == WRITTEN
    assert second["processedCount"] == await _articles(db, "rabbit") == WRITTEN
    assert second["writtenCount"] == second["processedCount"]
    assert inline["aiReviewedCount"] == sum(inline_model.reviews.values()) == WRITTEN
    assert second["aiReviewedCount"] == sum(pipeline_model.reviews.values()) == WRITTEN
    assert inline["translatedCount"] == inline_model.translations == WRITTEN
    assert second["translatedCount"] == pipeline_model.translations == WRITTEN
    assert inline["fetchErrors"] == [{"source": "dead", "error": "the feed answered 404"}]
    assert inline["status"] == "completed" and inline["redisEnabled"] is False
    # the first pass only enqueued: nothing was fetched, reviewed or written yet
    assert first["processedCount"] == 0 and first["aiReviewedCount"] == 0
    assert first["fetchErrors"] == [] and first["enqueuedSources"] == FEEDS + 2
    # and the second pass does not count the first window's results again
    assert second["resultsSince"] is not None


async def test_both_engines_report_the_items_dropped_for_their_link(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    inline, _, second, _, _ = await _both_engines(db, fresh_db_url, prefix, tmp_path)
    dropped = [{"source": "long", "reason": LINK_TOO_LONG, "count": 1}]
    assert inline["droppedItems"] == dropped
    assert second["droppedItems"] == dropped


async def test_an_article_count_that_fails_is_reported_alike_by_both_engines(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    await db.execute(
        "CREATE OR REPLACE FUNCTION news.article_count() RETURNS bigint LANGUAGE plpgsql"
        " AS $$ BEGIN RAISE EXCEPTION 'the count is down for the test'; END $$"
    )
    with ModelStandIn(delay=0.0) as model:
        env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
        async with pipeline_runtime({**env, "NEWS_PIPELINE": "inline"}, db) as runtime:
            inline = (await run_shard(runtime, SystemClock(), "inline")).to_json()
        async with pipeline_runtime(env, db) as runtime:
            piped = (await run_pass(runtime, SystemClock(), "rabbit")).to_json()
    assert inline["backpressureDbArticleCount"] is piped["backpressureDbArticleCount"] is None
    error = inline["backpressureDbArticleCountError"]
    assert error is not None and "the count is down for the test" in error
    assert piped["backpressureDbArticleCountError"] == error
    assert inline["status"] == piped["status"] == "completed"  # both went on


# --- Redis cut during the run --------------------------------------------------------------------
@pytest.fixture
async def redis_proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(REDIS_URL)
    proxy = TcpProxy(target.port or 6379, target.hostname or "127.0.0.1")
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.cut()


@needs_redis
async def test_redis_cut_during_the_run_is_redis_disabled_in_both_engines(
    db: Database, fresh_db_url: str, prefix: str, redis_proxy: TcpProxy, tmp_path: Path
) -> None:
    redis_url = urlsplit(REDIS_URL)._replace(netloc=f"127.0.0.1:{redis_proxy.port}").geturl()
    inline_shard, pipeline_shard = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("inline", "rabbit"))
    with (
        FeedFarm(feeds=FEEDS, items=ITEMS, thumbnails=True) as inline_farm,
        FeedFarm(feeds=FEEDS, items=ITEMS, thumbnails=True) as pipeline_farm,
        ModelStandIn(delay=0.1) as model,
    ):
        await add_farm_sources(db, inline_farm, inline_shard)
        await add_farm_sources(db, pipeline_farm, pipeline_shard)
        env = {**pipeline_env(fresh_db_url, prefix, model, tmp_path), "REDIS_URL": redis_url}

        async with pipeline_runtime({**env, "NEWS_PIPELINE": "inline"}, db) as runtime:
            running = asyncio.create_task(run_shard(runtime, SystemClock(), inline_shard))
            await wait_for(lambda: _reviewed(model, 3), 30, "the inline run to be reviewing")
            await redis_proxy.cut()
            inline = (await running).to_json()
        await redis_proxy.restore()

        async with pipeline_runtime(env, db) as runtime:
            first = (await run_pass(runtime, SystemClock(), pipeline_shard)).to_json()
            assert first["redisEnabled"] is True  # Redis answered the pass
            async with worker_running(runtime):
                await redis_proxy.cut()
                await wait_for(
                    lambda: _idle(db, pipeline_shard, FEEDS * ITEMS), 60, "the pipeline's shard"
                )
            second = (await run_pass(runtime, SystemClock(), pipeline_shard)).to_json()

    assert inline["redisEnabled"] is False and inline["processedCount"] == FEEDS * ITEMS
    assert second["redisEnabled"] is False and second["processedCount"] == FEEDS * ITEMS
    assert max(model.reviews.values()) == 1


async def _reviewed(model: ModelStandIn, n: int) -> bool:
    return sum(model.reviews.values()) >= n


async def test_translations_caught_up_from_the_backlog_are_counted_once_by_both_engines(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    """Each summary's first translation fails (written without it), and the backlog catches it
    up: inline in the same run, in the pipeline by the next pass. translatedCount counts each
    once — the pass's window sees the review written without its translation (the backlog's
    translation marks it `translated_late`) and the translation the pass's backlog made."""
    n = 2 * ITEMS
    with (
        FeedFarm(feeds=2, items=ITEMS) as inline_farm,
        FeedFarm(feeds=2, items=ITEMS) as pipeline_farm,
        ModelStandIn(delay=0.0, summary=SUMMARY, fail_first_translation=True) as inline_model,
        ModelStandIn(delay=0.0, summary=SUMMARY, fail_first_translation=True) as pipeline_model,
    ):
        await add_farm_sources(db, inline_farm, "inline")
        await add_farm_sources(db, pipeline_farm, "rabbit")
        inline_env = pipeline_env(fresh_db_url, prefix, inline_model, tmp_path)
        async with pipeline_runtime({**inline_env, "NEWS_PIPELINE": "inline"}, db) as runtime:
            inline = (await run_shard(runtime, SystemClock(), "inline")).to_json()
        pipeline = pipeline_env(fresh_db_url, prefix, pipeline_model, tmp_path)
        async with pipeline_runtime(pipeline, db) as runtime:
            await run_pass(runtime, SystemClock(), "rabbit")
            async with worker_running(runtime):
                await wait_for(lambda: _idle(db, "rabbit", n), 60, "the pipeline's shard")
            assert pipeline_model.translations == 0  # each first attempt failed
            second = (await run_pass(runtime, SystemClock(), "rabbit")).to_json()

    assert inline["translatedCount"] == inline_model.translations == n
    assert second["translatedCount"] == pipeline_model.translations == n
    late = await count(db, "SELECT count(*) FROM news.reviews WHERE translated_late")
    assert late == 2 * n  # both engines' translations came from the backlog
