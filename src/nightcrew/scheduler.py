"""The cron loop: fires each schedule's runner at its slots, knowing nothing of what it runs.

Replicas do not talk to each other. Each one wakes at every slot and calls the schedule's
runner, which claims the slot in ``nightcrew.runs`` on the unique (lane, slot) pair (see
``runs.recorded``) and says whether this replica won it; the others log nothing and sleep until
the next slot. A slot run that overruns the next slot does not delay it: every fire is its own
task. The domains export their schedules: ``lifecycle.lanes.lifecycle_schedules`` and
``news.schedule.news_schedules``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter

from nightcrew.clock import Clock
from nightcrew.log import describe_error, error, event
from nightcrew.runtime import Runtime

# Runs the slot; True if this replica won the slot's claim and ran it.
Runner = Callable[[datetime], Awaitable[bool]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    name: str
    cron: str
    runner: Runner
    # A replica starting after a missed slot still runs it if it is at most this late (the
    # slot claim keeps it to one run); zero: the next slot is near enough.
    catch_up: timedelta = timedelta(0)


def next_slot(cron: str, after: datetime) -> datetime:
    """The first slot of ``cron`` strictly after ``after`` (UTC)."""
    value: datetime = croniter(cron, after).get_next(datetime)
    return value


def previous_slot(cron: str, at: datetime) -> datetime:
    """The last slot of ``cron`` at or before ``at`` (UTC)."""
    value: datetime = croniter(cron, at + timedelta(microseconds=1)).get_prev(datetime)
    return value


# A lane with a catch-up window re-checks its last slot this often while it waits for the next:
# a run abandoned, or failed for want of a database, is run again once the database is back.
RECHECK_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True)
class ScheduleStatus:
    """One schedule as this process's scheduler sees it (the dashboard's health section)."""

    name: str
    cron: str
    last_tick: datetime | None  # when this process last fired it
    next_slot: datetime


class Scheduler:
    def __init__(
        self,
        runtime: Runtime,
        clock: Clock,
        schedules: tuple[Schedule, ...],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._runtime = runtime
        self._clock = clock
        self._schedules = schedules
        self._by_name = {s.name: s for s in schedules}
        self._sleep = sleep
        self._inflight: set[asyncio.Task[None]] = set()
        self._last_ticks: dict[str, datetime] = {}

    async def fire(self, name: str, slot: datetime) -> bool:
        """Run schedule ``name`` for ``slot``; True if this replica won the slot and ran it."""
        schedule = self._by_name[name]
        self._last_ticks[name] = self._clock.now()
        self._runtime.metrics.set(
            "nightcrew_scheduler_last_tick_timestamp_seconds", self._clock.now().timestamp()
        )
        try:
            won = await schedule.runner(slot)
        except Exception as exc:  # the loop must outlive a bad run or a database blip
            error(
                "scheduler_fire_failed", lane=name, slot=slot.isoformat(), error=describe_error(exc)
            )
            return False
        self._runtime.metrics.inc(
            "nightcrew_scheduler_slots_total",
            lane=name,
            outcome="ran" if won else "claimed_elsewhere",
        )
        return won

    def status(self) -> list[ScheduleStatus]:
        now = self._clock.now()
        return [
            ScheduleStatus(
                name=s.name,
                cron=s.cron,
                last_tick=self._last_ticks.get(s.name),
                next_slot=next_slot(s.cron, now),
            )
            for s in self._schedules
        ]

    async def owed(self) -> list[tuple[Schedule, datetime]]:
        """The missed slots this scheduler will run as soon as it starts (within their
        catch-up window, and not run by any replica): what ``serve`` says before it does."""
        from nightcrew.runs import slot_owed

        now, owed = self._clock.now(), []
        for schedule in self._schedules:
            if schedule.catch_up <= timedelta(0):
                continue
            missed = previous_slot(schedule.cron, now)
            if now - missed <= schedule.catch_up and await slot_owed(
                self._runtime.db, schedule.name, missed
            ):
                owed.append((schedule, missed))
        return owed

    async def catch_up(self, schedule: Schedule) -> bool:
        """A slot that no replica ran to the end (a deploy at 04:00, an outage, a run that
        died or lost the database)? Run it late, within the catch-up window, rather than skip a
        day. If a replica ran it (or runs it now), its claim says so and this is a no-op."""
        if schedule.catch_up <= timedelta(0):
            return False
        missed = previous_slot(schedule.cron, self._clock.now())
        if self._clock.now() - missed > schedule.catch_up:
            return False
        return await self.fire(schedule.name, missed)

    async def _loop(self, schedule: Schedule) -> None:
        await self.catch_up(schedule)
        last: datetime | None = None
        while True:
            # From the last fired slot, not just "now": a sleep that wakes a hair early must
            # not fire the same slot twice.
            now = self._clock.now()
            slot = next_slot(schedule.cron, max(now, last) if last else now)
            last = slot
            while (delay := (slot - self._clock.now()).total_seconds()) > 0:
                if schedule.catch_up <= timedelta(0) or delay <= RECHECK_SECONDS:
                    await self._sleep(delay)
                    break
                await self._sleep(RECHECK_SECONDS)
                await self.catch_up(schedule)
            task = asyncio.create_task(self._fire_quietly(schedule, slot))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _fire_quietly(self, schedule: Schedule, slot: datetime) -> None:
        await self.fire(schedule.name, slot)

    async def run(self) -> None:
        """Tick every schedule until cancelled; in-flight runs are awaited on the way out."""
        event("scheduler_started", schedules={s.name: s.cron for s in self._schedules})
        loops = [asyncio.create_task(self._loop(s)) for s in self._schedules]
        try:
            await asyncio.gather(*loops)
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            event("scheduler_stopped")
