"""The scheduler loop against real PostgreSQL: it fires at the slot, once across replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import lane_schedule
from nightcrew.scheduler import Scheduler
from tests.conftest import make_runtime


class Timeline:
    """Scheduler sleeps that end when the test moves the frozen clock past their wake time, not
    when real time passes: a loaded machine cannot make a replica miss or double a slot."""

    def __init__(self, clock: FrozenClock) -> None:
        self.clock = clock
        self.wakes: list[datetime] = []  # every sleep's wake instant, in call order
        self._moved = asyncio.Condition()

    async def sleep(self, seconds: float) -> None:
        wake = self.clock.now() + timedelta(seconds=seconds)
        async with self._moved:
            self.wakes.append(wake)
            self._moved.notify_all()
            await self._moved.wait_for(lambda: self.clock.now() >= wake)

    async def move_to(self, at: datetime) -> None:
        async with self._moved:
            self.clock.set(at)
            self._moved.notify_all()

    async def until(self, ready: Callable[[], bool]) -> None:
        async with asyncio.timeout(30), self._moved:
            await self._moved.wait_for(ready)


async def test_two_replicas_tick_the_minute_slot_and_only_one_runs_it(
    db: Database, fresh_db_url: str
) -> None:
    slot = datetime(2026, 11, 29, 4, 1, tzinfo=UTC)
    clock = FrozenClock(slot - timedelta(seconds=30))
    timeline = Timeline(clock)
    other_db = await Database.open(fresh_db_url)
    try:
        replicas = []
        for d in (db, other_db):
            rt = await make_runtime(d, clock, fresh_db_url)
            replicas.append(
                Scheduler(rt, clock, (lane_schedule(rt, clock, "minute"),), sleep=timeline.sleep)
            )
        tasks = [asyncio.create_task(r.run()) for r in replicas]
        await timeline.until(lambda: timeline.wakes.count(slot) == 2)  # both wait for the slot
        await timeline.move_to(slot)
        # Both woke and fired (each fire is a task of its own) once both wait for the next slot;
        # stopping a scheduler awaits its in-flight fires, so both claims are settled below.
        next_slot = slot + timedelta(minutes=1)
        await timeline.until(lambda: timeline.wakes.count(next_slot) == 2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await other_db.close()
    rows = await db.fetch("SELECT lane, trigger, slot, status FROM nightcrew.runs")
    assert len(rows) == 1
    [row] = rows
    assert row["trigger"] == "scheduled" and row["status"] == "completed"
    assert row["slot"] == slot


async def test_a_failing_fire_is_logged_and_the_loop_survives(
    db: Database, fresh_db_url: str
) -> None:
    """The run history is gone: every fire fails. The loop logs each failure and keeps
    ticking (slots come every 0.2 s here: a sleep that fast-forwards the clock)."""
    from structlog.testing import capture_logs

    clock = FrozenClock(datetime(2026, 11, 29, 4, 0, 30, tzinfo=UTC))

    async def fast_sleep(seconds: float) -> None:
        clock.advance(timedelta(seconds=seconds))
        await asyncio.sleep(0.05)

    rt = await make_runtime(db, clock, fresh_db_url)
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


# --- the run record's liveness: catch-up re-checks, heartbeats, superseded runs ----------------
DAILY_SLOT = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)


async def test_the_daily_slot_is_rechecked_every_minute_and_rerun_once_its_dead_run_is_stale(
    db: Database, fresh_db_url: str
) -> None:
    """Another replica claimed the 04:00 daily slot and died (its row `running`, heartbeat
    04:00:00). This replica starts at 04:00:30: the start-up catch-up finds the slot held (the
    heartbeat is not stale yet), and the loop — on an injected clock whose sleeps advance it —
    re-checks the slot every RECHECK_SECONDS inside the catch-up window: the first re-check
    past the grace period marks the dead run abandoned and runs the slot (attempts 2)."""
    from structlog.testing import capture_logs

    from nightcrew import runs
    from nightcrew.scheduler import RECHECK_SECONDS

    await db.execute(
        "INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, heartbeat_at, status)"
        " VALUES ('daily', 'scheduled', %(slot)s, %(slot)s, %(slot)s, 'running')",
        {"slot": DAILY_SLOT},
    )
    clock = FrozenClock(DAILY_SLOT + timedelta(seconds=30))
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(timedelta(seconds=seconds))
        await asyncio.sleep(0.01)

    rt = await make_runtime(db, clock, fresh_db_url)
    scheduler = Scheduler(rt, clock, (lane_schedule(rt, clock, "daily"),), sleep=sleep)

    async def completed() -> bool:
        row = await db.fetch_one(
            "SELECT status FROM nightcrew.runs WHERE lane = 'daily' AND slot = %(s)s",
            {"s": DAILY_SLOT},
        )
        return row is not None and row["status"] == "completed"

    with capture_logs() as logs:
        loop = asyncio.create_task(scheduler.run())
        try:
            for _ in range(400):
                if await completed():
                    break
                await asyncio.sleep(0.05)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    [row] = await db.fetch(
        "SELECT status, attempts, started_at, report FROM nightcrew.runs WHERE lane = 'daily'"
    )
    assert row["status"] == "completed" and row["attempts"] == 2, row
    # Not at start-up (04:00:30: the heartbeat was 30 s old), but at the first re-check after
    # the grace period: 04:01:30, one RECHECK_SECONDS later.
    assert runs.ABANDON_AFTER_SECONDS < 90 <= runs.ABANDON_AFTER_SECONDS + RECHECK_SECONDS
    assert row["started_at"] == DAILY_SLOT + timedelta(seconds=90), row
    assert slept[0] == RECHECK_SECONDS
    assert [e["slot"] for e in logs if e["event"] == "run_abandoned"] == [DAILY_SLOT.isoformat()]
    metrics = rt.metrics
    slots = "nightcrew_scheduler_slots_total"
    assert metrics.value(slots, lane="daily", outcome="ran") == 1
    # the start-up catch-up, while the dead run's heartbeat was still fresh
    assert metrics.value(slots, lane="daily", outcome="claimed_elsewhere") >= 1
    assert metrics.value("nightcrew_lane_runs_total", lane="daily", status="abandoned") == 1


async def test_the_heartbeat_advances_during_a_long_run_and_keeps_it_from_being_abandoned(
    db: Database,
) -> None:
    """A run that takes minutes (the clock moves on while it works) keeps refreshing its
    heartbeat with the clock's time, so another replica's abandon check leaves it alone."""
    from nightcrew import runs

    clock = FrozenClock(DAILY_SLOT)
    handle = await runs.claim(db, lane="daily", slot=DAILY_SLOT, now=clock.now())
    assert handle is not None

    async def heartbeat_at() -> datetime:
        row = await db.fetch_one(
            "SELECT heartbeat_at FROM nightcrew.runs WHERE id = %(id)s", {"id": handle.id}
        )
        assert row is not None
        return row["heartbeat_at"]  # type: ignore[no-any-return]

    async with runs.heartbeat(db, handle, clock, every=0.05):
        for minutes in (1, 2, 5):
            clock.set(DAILY_SLOT + timedelta(minutes=minutes))
            for _ in range(200):  # a beat comes every 0.05 s: wait for one after the move
                if await heartbeat_at() == clock.now():
                    break
                await asyncio.sleep(0.02)
            assert await heartbeat_at() == clock.now()
            assert await runs.abandon_stale(db, lane="daily", now=clock.now()) == []

    # The beats stopped with the run: past the grace period it is abandoned.
    later = clock.now() + timedelta(seconds=runs.ABANDON_AFTER_SECONDS + 1)
    assert await runs.abandon_stale(db, lane="daily", now=later) == [handle.id]


async def test_a_superseded_run_stops_and_leaves_its_successors_row_alone(
    db: Database,
) -> None:
    """A run whose row was marked abandoned (its beats were late) and whose slot another run
    claimed again: its next beat finds the row no longer its own, its work is stopped with
    RunSuperseded, and its failure is not written over the successor's row."""
    from nightcrew import runs

    clock = FrozenClock(DAILY_SLOT)
    started = asyncio.Event()
    stopped = False

    async def long_work(handle: runs.RunHandle) -> dict[str, int]:
        nonlocal stopped
        started.set()
        try:
            await asyncio.Event().wait()  # works until stopped
        except asyncio.CancelledError:
            stopped = True
            raise
        return {}

    first = asyncio.create_task(
        runs.recorded(
            db,
            clock,
            runs.RunSpec(lane="daily", slot=DAILY_SLOT, heartbeat_every=0.05),
            long_work,
            report_json=dict,
        )
    )
    async with asyncio.timeout(10):
        await started.wait()
    # the first run's row given up (as abandon_stale does), and the slot claimed again
    await db.execute(
        "UPDATE nightcrew.runs SET status = 'abandoned' WHERE lane = 'daily' AND slot = %(s)s",
        {"s": DAILY_SLOT},
    )
    successor = await runs.claim(db, lane="daily", slot=DAILY_SLOT, now=clock.now())
    assert successor is not None and successor.attempt == 2

    with pytest.raises(runs.RunSuperseded):
        async with asyncio.timeout(10):
            await first
    assert stopped
    row = await db.fetch_one(
        "SELECT status, attempts, finished_at FROM nightcrew.runs WHERE id = %(id)s",
        {"id": successor.id},
    )
    assert row == {"status": "running", "attempts": 2, "finished_at": None}
    await runs.finish(db, successor, status="completed", now=clock.now(), report={})
    done = await db.fetch_one(
        "SELECT status FROM nightcrew.runs WHERE id = %(id)s", {"id": successor.id}
    )
    assert done == {"status": "completed"}


async def test_serve_knows_before_it_starts_which_missed_slot_it_will_run(
    db: Database, fresh_db_url: str
) -> None:
    """A first start (no run history) inside the daily slot's catch-up window owes that slot
    (serve says so before it runs it); a slot some replica ran, or one past the window, is not."""
    slot = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
    clock = FrozenClock(slot + timedelta(hours=2))
    rt = await make_runtime(db, clock, fresh_db_url)
    daily, minute = lane_schedule(rt, clock, "daily"), lane_schedule(rt, clock, "minute")
    scheduler = Scheduler(rt, clock, (daily, minute))
    assert [(s.name, at) for s, at in await scheduler.owed()] == [("daily", slot)]
    await db.execute(
        "INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, heartbeat_at, status)"
        " VALUES ('daily', 'scheduled', %(slot)s, %(slot)s, %(slot)s, 'completed')",
        {"slot": slot},
    )
    assert await scheduler.owed() == []
    await db.execute("UPDATE nightcrew.runs SET status = 'abandoned'")
    assert [at for _, at in await scheduler.owed()] == [slot]  # run again, so owed again
    clock.set(slot + daily.catch_up + timedelta(minutes=1))
    assert await scheduler.owed() == []
