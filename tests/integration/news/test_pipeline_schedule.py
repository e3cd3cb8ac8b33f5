"""serve's news schedule in pipeline mode (NEWS_PIPELINE=rabbitmq): the scheduled runner runs
a pass — it enqueues the shard's due sources to the fetch queue and holds no shard lock (an
inline run holding the shard does not stop it) — and records the run with the pass's report;
another replica firing the same slot runs nothing."""

from __future__ import annotations

from pathlib import Path

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.outbox import broker_of
from nightcrew.news.schedule import news_schedules
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.scheduler import Scheduler
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq


async def test_the_scheduled_runner_enqueues_a_pass_without_the_shard_lock_and_records_it(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, NEWS_SHARDS="s", NEWS_RUN_INTERVAL_MINUTES="5"
    )
    clock = SystemClock()
    slot = clock.now().replace(second=0, microsecond=0)
    with FeedFarm(feeds=3, items=2) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            # an inline run of the shard (on another machine, mid-switch) holds its lease
            leases = runtime.news_adapters().leases
            held = await leases.acquire(shard_lock_name("s"), 600)
            assert held is not None
            [schedule] = news_schedules(runtime, clock)
            assert schedule.name == "news:s" and schedule.cron == "*/5 * * * *"
            scheduler = Scheduler(runtime, clock, (schedule,))
            assert await scheduler.fire(schedule.name, slot) is True
            assert await scheduler.fire(schedule.name, slot) is False  # the slot is taken
            assert await broker_of(runtime).ready("fetch") == 3  # the due sources, once
            # the lease was neither taken nor needed: still ours, untouched
            assert await leases.extend(held, 600) is True
            await leases.release(held)

    rows = await db.fetch(
        "SELECT lane, trigger, status, slot, report FROM nightcrew.runs ORDER BY id"
    )
    assert [(r["lane"], r["trigger"], r["status"], r["slot"]) for r in rows] == [
        ("news:s", "scheduled", "completed", slot)
    ]
    report = rows[0]["report"]
    assert report["pipeline"] == "rabbitmq" and report["trigger"] == "scheduled"
    assert report["skipped"] is False and report["lockedCount"] == 0
    assert report["enqueuedSources"] == 3
    assert await count(db, "SELECT count(*) FROM news.sources WHERE fetch_queued_at IS NULL") == 0
    saved = await db.fetch("SELECT trigger, report FROM news.worker_reports WHERE shard = 's'")
    assert [(r["trigger"], r["report"]["enqueuedSources"]) for r in saved] == [("scheduled", 3)]
