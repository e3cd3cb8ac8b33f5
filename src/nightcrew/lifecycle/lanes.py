"""Lanes: which jobs run together, each isolated, inside a run record.

The minute lane runs its sweeps concurrently (spec 000: Promise.all with per-sweep catches);
the daily lane runs its jobs one after another, in the spec's order. Either way a job that
throws is logged under its spec event name, lands in the report, and never stops the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

import structlog

from nightcrew import runs
from nightcrew.clock import Clock, SlotClock
from nightcrew.db.deadlines import statement_deadline
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle import (
    deletions,
    overage,
    pauses,
    signups,
    storage_reconcile,
    watchdogs,
)
from nightcrew.log import describe_error, error, event
from nightcrew.reports import Failure, JobReport
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Schedule

Trigger = Literal["manual", "scheduled"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    name: str  # the spec's function name, e.g. sweepStalledImports
    failed_event: str  # the spec's event when the whole job throws
    run: Callable[[Runtime, Clock], Awaitable[JobReport]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Lane:
    name: str
    cron: str  # spec 000's schedule, UTC
    jobs: tuple[Job, ...]
    concurrent: bool
    completed_event: str
    # A replica starting after a missed slot still runs it if it is at most this late (the
    # slot claim keeps it to one run); zero for the minute lane, whose next slot is near.
    catch_up: timedelta = timedelta(0)
    # Every statement of the lane is short, so a silent database is called lost after
    # NIGHTCREW_DB_MINUTE_STATEMENT_TIMEOUT_SECONDS rather than the pool's long bound.
    short_statements: bool = False
    # the completed event's counts that are there whatever happened (spec 000: "each 0 on idle
    # ticks" — and on a tick whose sweep threw, which reports no counts of its own)
    always_counts: tuple[str, ...] = ()


MINUTE = Lane(
    name="minute",
    cron="* * * * *",
    concurrent=True,
    short_statements=True,
    completed_event="import_watchdog_completed",
    always_counts=("items_requeued", "links_requeued", "previews_canceled"),
    jobs=(
        Job(
            name="sweepStalledImports",
            failed_event="import_watchdog_failed",
            run=watchdogs.sweep_stalled_imports,
        ),
        Job(
            name="sweepStalledExternalLinks",
            failed_event="external_link_watchdog_failed",
            run=watchdogs.sweep_stalled_external_links,
        ),
        Job(
            name="sweepStuckHostingMigrationPreviews",
            failed_event="hosting_migration_preview_watchdog_failed",
            run=watchdogs.sweep_stuck_hosting_migration_previews,
        ),
        Job(
            name="sweepWedgedMediaJobs",
            failed_event="media_job_watchdog_failed",
            run=watchdogs.sweep_wedged_media_jobs,
        ),
        Job(
            name="deliverEffects",
            failed_event="effects_delivery_failed",
            # the drain, and the overage stages its emails claim (spec 000: claims follow
            # the send)
            run=overage.deliver_and_claim,
        ),
    ),
)

DAILY = Lane(
    name="daily",
    cron="0 4 * * *",
    concurrent=False,
    completed_event="lifecycle_cron_completed",
    catch_up=timedelta(hours=12),
    jobs=(
        Job(
            name="reactivateExpiredPauses",
            failed_event="pause_expiry_failed",
            run=pauses.reactivate_expired_pauses,
        ),
        Job(
            name="hardDeleteExpiredPodcasts",
            failed_event="hard_deletion_failed",
            run=deletions.hard_delete_expired_podcasts,
        ),
        Job(
            name="reapUnconfirmedUsers",
            failed_event="unconfirmed_users_reap_failed",
            run=signups.reap_unconfirmed_users,
        ),
        Job(
            name="runReconcile",
            failed_event="scheduled_reconcile_failed",
            run=storage_reconcile.scheduled_reconcile,
        ),
        Job(
            name="runOverageEscalation",
            failed_event="overage_escalation_failed",
            run=overage.run_overage_escalation,
        ),
    ),
)

LANES: dict[str, Lane] = {lane.name: lane for lane in (MINUTE, DAILY)}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOutcome:
    name: str
    duration_ms: float
    report: JsonObject | None = None  # the job's own report, as its to_json wrote it
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[Failure] = field(default_factory=list)
    crashed: str | None = None  # the job itself threw
    skipped: str | None = None  # the job did not run, and why

    @property
    def ok(self) -> bool:
        return self.crashed is None

    @property
    def status(self) -> str:
        if self.crashed is not None:
            return "failed"
        return "skipped" if self.skipped else "ok"

    def count(self, key: str) -> int:
        return self.counts.get(key, 0)

    def to_json(self) -> JsonObject:
        # the job's own report, flattened beside how it went (durationMs: as every report says it)
        body: JsonObject = {
            "ok": self.ok,
            "status": self.status,
            "durationMs": self.duration_ms,
        }
        if self.report is not None:
            body.update(self.report)
        if self.crashed is not None:
            body["error"] = self.crashed
        return body


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneReport:
    lane: str
    now: datetime
    jobs: list[JobOutcome]
    duration_ms: float
    run_id: int | None = None
    dry_run: bool = False

    def total(self, key: str) -> int:
        return sum(j.count(key) for j in self.jobs)

    @property
    def totals(self) -> dict[str, int]:
        merged: Counter[str] = Counter()
        for job in self.jobs:
            merged.update(job.counts)  # zero counts stay: an idle lane still reports them
        return dict(merged)

    @property
    def errors(self) -> list[Failure]:
        out: list[Failure] = []
        for job in self.jobs:
            out.extend({"job": job.name, **failure} for failure in job.errors)
        return out

    def to_json(self) -> JsonObject:
        # the jobs' counts summed at the top, their failures gathered, each job by its name
        return {
            "lane": self.lane,
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            "now": self.now.isoformat(),
            **self.totals,
            "errors": self.errors,
            "durationMs": self.duration_ms,
            "jobs": {j.name: j.to_json() for j in self.jobs},
        }


# After a job lost its connection: how long the lane asks the database whether it still
# answers before it stops (a cut session is not a database that is gone). The minute lane asks
# for less: its stop with a silent database is bounded (10 s a statement, 30 s a run).
DATABASE_CHECK_SECONDS = 5.0
MINUTE_DATABASE_CHECK_SECONDS = 3.0
DATABASE_CHECK_PAUSE_SECONDS = 0.5


async def _database_answers(runtime: Runtime, within: float) -> bool:
    """Whether the database answers on a fresh connection (the pool drops a broken one)
    within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while True:
                try:
                    await runtime.db.fetch_one("SELECT 1")
                    return True
                except DatabaseUnavailableError:
                    await asyncio.sleep(DATABASE_CHECK_PAUSE_SECONDS)
    except TimeoutError:
        return False


async def _isolated(job: Job, runtime: Runtime, clock: Clock, lane: Lane) -> JobOutcome:
    started = time.perf_counter()
    try:
        report = await job.run(runtime, clock)
    except Exception as exc:  # isolation is the point: one job never stops the others
        # A job whose connection was cut (a pooler's lifetime, pg_terminate_backend) fails
        # alone, as any failure, and the next job starts on a healthy connection (spec 000: a
        # reconcile failure cannot block the rest of daily maintenance; the minute lane's
        # sweeps each have their own catch). A database that stays unreachable stops the
        # lane (run_jobs), its slot retried.
        # A silent database (no reply in time) stops the minute lane at once: asking it again
        # would only add the check's own wait to its bounded stop. The daily lane asks even
        # then: one silent connection (a NAT or firewall that dropped the reconciler's long
        # session) must not cost the overage escalation its day.
        within = MINUTE_DATABASE_CHECK_SECONDS if lane.short_statements else DATABASE_CHECK_SECONDS
        if isinstance(exc, DatabaseUnavailableError) and (
            (exc.silent and lane.short_statements) or not await _database_answers(runtime, within)
        ):
            raise
        message = describe_error(exc)
        error(job.failed_event, job=job.name, error=message)
        return JobOutcome(
            name=job.name,
            duration_ms=_ms_since(started),
            crashed=message,
            errors=[{"event": job.failed_event, "error": message}],
        )
    return JobOutcome(
        name=job.name,
        duration_ms=_ms_since(started),
        report=report.to_json(),
        counts=report.counts(),
        errors=list(report.errors),
        skipped=getattr(report, "skipped", None),
    )


# Told (job name, jobs finished, jobs in the lane) as each job starts and ends: what a
# terminal shows while a long run works (`lifecycle run daily` on a tty).
JobProgress = Callable[[str, int, int], None]


async def run_jobs(
    runtime: Runtime, clock: Clock, lane: Lane, progress: JobProgress | None = None
) -> LaneReport:
    """Run every job of a lane once, isolated, and log the lane's completion event."""
    started = time.perf_counter()
    now = clock.now()
    done = 0

    async def one(job: Job) -> JobOutcome:
        nonlocal done
        if progress is not None:
            progress(job.name, done, len(lane.jobs))
        outcome = await _isolated(job, runtime, clock, lane)
        done += 1
        if progress is not None:
            progress(job.name, done, len(lane.jobs))
        return outcome

    if lane.concurrent:
        results = await asyncio.gather(*(one(j) for j in lane.jobs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result  # the database went away: every sweep saw it, one line says so
        outcomes = [r for r in results if isinstance(r, JobOutcome)]
    else:
        outcomes = [await one(j) for j in lane.jobs]
    report = LaneReport(
        lane=lane.name,
        now=now,
        jobs=outcomes,
        duration_ms=_ms_since(started),
        dry_run=runtime.dry_run,
    )
    event(
        lane.completed_event,
        lane=lane.name,
        **{**dict.fromkeys(lane.always_counts, 0), **report.totals},
        errors=len(report.errors),
        duration_ms=report.duration_ms,
    )
    return report


async def run_lane(
    runtime: Runtime,
    clock: Clock,
    lane_name: str,
    *,
    trigger: Trigger = "manual",
    slot: datetime | None = None,
    dry_run: bool = False,
    progress: JobProgress | None = None,
    requested_by: str | None = None,
    on_started: Callable[[runs.RunHandle], None] | None = None,
) -> LaneReport | None:
    """Run a lane inside a run record. A scheduled slot another replica already claimed → None.
    An operator's manual run (``requested_by``) is exclusive: runs.LaneBusy while the lane runs.

    A dry run executes the same statements against a rollback-only view of the database, with
    a recording queue, a read-only store, and billing and feed-cache stand-ins that call
    nothing: it reports exactly what a run would do and changes nothing — not even the run
    history.
    """
    lane = LANES.get(lane_name)
    if lane is None:
        raise ValueError(f"unknown lane {lane_name!r}; known lanes: {', '.join(LANES)}")
    if dry_run:
        if trigger == "scheduled":
            raise ValueError("scheduled runs are never dry runs")
        with structlog.contextvars.bound_contextvars(dry_run=True):
            _started(lane, trigger="manual", run_id=None, slot=None)
            return await run_jobs(runtime.dry_run_view(clock), clock, lane, progress)

    if trigger == "scheduled" and slot is None:
        raise ValueError("a scheduled run needs its slot")
    claimed_slot = slot if trigger == "scheduled" else None
    # A scheduled run decides as of its slot, not the instant the tick fired: a cooldown of
    # 60 s means two slots, whatever the timer's jitter.
    decide: Clock = SlotClock(claimed_slot, clock) if claimed_slot is not None else clock

    started = False

    async def work(handle: runs.RunHandle) -> LaneReport:
        nonlocal started
        started = True
        _started(lane, trigger=trigger, run_id=handle.id, slot=slot)
        return replace(await run_jobs(runtime, decide, lane, progress), run_id=handle.id)

    def failed(handle: runs.RunHandle, exc: BaseException) -> None:
        error(
            "lifecycle_cron_failed",
            cron=lane.cron,
            lane=lane.name,
            run_id=handle.id,
            error=describe_error(exc),
        )
        runtime.metrics.inc("nightcrew_lane_runs_total", lane=lane.name, status="failed")

    def abandoned(ids: list[int]) -> None:
        runtime.metrics.inc(
            "nightcrew_lane_runs_total", len(ids), lane=lane.name, status="abandoned"
        )

    deadline = runtime.settings.db_minute_statement_timeout_seconds
    try:
        with statement_deadline(deadline if lane.short_statements else None):
            run = runs.RunSpec(
                lane=lane.name,
                slot=claimed_slot,
                requested_by=requested_by,
                on_started=on_started,
                on_failure=failed,
                on_abandoned=abandoned,
            )
            report = await runs.recorded(
                runtime.db, clock, run, work, report_json=LaneReport.to_json
            )
    except Exception as exc:
        if not started and not isinstance(exc, runs.LaneBusy):
            could_not_start(lane.name, trigger=trigger, slot=slot, exc=exc)
        raise
    if report is not None:
        _record_metrics(runtime, clock, report)
    return report


def lane_schedule(runtime: Runtime, clock: Clock, lane_name: str) -> Schedule:
    """The scheduler's view of a lifecycle lane: its cron, its catch-up window, and a runner
    that runs the lane for a slot (False when another replica claimed it)."""
    lane = LANES[lane_name]

    async def runner(slot: datetime) -> bool:
        report = await run_lane(runtime, clock, lane.name, trigger="scheduled", slot=slot)
        return report is not None

    return Schedule(name=lane.name, cron=lane.cron, runner=runner, catch_up=lane.catch_up)


def lifecycle_schedules(runtime: Runtime, clock: Clock) -> tuple[Schedule, ...]:
    return tuple(lane_schedule(runtime, clock, name) for name in LANES)


def _record_metrics(runtime: Runtime, clock: Clock, report: LaneReport) -> None:
    metrics, lane = runtime.metrics, report.lane
    metrics.inc("nightcrew_lane_runs_total", lane=lane, status="completed")
    metrics.set("nightcrew_lane_run_duration_seconds", report.duration_ms / 1000, lane=lane)
    metrics.set("nightcrew_lane_last_success_timestamp_seconds", clock.now().timestamp(), lane=lane)
    for job in report.jobs:
        if not job.ok:
            metrics.inc("nightcrew_job_failures_total", lane=lane, job=job.name)
        for key, value in job.counts.items():
            metrics.inc("nightcrew_job_items_total", value, lane=lane, count=key)


def could_not_start(
    lane_name: str, *, trigger: Trigger, slot: datetime | None, exc: BaseException
) -> None:
    """A run that could not start (the database down at the slot: no run record, no claim)
    still says what monitoring waits for: spec 000's lifecycle_cron_started, then
    lifecycle_cron_failed with the cron and the reason."""
    lane = LANES[lane_name]
    _started(lane, trigger=trigger, run_id=None, slot=slot)
    error(
        "lifecycle_cron_failed",
        cron=lane.cron,
        lane=lane.name,
        run_id=None,
        error=describe_error(exc),
        started=False,
    )


def _started(lane: Lane, *, trigger: Trigger, run_id: int | None, slot: datetime | None) -> None:
    event(
        "lifecycle_cron_started",
        cron=lane.cron,
        lane=lane.name,
        trigger=trigger,
        run_id=run_id,
        slot=slot.isoformat() if slot else None,
    )


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
