"""Lane dispatch: which jobs a lane runs, each isolated, and the run record around them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

import structlog

from nightcrew import runs
from nightcrew.adapters.queues import MemoryQueueProducer
from nightcrew.clock import Clock
from nightcrew.lifecycle import watchdogs
from nightcrew.log import describe_error, error, event
from nightcrew.runtime import Runtime

Trigger = Literal["manual", "scheduled"]

WATCHDOG_ACTIONS = ("items_requeued", "links_requeued", "previews_canceled", "media_jobs_flagged")

# spec 000's cron expressions, in UTC.
LANE_CRON: dict[str, str] = {"minute": "* * * * *"}


class SweepReport(Protocol):
    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    name: str  # the spec's function name, e.g. sweepStalledImports
    failed_event: str  # the spec's event when it throws
    run: Callable[[Runtime, Clock], Awaitable[SweepReport]]


MINUTE_SWEEPS: tuple[Sweep, ...] = (
    Sweep(
        name="sweepStalledImports",
        failed_event="import_watchdog_failed",
        run=watchdogs.sweep_stalled_imports,
    ),
    Sweep(
        name="sweepStalledExternalLinks",
        failed_event="external_link_watchdog_failed",
        run=watchdogs.sweep_stalled_external_links,
    ),
    Sweep(
        name="sweepStuckHostingMigrationPreviews",
        failed_event="hosting_migration_preview_watchdog_failed",
        run=watchdogs.sweep_stuck_hosting_migration_previews,
    ),
    Sweep(
        name="sweepWedgedMediaJobs",
        failed_event="media_job_watchdog_failed",
        run=watchdogs.sweep_wedged_media_jobs,
    ),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepOutcome:
    name: str
    duration_ms: float
    report: dict[str, Any] | None = None
    error: str | None = None
    failed_event: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def count(self, key: str) -> int:
        return int(self.report.get(key, 0)) if self.report else 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "duration_ms": self.duration_ms}
        if self.report is not None:
            body.update(self.report)
        if self.error is not None:
            body["error"] = self.error
        return body


@dataclass(frozen=True, kw_only=True, slots=True)
class MinuteLaneReport:
    now: datetime
    sweeps: list[SweepOutcome]
    duration_ms: float
    run_id: int | None = None
    dry_run: bool = False
    errors: list[dict[str, str]] = field(default_factory=list)

    def total(self, key: str) -> int:
        return sum(s.count(key) for s in self.sweeps)

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": "minute",
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            "now": self.now.isoformat(),
            **{action: self.total(action) for action in WATCHDOG_ACTIONS},
            "errors": self.errors,
            "duration_ms": self.duration_ms,
            "sweeps": {s.name: s.to_json() for s in self.sweeps},
        }


async def _isolated(sweep: Sweep, runtime: Runtime, clock: Clock) -> SweepOutcome:
    started = time.perf_counter()
    try:
        report = await sweep.run(runtime, clock)
    except Exception as exc:  # isolation is the point: one sweep never stops the others
        message = describe_error(exc)
        error(sweep.failed_event, sweep=sweep.name, error=message)
        return SweepOutcome(
            name=sweep.name,
            duration_ms=_ms_since(started),
            error=message,
            failed_event=sweep.failed_event,
        )
    return SweepOutcome(name=sweep.name, duration_ms=_ms_since(started), report=report.to_json())


async def run_minute_sweeps(
    runtime: Runtime, clock: Clock, *, sweeps: tuple[Sweep, ...] = MINUTE_SWEEPS
) -> MinuteLaneReport:
    """One tick: the sweeps run concurrently; a sweep that throws is logged, the rest finish."""
    started = time.perf_counter()
    now = clock.now()
    outcomes = list(await asyncio.gather(*(_isolated(s, runtime, clock) for s in sweeps)))
    report = MinuteLaneReport(
        now=now,
        sweeps=outcomes,
        duration_ms=_ms_since(started),
        errors=[
            {"sweep": o.name, "event": o.failed_event or "", "error": o.error or ""}
            for o in outcomes
            if not o.ok
        ],
    )
    event(
        "import_watchdog_completed",
        **{action: report.total(action) for action in WATCHDOG_ACTIONS},
        errors=len(report.errors),
        duration_ms=report.duration_ms,
    )
    return report


LANES: dict[str, Callable[[Runtime, Clock], Awaitable[MinuteLaneReport]]] = {
    "minute": run_minute_sweeps,
}


async def run_lane(
    runtime: Runtime,
    clock: Clock,
    lane: str,
    *,
    trigger: Trigger = "manual",
    slot: datetime | None = None,
    dry_run: bool = False,
) -> MinuteLaneReport | None:
    """Run a lane inside a run record. A scheduled slot another replica already claimed → None.

    A dry run executes the same claims against a rollback-only view of the database and a
    recording queue, so it reports exactly what a run would do and changes nothing — not even
    the run history.
    """
    body = LANES.get(lane)
    if body is None:
        raise ValueError(f"unknown lane {lane!r}; known lanes: {', '.join(LANES)}")
    if dry_run:
        if trigger == "scheduled":
            raise ValueError("scheduled runs are never dry runs")
        return await _dry_run(runtime, clock, lane, body)

    now = clock.now()
    if trigger == "scheduled":
        if slot is None:
            raise ValueError("a scheduled run needs its slot")
        run_id = await runs.claim_slot(runtime.db, lane=lane, slot=slot, now=now)
        if run_id is None:
            return None
    else:
        run_id = await runs.start_manual(runtime.db, lane=lane, now=now)

    _started(lane, trigger=trigger, run_id=run_id, slot=slot)
    metrics = runtime.metrics
    try:
        report = await body(runtime, clock)
    except Exception as exc:
        message = describe_error(exc)
        error("lifecycle_cron_failed", lane=lane, run_id=run_id, error=message)
        metrics.inc("nightcrew_lane_runs_total", lane=lane, status="failed")
        await runs.finish(
            runtime.db, run_id, status="failed", now=clock.now(), report={"error": message}
        )
        raise
    report = replace(report, run_id=run_id)
    await runs.finish(
        runtime.db, run_id, status="completed", now=clock.now(), report=report.to_json()
    )
    metrics.inc("nightcrew_lane_runs_total", lane=lane, status="completed")
    metrics.set("nightcrew_lane_run_duration_seconds", report.duration_ms / 1000, lane=lane)
    metrics.set("nightcrew_lane_last_success_timestamp_seconds", clock.now().timestamp(), lane=lane)
    for outcome in report.sweeps:
        if not outcome.ok:
            metrics.inc("nightcrew_job_failures_total", lane=lane, job=outcome.name)
    for action in WATCHDOG_ACTIONS:
        metrics.inc("nightcrew_watchdog_actions_total", report.total(action), action=action)
    return report


async def _dry_run(
    runtime: Runtime,
    clock: Clock,
    lane: str,
    body: Callable[[Runtime, Clock], Awaitable[MinuteLaneReport]],
) -> MinuteLaneReport:
    view = replace(runtime, db=runtime.db.rollback_only(), queues=MemoryQueueProducer(clock))
    with structlog.contextvars.bound_contextvars(dry_run=True):
        _started(lane, trigger="manual", run_id=None, slot=None)
        report = await body(view, clock)
    return replace(report, dry_run=True)


def _started(lane: str, *, trigger: Trigger, run_id: int | None, slot: datetime | None) -> None:
    event(
        "lifecycle_cron_started",
        cron=LANE_CRON[lane],
        lane=lane,
        trigger=trigger,
        run_id=run_id,
        slot=slot.isoformat() if slot else None,
    )


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
