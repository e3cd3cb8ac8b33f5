"""One report, two engines, compared field by field on the same input: the same small shard —
loopback feeds, a dead feed, a feed with an over-long link, a model stand-in that summarises (so
summaries are translated) — run through the inline engine, and through the pipeline (a worker
running, a pass, the worker until idle, the next pass).

Every spec 001 field of the inline run's report is compared with the pipeline's: what the run
found and decided with the first pass's own field (``FOUND``), what its expensive steps did
with the workers' results the next pass reports under ``workers`` (``DONE``); the few that
differ by design say why (``DIFFERENT``), and a field in none of them fails the test. The
article count that fails is reported alike; Redis cut during the run is ``redisEnabled: false``
in both. Real PostgreSQL, RabbitMQ and Redis (behind a TCP proxy)."""

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
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.report import SPEC_FIELDS, WORK_FIELDS
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps.entries import LINK_TOO_LONG
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
    """With a worker running: a pass, the worker until the shard is idle, the next pass — the
    two passes' reports."""
    async with worker_running(runtime):
        first = (await run_pass(runtime, SystemClock(), shard)).to_json()
        await wait_for(lambda: _idle(db, shard, WRITTEN), 60, f"shard {shard} written")
    second = (await run_pass(runtime, SystemClock(), shard)).to_json()
    return first, second


async def _articles(db: Database, shard: str) -> int:
    return await count(db, "SELECT count(*) FROM news.articles WHERE shard = %(s)s", {"s": shard})


# What a run found and decided: the inline run's field equals the first pass's own.
FOUND = (
    "trigger",
    "status",
    "skipped",
    "queuedCount",
    "queuedBySource",
    "deferredCount",
    "deferredReasons",
    "retriedCount",
    "backpressureQueueLimit",
    "backpressureDbArticleLimit",
    "backpressureDbArticleCountError",
    "lockedCount",
    "redisEnabled",
    "reviewer",
    "fetchErrors",
    "droppedItems",
)
# What the expensive steps did: the inline run's own field equals the workers' results, which
# the passes report under ``workers`` — the first pass what they noted before it read, the next
# the rest (a pass itself does none of it: its own are 0 or empty).
DONE = WORK_FIELDS
DIFFERENT = {
    "shard": "each engine runs a shard of its own here (the URLs are unique per shard)",
    "pipeline": "the engine's name",
    "durationMs": "a time, not a count",
    "backpressureDbArticleCount": "both shards share one database, and the pipeline runs after"
    " the inline run: its count includes the inline run's articles (the test checks the sum)",
}


def _shardless(value: Any, shard: str) -> Any:
    """``queuedBySource``'s keys name the shard: "Feed 0 (inline)" is "Feed 0 (rabbit)"."""
    if isinstance(value, dict):
        return {k.replace(f"({shard})", "(S)"): v for k, v in value.items()}
    return value


def compare(inline: dict[str, Any], first: dict[str, Any], second: dict[str, Any]) -> None:
    """Field by field: every spec field of the inline run's report against the pipeline's."""
    assert set(SPEC_FIELDS) == set(FOUND) | set(DONE) | set(DIFFERENT), (
        "a report field the parity suite does not compare",
        set(SPEC_FIELDS) ^ (set(FOUND) | set(DONE) | set(DIFFERENT)),
    )
    for name in FOUND:
        assert _shardless(inline[name], inline["shard"]) == _shardless(
            first[name], first["shard"]
        ), (name, inline[name], first[name])
    for name in DONE:
        workers = first["workers"][name] + second["workers"][name]
        assert inline[name] == workers, (name, inline[name], first["workers"], second["workers"])
        assert first[name] in (0, []) or name == "translatedCount", (name, first[name])


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


async def test_both_engines_report_every_spec_field_alike_on_the_same_feeds(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    inline, first, second, inline_model, pipeline_model = await _both_engines(
        db, fresh_db_url, prefix, tmp_path
    )

    for report in (inline, first, second):
        assert set(SPEC_FIELDS) <= set(report), set(SPEC_FIELDS) - set(report)
    assert inline["pipeline"] == "inline" and second["pipeline"] == "rabbitmq"
    compare(inline, first, second)
    # and the values are the workload's, not merely alike
    assert inline["queuedCount"] == WRITTEN and inline["deferredCount"] == 0
    assert inline["processedCount"] == await _articles(db, "inline") == WRITTEN
    written = first["workers"]["processedCount"] + second["workers"]["processedCount"]
    assert written == await _articles(db, "rabbit") == WRITTEN
    assert inline["aiReviewedCount"] == sum(inline_model.reviews.values()) == WRITTEN
    reviewed = first["workers"]["aiReviewedCount"] + second["workers"]["aiReviewedCount"]
    assert reviewed == sum(pipeline_model.reviews.values())
    assert inline["translatedCount"] == inline_model.translations == WRITTEN
    translated = first["workers"]["translatedCount"] + second["workers"]["translatedCount"]
    assert translated == pipeline_model.translations == WRITTEN
    assert inline["fetchErrors"] == [{"source": "dead", "error": "the feed answered 404"}]
    assert inline["droppedItems"] == [{"source": "long", "reason": LINK_TOO_LONG, "count": 1}]
    assert inline["status"] == "completed" and inline["redisEnabled"] is False
    assert inline["backpressureDbArticleCount"] == 0
    assert first["backpressureDbArticleCount"] == WRITTEN  # the inline run's
    # the first pass admitted everything and wrote nothing itself
    assert first["admittedCount"] == WRITTEN and first["enqueuedSources"] == FEEDS + 2
    # the second pass found nothing new, and reports the workers' window since the first
    assert second["queuedCount"] == 0 and second["workers"]["since"] is not None
    assert second["fetchErrors"] == []  # the dead feed is not due again yet


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
            piped = (await run_pass(runtime, SystemClock(), "rabbit")).to_json()  # no source
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
            async with worker_running(runtime):
                first = (await run_pass(runtime, SystemClock(), pipeline_shard)).to_json()
                assert first["redisEnabled"] is True  # Redis answered the pass
                await redis_proxy.cut()
                await wait_for(
                    lambda: _idle(db, pipeline_shard, FEEDS * ITEMS), 60, "the pipeline's shard"
                )
            second = (await run_pass(runtime, SystemClock(), pipeline_shard)).to_json()

    assert inline["redisEnabled"] is False and inline["processedCount"] == FEEDS * ITEMS
    # the workers' Redis failed under them (noted); the pass's own, still cut, too
    assert second["workers"]["redisEnabled"] is False and second["redisEnabled"] is False
    both = first["workers"]["processedCount"] + second["workers"]["processedCount"]
    assert both == FEEDS * ITEMS
    assert max(model.reviews.values()) == 1


async def _reviewed(model: ModelStandIn, n: int) -> bool:
    return sum(model.reviews.values()) >= n


async def test_translations_caught_up_from_the_backlog_are_counted_once_by_both_engines(
    db: Database, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    """Each summary's first translation fails (written without it), and the backlog catches it
    up: inline in the same run, after its writes; in the pipeline by the next pass (the pass
    works the backlog after its admission, before the workers write what it admitted — a
    difference of when, by design, not of what). translatedCount counts each once: the inline
    run's, and the next pass's own (its backlog), the workers' window not again (the backlog's
    translation marks the review ``translated_late``)."""
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
            async with worker_running(runtime):
                first = (await run_pass(runtime, SystemClock(), "rabbit")).to_json()
                await wait_for(lambda: _idle(db, "rabbit", n), 60, "the pipeline's shard")
            assert pipeline_model.translations == 0  # each first attempt failed
            second = (await run_pass(runtime, SystemClock(), "rabbit")).to_json()

    assert inline["translatedCount"] == inline_model.translations == n
    assert first["translatedCount"] == 0
    assert second["translatedCount"] == pipeline_model.translations == n
    assert first["workers"]["translatedCount"] == second["workers"]["translatedCount"] == 0
    late = await count(db, "SELECT count(*) FROM news.reviews WHERE translated_late")
    assert late == 2 * n  # both engines' translations came from the backlog
