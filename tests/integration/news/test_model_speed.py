"""News at the model's speed: reviews run concurrently within NEWS_AI_CONCURRENCY, paced by
NEWS_AI_REQUESTS_PER_MINUTE (per process, or shared through Redis), waiting out a provider's
Retry-After inside the call, and never past MAX_AI_REVIEWS.

Every test talks to an OpenAI-compatible stand-in on loopback that records each call, when it
arrived and how many calls were in flight with it (``ModelStandIn.calls``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.report import NewsReport
from nightcrew.runtime import Runtime
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    namespace,
    pipeline_env,
    pipeline_runtime,
    wait_for,
    worker_running,
)
from tests.support.servers import free_port
from tests.support.services import REDIS_URL, needs_rabbitmq, needs_redis
from tests.support.standins import FeedFarm, ModelCall, ModelStandIn


def inline_env(db_url: str, model: ModelStandIn, store: Path, **more: str) -> dict[str, str]:
    return {
        **pipeline_env(db_url, "inline-unused", model, store),
        "NEWS_PIPELINE": "inline",
        "INGESTION_BACKPRESSURE_QUEUE_LIMIT": "5000",
        "MAX_AI_REVIEWS": "5000",
        "NEWS_AI_MAX_RETRIES": "2",  # production's default
        **more,
    }


@asynccontextmanager
async def inline(
    db: Database, db_url: str, model: ModelStandIn, store: Path, **more: str
) -> AsyncIterator[Runtime]:
    async with pipeline_runtime(inline_env(db_url, model, store, **more), db) as runtime:
        yield runtime


async def timed_run(runtime: Runtime, shard: str) -> tuple[NewsReport, float]:
    started = time.perf_counter()
    report = await run_shard(runtime, SystemClock(), shard)
    return report, time.perf_counter() - started


def reviews(model: ModelStandIn) -> list[ModelCall]:
    return [c for c in model.calls if c.kind == "review"]


# The limiter counts requests as they start; the stand-in, as they arrive. A new connection
# arrives some tens of milliseconds later than a kept-alive one, so a window of exactly one
# second can catch the tail of one burst and the whole of the next: the windows counted here
# are a second less that jitter.
JITTER = 0.05


def busiest_second(calls: list[ModelCall], after: float) -> int:
    """The most calls that arrived within any one second (less JITTER) from ``after`` on."""
    times = sorted(c.at for c in calls if c.at >= after)
    return max((sum(1 for t in times if s <= t < s + 1.0 - JITTER) for s in times), default=0)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path


# --- concurrency ----------------------------------------------------------------------------------
async def test_sixteen_calls_in_flight_review_400_articles_eight_times_faster_than_one(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    """NEWS_AI_CONCURRENCY=16 against a 0.2 s model: never more than 16 calls in flight, at
    least 12 at some point, and the reviews done at least 8 times faster than with one call at
    a time — the review step's speed, from the model's first request to its last answer, which
    is what calls in flight change. The whole run's speed is asserted at 5 times: its other
    work (fetching, parsing, writing) does not get faster with more calls in flight and shares
    two cores with five other test workers (7.2 and 5.5 times were measured in full runs, 13.4
    alone); `bench.news_model` measures the run against the model's own limit. The
    one-at-a-time run reviews 40 articles (80 s for 400 would hold the suite for nothing): the
    speeds compared are articles per second, each run's own."""
    with FeedFarm(feeds=1, items=40, thumbnails=True) as few, ModelStandIn(0.2) as serial:
        await add_farm_sources(db, few, shard="one")
        async with inline(db, fresh_db_url, serial, store, NEWS_AI_CONCURRENCY="1") as runtime:
            one, one_seconds = await timed_run(runtime, "one")
    assert one.processed_count == one.ai_reviewed_count == 40
    assert serial.most_in_flight == 1

    with FeedFarm(feeds=4, items=100, thumbnails=True) as many, ModelStandIn(0.2) as model:
        await add_farm_sources(db, many, shard="many")
        async with inline(db, fresh_db_url, model, store, NEWS_AI_CONCURRENCY="16") as runtime:
            report, seconds = await timed_run(runtime, "many")
            tokens = runtime.metrics.value("nightcrew_ai_tokens_total", kind="prompt")
    assert report.processed_count == report.ai_reviewed_count == 400
    assert len(reviews(model)) == 400 and set(model.reviews.values()) == {1}
    assert 12 <= model.most_in_flight <= 16, model.most_in_flight
    review_speedup = reviews_a_second(model, 0.2) / reviews_a_second(serial, 0.2)
    speedup = (400 / seconds) / (40 / one_seconds)
    print(
        f"\nreviews {review_speedup:.1f}x, run {speedup:.1f}x"
        f" ({seconds:.1f} s for 400, {one_seconds:.1f} s for 40)"
    )
    assert review_speedup >= 8, (review_speedup, speedup)
    assert speedup >= 5, (speedup, seconds, one_seconds)
    # the spend: every token the stand-in billed, in the report and in /metrics
    assert report.ai_prompt_tokens == model.prompt_tokens > 0 and tokens == model.prompt_tokens
    assert report.ai_completion_tokens == model.completion_tokens > 0


def reviews_a_second(model: ModelStandIn, delay: float) -> float:
    """The review step's speed as the model saw it: reviews answered, over the time from its
    first review request to its last answer (the last arrival plus the model's delay)."""
    calls = reviews(model)
    return len(calls) / (max(c.at for c in calls) + delay - min(c.at for c in calls))


@needs_rabbitmq
async def test_one_pipeline_worker_with_prefetch_32_keeps_16_calls_in_flight_at_most(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    # every verdict carries a summary, so each accepted article's translation is a second call
    # holding the same slots
    with (
        FeedFarm(feeds=4, items=50, thumbnails=True) as farm,
        ModelStandIn(0.2, summary="a summary") as model,
    ):
        await add_farm_sources(db, farm)
        async with namespace() as prefix:
            env = {
                **pipeline_env(fresh_db_url, prefix, model, store),
                "NEWS_AI_CONCURRENCY": "16",
                "INGESTION_BACKPRESSURE_QUEUE_LIMIT": "1000",
            }
            async with pipeline_runtime(env, db) as runtime:
                async with worker_running(runtime, concurrency=32):
                    first = await run_pass(runtime, SystemClock(), "s")
                    await wait_for(lambda: _written(db, 200), within=60, what="200 written")
                    # the passes report the workers' spend, noted with each review
                    later = await run_pass(runtime, SystemClock(), "s")
    assert len(reviews(model)) == 200
    assert model.translations == 200  # reviews and translations alike, 16 in flight at most
    assert model.most_in_flight <= 16, model.most_in_flight
    assert model.most_in_flight >= 12  # the prefetch filled the slots
    assert first.pipeline is not None and later.pipeline is not None
    workers = first.pipeline.workers, later.pipeline.workers
    assert sum(w.ai_prompt_tokens for w in workers) == model.prompt_tokens > 0
    assert sum(w.ai_completion_tokens for w in workers) == model.completion_tokens > 0


async def _written(db: Database, n: int) -> bool:
    row = await db.fetch_one("SELECT count(*) AS n FROM news.articles")
    return row is not None and int(row["n"]) >= n


# --- the rate -------------------------------------------------------------------------------------
async def test_1200_requests_a_minute_is_20_a_second_after_the_first_burst(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    with FeedFarm(feeds=1, items=80, thumbnails=True) as farm, ModelStandIn(0.0) as model:
        await add_farm_sources(db, farm)
        async with inline(
            db,
            fresh_db_url,
            model,
            store,
            NEWS_AI_CONCURRENCY="64",
            NEWS_AI_REQUESTS_PER_MINUTE="1200",
        ) as runtime:
            report, seconds = await timed_run(runtime, "s")
    assert report.processed_count == report.ai_reviewed_count == 80
    arrivals = sorted(c.at for c in model.calls)
    # 80 calls at 20 a second (a first burst of 20): the bucket hands out the last turn 3 s
    # after the first (unlimited, they all arrive within ~0.1 s). The span is measured where
    # the calls land, and a first burst that reaches the model late shortens it without any
    # call going early (2.43 s seen once on a loaded CI machine); the run's own time below
    # holds the 3 s exactly.
    assert arrivals[-1] - arrivals[0] >= 2.0, arrivals
    # after the first burst, ~20 a second: a batch sent late (an event loop that two busy
    # cores kept waiting) may still land beside the next, so up to half a batch more
    after_burst = busiest_second(model.calls, arrivals[0] + 1.0)
    assert after_burst <= 30, [round(t - arrivals[0], 3) for t in arrivals]
    assert seconds >= 3.0  # 80 calls at 20 a second: the last 60 wait at least 3 s in all


@needs_redis
async def test_two_processes_sharing_redis_keep_the_rate_together(
    fresh_db_url: str, store: Path
) -> None:
    """Two `news run` processes (two shards, one model, one Redis), each with 40 articles and
    NEWS_AI_REQUESTS_PER_MINUTE=600 (10 a second): together, never more than ~10 a second."""
    from tests.acceptance.test_cli import _env, _nightcrew

    with FeedFarm(feeds=2, items=40, thumbnails=True) as farm, ModelStandIn(0.0) as model:
        env = _env(
            **inline_env(fresh_db_url, model, store),
            REDIS_URL=REDIS_URL,
            NEWS_AI_CONCURRENCY="16",
            NEWS_AI_REQUESTS_PER_MINUTE="600",
        )
        env.pop("PYTHONFAULTHANDLER", None)
        db = await Database.open(fresh_db_url)
        try:
            for shard, url in zip(("a", "b"), farm.feed_urls(), strict=True):
                from nightcrew.news.sources.registry import add_source

                await add_source(db, url=url, name=shard, shard=shard, now=SystemClock().now())
            runs = [
                await asyncio.create_subprocess_exec(
                    _nightcrew(),
                    "news",
                    "run",
                    "--shard",
                    shard,
                    "--json",
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                for shard in ("a", "b")
            ]
            outputs = await asyncio.wait_for(
                asyncio.gather(*(r.communicate() for r in runs)), timeout=90
            )
        finally:
            await db.close()
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err.decode()[-2000:]
        report = json.loads(out)
        assert report["processedCount"] == 40 and report["redisEnabled"] is True, report
    arrivals = sorted(c.at for c in model.calls)
    assert len(reviews(model)) == 80
    # 80 at 10 a second, shared: the last 7 s after the first; each alone would take 3 s
    assert arrivals[-1] - arrivals[0] >= 6.5, arrivals
    # two processes on two busy cores: a second's sends delayed may land beside the next
    # second's, so at most twice the rate in any one second (the span above is the proof)
    assert busiest_second(model.calls, arrivals[0] + 1.0) <= 20, arrivals


async def test_a_redis_that_is_gone_leaves_the_rate_per_process_and_says_so(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with FeedFarm(feeds=1, items=30, thumbnails=True) as farm, ModelStandIn(0.0) as model:
        await add_farm_sources(db, farm)
        async with inline(
            db,
            fresh_db_url,
            model,
            store,
            REDIS_URL=dead,
            NEWS_AI_REQUESTS_PER_MINUTE="600",
        ) as runtime:
            with capture_logs() as logs:
                started = time.monotonic()
                report, _ = await timed_run(runtime, "s")
    assert report.processed_count == 30 and report.redis_enabled is False
    assert any(e["event"] == "news.ai_rate_limit_local" for e in logs)
    arrivals = sorted(c.at for c in model.calls)
    # 30 at 10 a second, a burst of 10: the 30th cannot leave before 2 s after the run began
    # (measured from the run's start, not the first arrival, which a busy machine can delay
    # more than the later ones: CI once saw the 30 arrive within 1.35 s of the first)
    assert arrivals[-1] - started >= 1.9, (started, arrivals)


# --- a provider's own limit -----------------------------------------------------------------------
async def test_a_429_with_retry_after_is_waited_out_inside_the_call_not_stormed(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    """The model answers 429 with Retry-After: 2 for 3 s. At concurrency 8, each slot is
    refused at most a few times (the SDK waits 2 s between tries), and every article is
    reviewed in the same run."""
    with FeedFarm(feeds=1, items=40, thumbnails=True) as farm, ModelStandIn(0.05) as model:
        await add_farm_sources(db, farm)
        async with inline(db, fresh_db_url, model, store, NEWS_AI_CONCURRENCY="8") as runtime:
            model.throttle(3.0, retry_after=2)
            report, _ = await timed_run(runtime, "s")
    refused = [c for c in model.calls if c.status == 429]
    assert 8 <= len(refused) <= 3 * 8, len(refused)
    assert report.processed_count == report.ai_reviewed_count == 40
    assert report.deferred_count == 0 and set(model.answered.values()) == {1}
    gaps = sorted({round(c.at - refused[0].at, 1) for c in refused})
    assert gaps[-1] >= 1.9  # the second refusals came after the server's 2 s, not at once


# --- the cost bound -------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["inline", pytest.param("pipeline", marks=needs_rabbitmq)])
async def test_max_ai_reviews_30_holds_with_16_calls_in_flight(
    db: Database, fresh_db_url: str, store: Path, engine: str
) -> None:
    """100 new articles, MAX_AI_REVIEWS=30, 16 in flight: exactly 30 review calls a run (or
    pass) — the next takes the next 30 — and no article is reviewed twice."""
    with FeedFarm(feeds=2, items=50, thumbnails=True) as farm, ModelStandIn(0.1) as model:
        await add_farm_sources(db, farm)
        bound = {"MAX_AI_REVIEWS": "30", "NEWS_AI_CONCURRENCY": "16"}
        if engine == "inline":
            async with inline(db, fresh_db_url, model, store, **bound) as runtime:
                first = await run_shard(runtime, SystemClock(), "s")
                after_first = len(reviews(model))
                second = await run_shard(runtime, SystemClock(), "s")
            assert (first.ai_reviewed_count, second.ai_reviewed_count) == (30, 30)
        else:
            async with namespace() as prefix:
                env = {**pipeline_env(fresh_db_url, prefix, model, store), **bound}
                async with pipeline_runtime(env, db) as runtime:
                    async with worker_running(runtime, concurrency=32):
                        await run_pass(runtime, SystemClock(), "s")
                        await wait_for(lambda: _written(db, 30), within=60, what="30 written")
                        after_first = len(reviews(model))
                        await run_pass(runtime, SystemClock(), "s")
                        await wait_for(lambda: _written(db, 60), within=60, what="60 written")
                        await asyncio.sleep(0.5)  # nothing more is asked for
    assert after_first == 30
    assert len(reviews(model)) == 60 and len(model.reviews) == 60
    assert set(model.reviews.values()) == {1}
    assert model.most_in_flight <= 16


# --- verdicts -------------------------------------------------------------------------------------
async def test_a_server_without_json_schema_is_found_out_once_under_concurrency(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    with FeedFarm(feeds=1, items=24, thumbnails=True) as farm, ModelStandIn(0.05) as model:
        model.refuse_json_schema = True
        await add_farm_sources(db, farm)
        async with inline(db, fresh_db_url, model, store, NEWS_AI_CONCURRENCY="8") as runtime:
            with capture_logs() as logs:
                report, _ = await timed_run(runtime, "s")
    assert report.processed_count == report.accepted_count == 24
    fallbacks = [e for e in logs if e["event"] == "news.ai_response_format_fallback"]
    assert len(fallbacks) == 1 and fallbacks[0]["using"] == "json_object"
    formats = [(c.request.get("response_format") or {}).get("type") for c in reviews(model)]
    # the first wave (8 in flight) each found out; every later call asked in JSON mode
    assert formats.count("json_schema") <= 8 and formats.count("json_object") == 24


async def test_a_verdict_that_does_not_validate_writes_the_article_unreviewed_with_why(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    with FeedFarm(feeds=1, items=3, thumbnails=True) as farm, ModelStandIn(0.0) as model:
        model.verdict_text = json.dumps({"accept": "yes", "reason": "fine", "summary": ""})
        await add_farm_sources(db, farm)
        async with inline(db, fresh_db_url, model, store) as runtime:
            with capture_logs() as logs:
                report, _ = await timed_run(runtime, "s")
    assert report.processed_count == 3 and report.ai_reviewed_count == 0
    rows = await db.fetch("SELECT status FROM news.articles")
    assert [r["status"] for r in rows] == ["unreviewed"] * 3
    failed = [e for e in logs if e["event"] == "worker.ai_review_failed"]
    assert len(failed) == 3 and all(e["transient"] is False for e in failed)
    assert all("does not validate (accept:" in e["error"] for e in failed)
    assert len(reviews(model)) == 3  # a permanent failure: asked once, never again


# --- stopping -------------------------------------------------------------------------------------
async def test_a_run_cancelled_mid_batch_cancels_its_calls_and_releases_its_locks(
    db: Database, fresh_db_url: str, store: Path
) -> None:
    """SIGTERM cancels the run's task: the calls in flight are cancelled with it (structured),
    the review locks are released, nothing is written — and the next run reviews them all."""
    with FeedFarm(feeds=1, items=20, thumbnails=True) as farm, ModelStandIn(1.0) as model:
        await add_farm_sources(db, farm)
        async with inline(db, fresh_db_url, model, store, NEWS_AI_CONCURRENCY="4") as runtime:
            run = asyncio.create_task(run_shard(runtime, SystemClock(), "s"))
            await wait_for(lambda: _asked(model, 4), within=20, what="4 calls in flight", poll=0.02)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            asked = sum(model.reviews.values())
            await asyncio.sleep(1.5)
            assert sum(model.reviews.values()) == asked == 4  # nothing more once cancelled
            locks = await db.fetch_one(
                "SELECT count(*) AS n FROM nightcrew.leases WHERE name LIKE 'news:review:%%'"
            )
            assert locks is not None and locks["n"] == 0
            assert await db.fetch_one("SELECT 1 FROM news.articles") is None
            again = await run_shard(runtime, SystemClock(), "s")
    assert again.processed_count == 20


async def _asked(model: ModelStandIn, n: int) -> bool:
    return sum(model.reviews.values()) >= n  # counted as they arrive
