"""Run history: one ``nightcrew.runs`` row per lane run, and the per-slot claim for schedules.

A running run keeps a heartbeat (``heartbeat_at``, every ``HEARTBEAT_SECONDS``). The next run of
its lane marks a ``running`` row whose heartbeat is older than ``ABANDON_AFTER_SECONDS``
``abandoned``; a scheduled slot whose run was abandoned, or failed because the database went
away, can be claimed again (``attempts`` counts the claims). A claim is a handle (id, attempt):
a run that was given up on and comes back late cannot finish the row its successor holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeVar

from nightcrew.clock import Clock
from nightcrew.db.database import Database, json_param
from nightcrew.db.deadlines import statement_deadline
from nightcrew.db.queries import load_queries
from nightcrew.errors import DatabaseUnavailableError, NightcrewError
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error, warning

SQL = load_queries(__file__)

RunStatus = Literal["completed", "failed"]
Report = TypeVar("Report")
HEARTBEAT_SECONDS = 10.0
# Six missed heartbeats: long enough for a database blip, short enough that the next minute
# lane run (or the daily catch-up a minute later) takes over a dead run's slot.
ABANDON_AFTER_SECONDS = 60.0
# How long a run that lost the database waits to record its failure before it gives up (the
# next run of its lane marks it abandoned instead): the CLI exits within its bound.
FINISH_AFTER_LOSS_SECONDS = 5.0

# Told the ids of the runs just marked abandoned (the lane's metrics count them).
OnAbandoned = Callable[[list[int]], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunHandle:
    """A run this process holds (a claimed slot's: ``claim_scheduled_slot``)."""

    id: int
    attempt: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class _Abandoned:
    id: int
    slot: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunningRun:
    """The run of a lane that is running (``LaneBusy`` names it)."""

    id: int
    trigger: str
    slot: datetime | None
    started_at: datetime
    requested_by: str | None


async def abandon_stale(
    db: Database, *, lane: str, now: datetime, on_abandoned: OnAbandoned | None = None
) -> list[int]:
    abandoned = await db.fetch_as(
        _Abandoned,
        SQL["abandon_stale"],
        {"lane": lane, "now": now, "grace_seconds": ABANDON_AFTER_SECONDS},
    )
    for run in abandoned:
        warning(
            "run_abandoned",
            lane=lane,
            run_id=run.id,
            slot=run.slot.isoformat() if run.slot else None,
        )
    ids = [run.id for run in abandoned]
    if ids and on_abandoned is not None:
        on_abandoned(ids)
    return ids


async def claim(
    db: Database,
    *,
    lane: str,
    slot: datetime,
    now: datetime,
    on_abandoned: OnAbandoned | None = None,
) -> RunHandle | None:
    """Claim a scheduled slot; its handle if this caller won it, None if another replica did.
    A stale running run of the lane is marked abandoned first (its slot can then be claimed)."""
    await abandon_stale(db, lane=lane, now=now, on_abandoned=on_abandoned)
    async with db.transaction() as tx:
        await tx.execute(SQL["lane_lock"], {"lane": lane})
        return await tx.fetch_one_as(
            RunHandle, SQL["claim_scheduled_slot"], {"lane": lane, "slot": slot, "now": now}
        )


class LaneBusy(NightcrewError):
    """An operator's "run now" of a lane that is running already (one run, one report)."""

    def __init__(self, lane: str, running: RunningRun | None) -> None:
        self.lane = lane
        self.running_id = running.id if running else None
        if running is None:
            what = "a run of it started at the same instant"
        else:
            who = running.requested_by or running.trigger
            what = f"run {running.id} ({who}, started {running.started_at:%H:%M:%S} UTC)"
        super().__init__(f"lane {lane} is running already: {what}; nothing was started")


async def start_manual(
    db: Database,
    *,
    lane: str,
    now: datetime,
    on_abandoned: OnAbandoned | None = None,
    requested_by: str | None = None,
) -> int:
    """A manual run's row. ``requested_by`` (an operator's run: "cli", "dashboard ADDRESS")
    makes it exclusive: LaneBusy while a run of the lane runs, and no scheduled slot of the
    lane is claimed until it ends."""
    await abandon_stale(db, lane=lane, now=now, on_abandoned=on_abandoned)
    async with db.transaction() as tx:
        await tx.execute(SQL["lane_lock"], {"lane": lane})
        started = await tx.fetch_value(
            int, SQL["start_manual_run"], {"lane": lane, "now": now, "requested_by": requested_by}
        )
        if started is None:
            running = await tx.fetch_one_as(RunningRun, SQL["running_run"], {"lane": lane})
            raise LaneBusy(lane, running)
    return started


async def finish(
    db: Database,
    handle: RunHandle,
    *,
    status: RunStatus,
    now: datetime,
    report: JsonObject,
) -> None:
    await db.execute(
        SQL["finish_run"],
        {
            "id": handle.id,
            "attempt": handle.attempt,
            "status": status,
            "now": now,
            "report": json_param(report),
        },
    )


class RunSuperseded(NightcrewError):
    """This run's row was given up (abandoned, then claimed again by another run): it stops."""


@contextlib.asynccontextmanager
async def heartbeat(
    db: Database, handle: RunHandle, clock: Clock, *, every: float = HEARTBEAT_SECONDS
) -> AsyncIterator[None]:
    """Refresh the run's heartbeat while the body runs. A failed beat is only logged: the
    database being away is the body's problem to report, and a run whose beats stop is what
    ``abandoned`` is for. A beat that finds the row no longer this run's (it went without
    beats long enough to be abandoned, and another run took the slot) stops the body with
    RunSuperseded: two copies of one slot never run on.

    When the body ends, a beat in flight is let finish (it is bounded by its interval) rather
    than cancelled — cancelling a statement makes psycopg ask a possibly silent server to
    cancel it, which costs up to 10 s more — unless the body lost the database."""
    body = asyncio.current_task()
    superseded = False
    stop = asyncio.Event()

    async def beat() -> None:
        nonlocal superseded
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await stop.wait()
            if stop.is_set():
                return
            try:
                # a beat slower than its interval is a failed beat: bounded by it
                with statement_deadline(every):
                    touched = await db.execute(
                        SQL["heartbeat"],
                        {"id": handle.id, "attempt": handle.attempt, "now": clock.now()},
                    )
            except Exception as exc:
                warning("run_heartbeat_failed", run_id=handle.id, error=str(exc))
                continue
            if touched == 0 and body is not None and not stop.is_set():
                warning("run_superseded", run_id=handle.id, attempt=handle.attempt)
                superseded = True
                body.cancel()
                return

    task = asyncio.create_task(beat())
    try:
        yield
    except DatabaseUnavailableError:
        # the beat in flight is doomed too (most likely waiting for a connection, which is
        # cancelled at no cost): the run's end must not wait out its bound
        task.cancel()
        raise
    except asyncio.CancelledError:
        if not superseded or body is None:
            raise
        body.uncancel()
        raise RunSuperseded(
            f"run {handle.id} was given up and its slot claimed again; this copy stopped"
        ) from None
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Which run ``recorded`` records, and who hears of it: ``lane``'s scheduled ``slot``, or
    (None) a manual run, an operator's when ``requested_by`` names them (see ``start_manual``).
    ``on_started`` hears the run's handle once its row exists (a page answers with it before
    the run ends); ``on_failure`` what the work raised; ``on_abandoned`` the ids of the lane's
    dead runs this run marked abandoned."""

    lane: str
    slot: datetime | None = None
    requested_by: str | None = None
    on_started: Callable[[RunHandle], None] | None = None
    on_failure: Callable[[RunHandle, BaseException], None] | None = None
    on_abandoned: OnAbandoned | None = None
    heartbeat_every: float = HEARTBEAT_SECONDS


async def recorded(
    db: Database,
    clock: Clock,
    run: RunSpec,
    work: Callable[[RunHandle], Awaitable[Report]],
    report_json: Callable[[Report], JsonObject],
) -> Report | None:
    """One recorded run: claim the scheduled slot (or start a manual run) → heartbeat while
    ``work`` runs → finish ``completed`` with its report, or ``failed`` (with ``retry: true``
    when the database went away, so the slot may be claimed again). A slot another replica
    won → None. Cancellation (Ctrl-C, SIGTERM) finishes the row too."""
    lane, slot, on_abandoned = run.lane, run.slot, run.on_abandoned
    now = clock.now()
    if slot is not None:
        handle = await claim(db, lane=lane, slot=slot, now=now, on_abandoned=on_abandoned)
        if handle is None:
            return None
    else:
        run_id = await start_manual(
            db, lane=lane, now=now, on_abandoned=on_abandoned, requested_by=run.requested_by
        )
        handle = RunHandle(id=run_id)
    if run.on_started is not None:
        run.on_started(handle)
    try:
        async with heartbeat(db, handle, clock, every=run.heartbeat_every):
            result = await work(handle)
    except BaseException as exc:
        if run.on_failure is not None:
            run.on_failure(handle, exc)
        lost = isinstance(exc, DatabaseUnavailableError)
        # Once the database is lost, one short try: a run that cannot record its end is
        # marked abandoned by the next run, and the process must not linger for it.
        with (
            contextlib.suppress(Exception),
            statement_deadline(FINISH_AFTER_LOSS_SECONDS if lost else None),
        ):
            await asyncio.shield(
                finish(
                    db,
                    handle,
                    status="failed",
                    now=clock.now(),
                    report={"error": describe_error(exc), "retry": lost},
                )
            )
        raise
    await finish(db, handle, status="completed", now=clock.now(), report=report_json(result))
    return result


async def slot_owed(db: Database, lane: str, slot: datetime) -> bool:
    """Whether ``lane``'s scheduled ``slot`` has yet to run (the scheduler would claim it)."""
    return bool(await db.fetch_value(bool, SQL["slot_owed"], {"lane": lane, "slot": slot}))
