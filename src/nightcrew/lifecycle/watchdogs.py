"""The minute lane's self-healing sweeps (spec 000 "Fast lane" and the media_jobs watchdog).

Each sweep is a function of (Runtime, Clock) → a frozen report. It claims its rows in one
statement (see watchdogs.sql; another replica's claim skips them), commits, then sends. A send
that fails is logged and its claim undone — the timestamp the claim bumped is put back — so the
next tick finds the row due again instead of a whole threshold later; the consumers ack-skip a
duplicate.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from nightcrew.adapters.queues import EXTERNAL_EPISODE_LINK, PODCAST_IMPORTS
from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.errors import QueueError, QueueMisconfiguredError
from nightcrew.jsonable import Jsonable, JsonObject, named
from nightcrew.log import describe_error, error, event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# --- sweepStalledImports (spec 000, "Stalled-Import Watchdog") -------------------------------
# Per-attempt rescue threshold = backoff(attempts) max + 60 s grace, for attempts 1..4.
ATTEMPTS_THRESHOLDS_SECONDS: dict[int, int] = {1: 67, 2: 85, 3: 160, 4: 410}
# Safety cap for attempts >= 5 (the executor terminalises before this in practice).
STALLED_IMPORT_THRESHOLD_MINUTES = 10
# Only for rows predating podcast_imports.dispatch_end_at (rolling-upgrade transition).
STALLED_IMPORT_LEGACY_FALLBACK_MINUTES = 25
# Excludes rows whose updated_at was bumped in the previous minute: no duplicate resends.
STALLED_IMPORT_RESEND_COOLDOWN_SECONDS = 60
# How long a processing claim may sit before its worker is assumed dead.
STALLED_PROCESSING_THRESHOLD_MINUTES = 10
# Upper bound on re-dispatches per tick (rescued processing rows included).
STALLED_IMPORT_MAX_RESEND = 500
# attempts = 0 rows are aged from the parent's dispatch_end_at plus this propagation grace
# (DESIGN §6: the last delayed message needs a moment to surface before it counts as lost).
STALLED_IMPORT_DISPATCH_GRACE_SECONDS = 30

# --- sweepStalledExternalLinks ----------------------------------------------------------------
STALLED_LINK_GRACE_SECONDS = 90
STALLED_LINK_RESEND_COOLDOWN_SECONDS = 90
STALLED_LINK_MAX_RESEND = 500

# --- sweepStuckHostingMigrationPreviews --------------------------------------------------------
STUCK_HOSTING_MIGRATION_PREVIEW_MINUTES = 15
STUCK_HOSTING_MIGRATION_PREVIEW_MAX = 50

# --- sweepWedgedMediaJobs (media plane) ------------------------------------------------------
WEDGED_MEDIA_JOB_HOURS = 3
# The spec names no per-tick bound for this sweep; every other sweep has one, so it does too.
WEDGED_MEDIA_JOB_MAX = 500
WEDGED_MEDIA_JOB_ERROR = "watchdog: no progress for 3 hours (wedged workflow or lost spawn)"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _minutes(now: datetime, since: datetime) -> float:
    return round((now - since).total_seconds() / 60, 1)


# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StalledImport(Jsonable):
    """An import with stalled items, as the report and import_watchdog_found_stalled name it."""

    import_id: str = named("import_id")
    count: int
    oldest_stale_minutes: float = named("oldest_stale_minutes")


@dataclass(frozen=True, kw_only=True, slots=True)
class StalledImportsReport:
    items_requeued: int = 0
    items_rescued: int = 0
    imports: list[StalledImport] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "items_requeued": self.items_requeued,
            "items_rescued": self.items_rescued,
            "items_resend_failed": len(self.errors),
        }

    def to_json(self) -> JsonObject:
        return {
            **self.counts(),
            "imports": [i.to_json() for i in self.imports],
            "errors": self.errors,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class _ClaimedItem:
    """An import item the watchdog claimed to send again (both claim queries return it)."""

    import_item_id: UUID
    import_id: UUID
    podcast_id: UUID
    attempts: int
    stale_since: datetime
    claimed_from: datetime | None  # what an undone claim puts back


@dataclass(frozen=True, kw_only=True, slots=True)
class _ClaimedLink:
    episode_id: UUID
    podcast_id: UUID
    attempt: int
    previous_next_attempt_at: datetime | None
    target_published_at: datetime | None


async def sweep_stalled_imports(runtime: Runtime, clock: Clock) -> StalledImportsReport:
    """Re-dispatch podcast-imports messages that evidently never reached the executor.

    Rescued processing rows are claimed and sent before pending rows are claimed, so a failure
    in the second half never strands rows the first half already took.
    """
    now = clock.now()
    errors: list[Failure] = []
    rescued = await runtime.db.fetch_as(
        _ClaimedItem,
        SQL["rescue_stalled_processing_items"],
        {
            "now": now,
            "processing_threshold_seconds": STALLED_PROCESSING_THRESHOLD_MINUTES * 60,
            "limit": STALLED_IMPORT_MAX_RESEND,
        },
    )
    if rescued:
        event(
            "import_watchdog_rescued_processing",
            count=len(rescued),
            import_item_ids=[str(r.import_item_id) for r in rescued],
        )
    sent, usable = await _resend_items(
        runtime, rescued, "import_watchdog_rescue_resend_failed", errors, now
    )

    pending: list[_ClaimedItem] = []
    if usable and len(rescued) < STALLED_IMPORT_MAX_RESEND:
        pending = await runtime.db.fetch_as(
            _ClaimedItem,
            SQL["claim_stalled_pending_items"],
            {
                "now": now,
                "cooldown_seconds": STALLED_IMPORT_RESEND_COOLDOWN_SECONDS,
                "dispatch_grace_seconds": STALLED_IMPORT_DISPATCH_GRACE_SECONDS,
                "legacy_seconds": STALLED_IMPORT_LEGACY_FALLBACK_MINUTES * 60,
                "attempt_thresholds": [
                    ATTEMPTS_THRESHOLDS_SECONDS[n] for n in sorted(ATTEMPTS_THRESHOLDS_SECONDS)
                ],
                "cap_seconds": STALLED_IMPORT_THRESHOLD_MINUTES * 60,
                "limit": STALLED_IMPORT_MAX_RESEND - len(rescued),
            },
        )

    by_import: dict[str, list[datetime]] = defaultdict(list)
    for item in (*rescued, *pending):
        by_import[str(item.import_id)].append(item.stale_since)
    imports = [
        StalledImport(
            import_id=import_id,
            count=len(stale),
            oldest_stale_minutes=_minutes(now, min(stale)),
        )
        for import_id, stale in sorted(by_import.items())
    ]
    for summary in imports:
        event("import_watchdog_found_stalled", **summary.to_json())
    more, _ = await _resend_items(runtime, pending, "import_watchdog_resend_failed", errors, now)
    sent += more

    return StalledImportsReport(
        items_requeued=sent, items_rescued=len(rescued), imports=imports, errors=errors
    )


async def _resend_items(
    runtime: Runtime,
    rows: list[_ClaimedItem],
    failure_event: str,
    errors: list[Failure],
    now: datetime,
) -> tuple[int, bool]:
    """Each claimed row's message sent; the claims of those that failed undone together.
    (sent, whether the queue is usable): a queue that cannot be used at all (its table missing,
    the broker refusing it) is said once, as spec 000's import_watchdog_misconfigured, and
    nothing more is sent this tick."""
    sent = 0
    usable = True
    failed: list[_ClaimedItem] = []
    for index, item in enumerate(rows):
        body = {
            "import_id": str(item.import_id),
            "import_item_id": str(item.import_item_id),
            "podcast_id": str(item.podcast_id),
        }
        try:
            await runtime.queues.send(PODCAST_IMPORTS, body)
            sent += 1
        except QueueMisconfiguredError as exc:
            _misconfigured("import_watchdog_misconfigured", PODCAST_IMPORTS, exc, errors)
            failed.extend(rows[index:])
            usable = False
            break
        except QueueError as exc:
            failure = {"event": failure_event, **body, "error": describe_error(exc)}
            warning(**failure)
            errors.append(failure)
            failed.append(item)
    if failed:
        await runtime.db.execute(
            SQL["unclaim_import_items"],
            {
                "ids": [r.import_item_id for r in failed],
                "claimed_from": [r.claimed_from for r in failed],
                "now": now,
            },
        )
    return sent, usable


def _misconfigured(name: str, queue: str, exc: QueueError, errors: list[Failure]) -> None:
    failure: Failure = {"event": name, "queue": queue, "error": describe_error(exc)}
    error(**failure)
    errors.append(failure)


# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StalledLinksReport:
    links_requeued: int = 0
    null_next_attempt: int = 0
    skipped_no_target: int = 0
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "links_requeued": self.links_requeued,
            "links_null_next_attempt": self.null_next_attempt,
            "links_skipped_no_target": self.skipped_no_target,
            "links_resend_failed": len(self.errors),
        }

    def to_json(self) -> JsonObject:
        return {**self.counts(), "errors": self.errors}


async def sweep_stalled_external_links(runtime: Runtime, clock: Clock) -> StalledLinksReport:
    """Re-enqueue external-episode-link messages that are overdue (lost initial or retry)."""
    now = clock.now()
    rows = await runtime.db.fetch_as(
        _ClaimedLink,
        SQL["claim_stalled_external_links"],
        {
            "now": now,
            "grace_seconds": STALLED_LINK_GRACE_SECONDS,
            "cooldown_seconds": STALLED_LINK_RESEND_COOLDOWN_SECONDS,
            "limit": STALLED_LINK_MAX_RESEND,
        },
    )
    sent = null_next = no_target = 0
    errors: list[Failure] = []
    failed: list[_ClaimedLink] = []
    for index, link in enumerate(rows):
        ids = {"episode_id": str(link.episode_id), "podcast_id": str(link.podcast_id)}
        if link.previous_next_attempt_at is None:
            null_next += 1
            warning("external_link_watchdog_null_next_attempt", **ids)
        if link.target_published_at is None:
            # Nothing to link against; the claim still pushed next_attempt_at, so this row
            # is reported at most once per cooldown instead of starving the 500 cap.
            no_target += 1
            warning("external_link_watchdog_skipped_no_target", **ids)
            continue
        body = {
            **ids,
            "attempt": link.attempt,
            "target_published_at": _iso(link.target_published_at),
        }
        try:
            await runtime.queues.send(EXTERNAL_EPISODE_LINK, body)
            sent += 1
        except QueueMisconfiguredError as exc:
            _misconfigured(
                "external_link_watchdog_misconfigured", EXTERNAL_EPISODE_LINK, exc, errors
            )
            failed.extend(r for r in rows[index:] if r.target_published_at is not None)
            break
        except QueueError as exc:
            failure = {
                "event": "external_link_watchdog_resend_failed",
                **ids,
                "error": describe_error(exc),
            }
            warning(**failure)
            errors.append(failure)
            failed.append(link)
    if failed:  # due again on the next tick, not a cooldown later
        await runtime.db.execute(
            SQL["unclaim_external_links"],
            {
                "ids": [r.episode_id for r in failed],
                "previous": [r.previous_next_attempt_at for r in failed],
                "claimed_until": now + timedelta(seconds=STALLED_LINK_RESEND_COOLDOWN_SECONDS),
            },
        )
    if sent:
        event("external_link_watchdog_resent", count=sent)
    return StalledLinksReport(
        links_requeued=sent,
        null_next_attempt=null_next,
        skipped_no_target=no_target,
        errors=errors,
    )


# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StuckPreviewsReport:
    previews_canceled: int = 0
    import_ids: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Failure]:
        return []

    def counts(self) -> dict[str, int]:
        return {"previews_canceled": self.previews_canceled}

    def to_json(self) -> JsonObject:
        return {**self.counts(), "import_ids": self.import_ids}


async def sweep_stuck_hosting_migration_previews(
    runtime: Runtime, clock: Clock
) -> StuckPreviewsReport:
    """Cancel hosting-migration rows wedged in preview, which would 409 every retry."""
    canceled = await runtime.db.fetch_values(
        UUID,
        SQL["cancel_stuck_hosting_migration_previews"],
        {
            "now": clock.now(),
            "threshold_seconds": STUCK_HOSTING_MIGRATION_PREVIEW_MINUTES * 60,
            "limit": STUCK_HOSTING_MIGRATION_PREVIEW_MAX,
        },
    )
    ids = [str(c) for c in canceled]
    if ids:
        event("hosting_migration_preview_watchdog_canceled", count=len(ids), import_ids=ids)
    return StuckPreviewsReport(previews_canceled=len(ids), import_ids=ids)


# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class WedgedMediaJobsReport:
    media_jobs_flagged: int = 0
    job_ids: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Failure]:
        return []

    def counts(self) -> dict[str, int]:
        return {"media_jobs_flagged": self.media_jobs_flagged}

    def to_json(self) -> JsonObject:
        return {**self.counts(), "job_ids": self.job_ids}


async def sweep_wedged_media_jobs(runtime: Runtime, clock: Clock) -> WedgedMediaJobsReport:
    """Fail media jobs that made no progress for 3 hours and notify their waiters.

    The flag and the notifications commit together: NOTIFY is delivered at commit, so a waiter
    never hears of a failure that was rolled back, nor misses one that stuck.
    """
    async with runtime.db.transaction() as tx:
        flagged = await tx.fetch_values(
            UUID,
            SQL["fail_wedged_media_jobs"],
            {
                "now": clock.now(),
                "threshold_seconds": WEDGED_MEDIA_JOB_HOURS * 3600,
                "limit": WEDGED_MEDIA_JOB_MAX,
                "error": WEDGED_MEDIA_JOB_ERROR,
            },
        )
        ids = [str(f) for f in flagged]
        if ids:
            await tx.execute(SQL["notify_media_job_results"], {"job_ids": ids})
    if ids:
        event("media_job_watchdog_flagged", count=len(ids), job_ids=ids)
    return WedgedMediaJobsReport(media_jobs_flagged=len(ids), job_ids=ids)
