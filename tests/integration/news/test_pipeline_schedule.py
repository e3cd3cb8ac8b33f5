"""serve's news schedule in pipeline mode (NEWS_PIPELINE=rabbitmq): the scheduled runner runs
a pass under the shard lock, as an inline run — an inline run holding the shard (on another
machine, mid-switch) makes it a skipped pass, recorded as such, that enqueues nothing — and
records the run with the pass's report; another replica firing the same slot runs nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.schedule import news_schedules
from nightcrew.news.steps.leases import shard_lock_name
from nightcrew.scheduler import Scheduler
from tests.integration.news.pipeline_support import (
    add_farm_sources,
    count,
    pipeline_env,
    pipeline_runtime,
    worker_running,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import FeedFarm, ModelStandIn

pytestmark = needs_rabbitmq


async def test_the_scheduled_runner_runs_a_pass_under_the_shard_lock_and_records_it(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, NEWS_SHARDS="s", NEWS_RUN_INTERVAL_MINUTES="5"
    )
    clock = SystemClock()
    slot = clock.now().replace(second=0, microsecond=0)
    later = slot + timedelta(minutes=5)
    with FeedFarm(feeds=3, items=2) as farm:
        await add_farm_sources(db, farm)
        async with pipeline_runtime(env, db) as runtime:
            # an inline run of the shard (on another machine, mid-switch) holds its lock
            leases = runtime.news_adapters().leases
            held = await leases.acquire(shard_lock_name("s"), 600)
            assert held is not None
            [schedule] = news_schedules(runtime, clock)
            assert schedule.name == "news:s" and schedule.cron == "*/5 * * * *"
            scheduler = Scheduler(runtime, clock, (schedule,))
            assert await scheduler.fire(schedule.name, slot) is True
            assert await scheduler.fire(schedule.name, slot) is False  # the slot is taken
            assert await broker_of(runtime).ready("fetch") == 0  # skipped: nothing enqueued
            assert await leases.extend(held, 600) is True  # the lock is still the run's
            await leases.release(held)
            async with worker_running(runtime, ["fetch"]):
                assert await scheduler.fire(schedule.name, later) is True

    rows = await db.fetch(
        "SELECT lane, trigger, status, slot, report FROM nightcrew.runs ORDER BY id"
    )
    assert [(r["lane"], r["trigger"], r["status"], r["slot"]) for r in rows] == [
        ("news:s", "scheduled", "completed", slot),
        ("news:s", "scheduled", "completed", later),
    ]
    skipped, ran = (r["report"] for r in rows)
    assert skipped["pipeline"] == "rabbitmq" and skipped["trigger"] == "scheduled"
    assert skipped["skipped"] is True and skipped["lockedCount"] == 1
    assert skipped["enqueuedSources"] == 0
    assert ran["skipped"] is False and ran["lockedCount"] == 0
    assert ran["enqueuedSources"] == 3 and ran["admittedCount"] == 6
    assert await count(db, "SELECT count(*) FROM news.sources WHERE fetch_queued_at IS NULL") == 3
    saved = await db.fetch(
        "SELECT trigger, report FROM news.worker_reports WHERE shard = 's' ORDER BY id"
    )
    assert [(r["trigger"], r["report"]["enqueuedSources"]) for r in saved] == [
        ("scheduled", 0),
        ("scheduled", 3),
    ]
