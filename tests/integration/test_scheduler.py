"""The scheduler loop against real PostgreSQL: it fires at the slot, once across replicas."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import lane_schedule
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Scheduler
from tests.conftest import make_runtime


class ShiftedClock:
    """Real time, shifted so that the next minute boundary is a fraction of a second away."""

    def __init__(self, seconds_to_boundary: float) -> None:
        real = SystemClock().now()
        boundary = real.replace(second=0, microsecond=0) + timedelta(minutes=1)
        self._shift = boundary - real - timedelta(seconds=seconds_to_boundary)

    def now(self) -> datetime:
        return SystemClock().now() + self._shift


async def test_two_replicas_tick_the_minute_slot_and_only_one_runs_it(
    db: Database, runtime: Runtime, fresh_db_url: str
) -> None:
    clock = ShiftedClock(seconds_to_boundary=0.3)
    other_db = await Database.open(fresh_db_url)
    try:
        replicas = []
        for d in (db, other_db):
            rt = make_runtime(d, clock, fresh_db_url)
            replicas.append(Scheduler(rt, clock, (lane_schedule(rt, clock, "minute"),)))
        tasks = [asyncio.create_task(r.run()) for r in replicas]
        # wait on the outcome, not a fixed sleep: the slot fires 0.3 s in, whatever the load
        for _ in range(200):
            await asyncio.sleep(0.05)
            done = await db.fetch("SELECT 1 FROM nightcrew.runs WHERE status = 'completed'")
            if done:
                break
        await asyncio.sleep(0.2)  # the other replica's claim, had it won too, would show now
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await other_db.close()
    rows = await db.fetch("SELECT lane, trigger, slot, status FROM nightcrew.runs")
    assert len(rows) == 1
    [row] = rows
    assert row["trigger"] == "scheduled" and row["status"] == "completed"
    assert row["slot"].second == 0 and row["slot"].microsecond == 0


async def test_a_failing_fire_is_logged_and_the_loop_survives(
    db: Database, fresh_db_url: str
) -> None:
    """The run history is gone: every fire fails. The loop logs each failure and keeps
    ticking (slots come every 0.2 s here: a sleep that fast-forwards the clock)."""
    from structlog.testing import capture_logs

    from nightcrew.clock import FrozenClock

    clock = FrozenClock(datetime(2026, 11, 29, 4, 0, 30, tzinfo=UTC))

    async def fast_sleep(seconds: float) -> None:
        clock.advance(timedelta(seconds=seconds))
        await asyncio.sleep(0.05)

    rt = make_runtime(db, clock, fresh_db_url)
    await db.execute("DROP TABLE nightcrew.runs CASCADE")
    scheduler = Scheduler(rt, clock, (lane_schedule(rt, clock, "minute"),), sleep=fast_sleep)
    with capture_logs() as logs:
        loop = asyncio.create_task(scheduler.run())
        try:
            for _ in range(100):
                await asyncio.sleep(0.05)
                failures = [e for e in logs if e["event"] == "scheduler_fire_failed"]
                if len(failures) >= 3:
                    break
            assert not loop.done(), "the loop died with the first failing fire"
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
    failures = [e for e in logs if e["event"] == "scheduler_fire_failed"]
    assert len(failures) >= 3  # three slots in a row, each logged, the loop still ticking
    assert {e["lane"] for e in failures} == {"minute"}
    assert len({e["slot"] for e in failures}) == len(failures)  # each its own slot
