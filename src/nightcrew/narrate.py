"""Run reports in words: what each job did, and why — for the demo and the dashboard.

A lane run's report (``LaneReport.to_json()``, stored in ``nightcrew.runs.report``) is read
field by field with ``.get`` and defaults: reports written by older versions, or cut short by a
crash, lack fields, and the words must still come out. ``name`` turns an id into what a person
calls it (the demo knows its sample's titles; the dashboard uses the slug the report carries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nightcrew.lifecycle import watchdogs as wd

Name = Callable[[str, Any], str]  # (id, the report item it came from) → a name


def short_name(row_id: str, item: Any = None) -> str:
    """The report's slug when it has one, else the id's first 8 characters."""
    if isinstance(item, dict) and item.get("slug"):
        return f"“{item['slug']}”"
    return str(row_id)[:8]


def _jobs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    jobs = report.get("jobs")
    return jobs if isinstance(jobs, dict) else {}


def minute_sentences(report: dict[str, Any], name: Name = short_name) -> list[str]:
    jobs = _jobs(report)
    lines: list[str] = []
    if (imports := jobs.get("sweepStalledImports")) is not None:
        lines.append(
            f"{imports.get('items_requeued', 0)} lost podcast-imports message(s) re-sent "
            f"({imports.get('items_rescued', 0)} of them rescued from a 'processing' claim older "
            f"than {wd.STALLED_PROCESSING_THRESHOLD_MINUTES} minutes: its worker is presumed "
            f"dead). A pending item with 1 attempt is stalled after "
            f"{wd.ATTEMPTS_THRESHOLDS_SECONDS[1]} s."
        )
        if failed := imports.get("items_resend_failed", 0):
            lines.append(f"{failed} import re-send(s) failed; the next minute tries again.")
    if (links := jobs.get("sweepStalledExternalLinks")) is not None:
        lines.append(
            f"{links.get('links_requeued', 0)} external-episode-link message(s) re-sent: the link "
            f"was past due by more than {wd.STALLED_LINK_GRACE_SECONDS} s; its next attempt is "
            f"pushed {wd.STALLED_LINK_RESEND_COOLDOWN_SECONDS} s out, same attempt."
        )
    previews = jobs.get("sweepStuckHostingMigrationPreviews") or {}
    for import_id in previews.get("import_ids", []):
        lines.append(
            f"{name(import_id, None)} was canceled: stuck in preview for more than "
            f"{wd.STUCK_HOSTING_MIGRATION_PREVIEW_MINUTES} minutes, it would have blocked every"
            " retry with a 409."
        )
    media = jobs.get("sweepWedgedMediaJobs") or {}
    for job_id in media.get("job_ids", []):
        lines.append(
            f"{name(job_id, None)} was marked failed: no progress for more than "
            f"{wd.WEDGED_MEDIA_JOB_HOURS} hours, and its waiters were notified."
        )
    if (drain := jobs.get("deliverEffects")) is not None and any(
        drain.get(k, 0) for k in ("effects_delivered", "effects_retried", "effects_dead")
    ):
        lines.append(
            f"effects outbox: {drain.get('effects_delivered', 0)} delivered, "
            f"{drain.get('effects_retried', 0)} to be retried, "
            f"{drain.get('effects_dead', 0)} given up."
        )
    return lines


def daily_sentences(report: dict[str, Any], name: Name = short_name) -> list[str]:
    jobs = _jobs(report)
    lines: list[str] = []
    for podcast in (jobs.get("reactivateExpiredPauses") or {}).get("podcasts", []):
        billing = podcast.get("billing") or {}
        outcome = billing.get("outcome", "unknown")
        lines.append(
            f"{name(podcast['podcast_id'], podcast)}: its pause ended, so it is active again. "
            f"Billing resume: {outcome} ({billing.get('reason', outcome)})."
        )
    for podcast in (jobs.get("hardDeleteExpiredPodcasts") or {}).get("podcasts", []):
        via = podcast.get("invalidated_via") or "NOT YET — will retry"
        lines.append(
            f"{name(podcast['podcast_id'], podcast)}: its deletion date passed, so the podcast "
            f"and everything under it were deleted — {podcast.get('objects_deleted', 0)} "
            f"file(s), {podcast.get('bytes_deleted', 0):,} bytes from storage; feed cache told "
            f"via {via}."
        )
    leftovers = (jobs.get("hardDeleteExpiredPodcasts") or {}).get("cleanup_leftovers", 0)
    if leftovers:
        lines.append(f"{leftovers} earlier deletion(s) still have storage or a feed to clean.")
    recon = (jobs.get("runReconcile") or {}).get("report") or {}
    if recon:
        size, orphans = recon.get("sizeBackfill", {}), recon.get("orphans", {})
        lines.append(
            f"storage reconciler: {size.get('written', 0)} episode size(s) had never been "
            f"recorded, so the measured sizes were written; {orphans.get('deleted', 0)} orphaned "
            "upload(s) that no episode references, older than the 24-hour guard, deleted after "
            f"a last database check ({orphans.get('protectedPendingInvalidation', 0)} kept: "
            "their feed's invalidation is still pending); "
            f"{recon.get('missing', {}).get('count', 0)} episode(s) pointing at a missing file "
            "(reported only: the daily run never quarantines)."
        )
    elif skipped := (jobs.get("runReconcile") or {}).get("skipped"):
        lines.append(f"storage reconciler skipped: {skipped}.")
    overage = jobs.get("runOverageEscalation") or {}
    if overage:
        lines.append(
            f"overage escalation: {overage.get('armed', 0)} account(s) newly over their plan "
            f"(the 30-day clock started), {overage.get('emails_sent', 0)} warning email(s) sent, "
            f"{overage.get('suspended_podcasts', 0)} feed(s) suspended, "
            f"{overage.get('restored_accounts', 0)} account(s) restored; nothing is paused "
            "before day 30, and nothing is ever deleted."
        )
    reap = jobs.get("reapUnconfirmedUsers")
    if reap is not None:
        lines.append(
            f"{reap.get('users_reaped', 0)} unconfirmed signup(s) older than "
            f"{reap.get('retention_days', 7)} days deleted, "
            f"{reap.get('users_reap_skipped', 0)} skipped."
        )
    return lines


def news_sentences(report: dict[str, Any]) -> list[str]:
    """A news shard run (inline) or pass (pipeline)."""
    if report.get("skipped"):
        return [f"skipped: {report.get('reason') or 'another worker held the shard'}."]
    lines = [
        f"{report.get('queuedCount', 0)} new story(ies) found, "
        f"{report.get('processedCount', 0)} written, {report.get('acceptedCount', 0)} accepted, "
        f"{report.get('rejectedCount', 0)} rejected.",
    ]
    if deferred := report.get("deferredCount", 0):
        reasons = ", ".join(str(r) for r in report.get("deferredReasons", [])) or "no reason given"
        lines.append(f"{deferred} deferred to a later run ({reasons}); nothing is dropped.")
    if errors := report.get("fetchErrors", []):
        lines.append(f"{len(errors)} feed(s) could not be fetched.")
    return lines


def lane_sentences(lane: str, report: dict[str, Any], name: Name = short_name) -> list[str]:
    """Every sentence for one run of ``lane``, failures last."""
    if lane == "minute":
        lines = minute_sentences(report, name)
    elif lane == "daily":
        lines = daily_sentences(report, name)
    elif lane.startswith("news:"):
        lines = news_sentences(report)
    else:
        lines = []
    if (crashed := report.get("error")) and isinstance(crashed, str):
        lines.append(f"the run failed: {crashed}.")
    if abandoned := report.get("abandoned"):
        lines.append(f"the run was abandoned: {abandoned}.")
    for failure in report.get("errors", []) or []:
        if isinstance(failure, dict):
            lines.append(f"failed — {failure.get('event', 'error')}: {failure.get('error', '')}")
    return lines
