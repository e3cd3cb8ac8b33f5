"""Run reports in words: what each job did, and why — for the demo and the dashboard.

A lane run's report (``LaneReport.to_json()``, stored in ``nightcrew.runs.report``) is read
field by field with ``.get`` and defaults: reports written by older versions, or cut short by a
crash, lack fields, and the words must still come out. ``name`` turns an id into what a person
calls it (the demo knows its sample's titles; the dashboard uses the slug the report carries).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle import watchdogs as wd

Name = Callable[[str, Any], str]  # (id, the report item it came from) → a name


def short_name(row_id: str, item: Any = None) -> str:
    """The report's slug when it has one, else the id's first 8 characters."""
    if isinstance(item, dict) and item.get("slug"):
        return f"“{item['slug']}”"
    return str(row_id)[:8]


def _d(value: Any) -> JsonObject:
    """A stored report's object, or {} for anything else (a list, a number, null)."""
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _n(value: Any) -> int | float:
    """A stored count, or 0 for anything that is not a number."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _jobs(report: JsonObject) -> dict[str, JsonObject]:
    """The jobs that ran to the end; a job that crashed is told among the failures."""
    return {
        name: job
        for name, job in _d(report.get("jobs")).items()
        if isinstance(job, dict) and job.get("status") != "failed"
    }


def minute_sentences(report: JsonObject, name: Name = short_name) -> list[str]:
    jobs = _jobs(report)
    lines: list[str] = []
    if imports := jobs.get("sweepStalledImports"):
        lines.append(
            f"{_n(imports.get('items_requeued'))} lost podcast-imports message(s) re-sent "
            f"({_n(imports.get('items_rescued'))} of them rescued from a 'processing' claim older "
            f"than {wd.STALLED_PROCESSING_THRESHOLD_MINUTES} minutes: its worker is presumed "
            f"dead). A pending item with 1 attempt is stalled after "
            f"{wd.ATTEMPTS_THRESHOLDS_SECONDS[1]} s."
        )
        if failed := _n(imports.get("items_resend_failed")):
            lines.append(f"{failed} import re-send(s) failed; the next minute tries again.")
    if links := jobs.get("sweepStalledExternalLinks"):
        lines.append(
            f"{_n(links.get('links_requeued'))} external-episode-link message(s) re-sent: the link "
            f"was past due by more than {wd.STALLED_LINK_GRACE_SECONDS} s; its next attempt is "
            f"pushed {wd.STALLED_LINK_RESEND_COOLDOWN_SECONDS} s out, same attempt."
        )
    previews = _d(jobs.get("sweepStuckHostingMigrationPreviews"))
    for import_id in _l(previews.get("import_ids")):
        lines.append(
            f"{name(import_id, None)} was canceled: stuck in preview for more than "
            f"{wd.STUCK_HOSTING_MIGRATION_PREVIEW_MINUTES} minutes, it would have blocked every"
            " retry with a 409."
        )
    media = _d(jobs.get("sweepWedgedMediaJobs"))
    for job_id in _l(media.get("job_ids")):
        lines.append(
            f"{name(job_id, None)} was marked failed: no progress for more than "
            f"{wd.WEDGED_MEDIA_JOB_HOURS} hours, and its waiters were notified."
        )
    if (drain := jobs.get("deliverEffects")) and any(
        _n(drain.get(k)) for k in ("effects_delivered", "effects_retried", "effects_dead")
    ):
        lines.append(
            f"effects outbox: {_n(drain.get('effects_delivered'))} delivered, "
            f"{_n(drain.get('effects_retried'))} to be retried, "
            f"{_n(drain.get('effects_dead'))} given up."
        )
    return lines


def daily_sentences(report: JsonObject, name: Name = short_name) -> list[str]:
    jobs = _jobs(report)
    lines: list[str] = []
    for podcast in map(_d, _l(_d(jobs.get("reactivateExpiredPauses")).get("podcasts"))):
        billing = _d(podcast.get("billing"))
        outcome = billing.get("outcome", "unknown")
        who = name(str(podcast.get("podcast_id", "?")), podcast)
        lines.append(
            f"{who}: its pause ended, so it is active again. "
            f"Billing resume: {outcome} ({billing.get('reason', outcome)})."
        )
    for podcast in map(_d, _l(_d(jobs.get("hardDeleteExpiredPodcasts")).get("podcasts"))):
        via = podcast.get("invalidated_via") or "NOT YET — will retry"
        who = name(str(podcast.get("podcast_id", "?")), podcast)
        lines.append(
            f"{who}: its deletion date passed, so the podcast "
            f"and everything under it were deleted — {_n(podcast.get('objects_deleted'))} "
            f"file(s), {_n(podcast.get('bytes_deleted')):,} bytes from storage; feed cache told "
            f"via {via}."
        )
    leftovers = _n(_d(jobs.get("hardDeleteExpiredPodcasts")).get("cleanup_leftovers"))
    if leftovers:
        lines.append(f"{leftovers} earlier deletion(s) still have storage or a feed to clean.")
    recon = _d(_d(jobs.get("runReconcile")).get("report"))
    if recon:
        size, orphans = _d(recon.get("sizeBackfill")), _d(recon.get("orphans"))
        lines.append(
            f"storage reconciler: {_n(size.get('written'))} episode size(s) had never been "
            f"recorded, so the measured sizes were written; {_n(orphans.get('deleted'))} orphaned "
            "upload(s) that no episode references, older than the 24-hour guard, deleted after "
            f"a last database check ({_n(orphans.get('protectedPendingInvalidation'))} kept: "
            "their feed's invalidation is still pending); "
            f"{_n(_d(recon.get('missing')).get('count'))} episode(s) pointing at a missing file "
            "(reported only: the daily run never quarantines)."
        )
    elif skipped := _d(jobs.get("runReconcile")).get("skipped"):
        lines.append(f"storage reconciler skipped: {skipped}.")
    overage = _d(jobs.get("runOverageEscalation"))
    if overage:
        lines.append(
            f"overage escalation: {_n(overage.get('armed'))} account(s) newly over their plan "
            f"(the 30-day clock started), {_n(overage.get('emails_sent'))} warning email(s) sent, "
            f"{_n(overage.get('suspended_podcasts'))} feed(s) suspended, "
            f"{_n(overage.get('restored_accounts'))} account(s) restored; nothing is paused "
            "before day 30, and nothing is ever deleted."
        )
    if reap := jobs.get("reapUnconfirmedUsers"):
        lines.append(
            f"{_n(reap.get('users_reaped'))} unconfirmed signup(s) older than "
            f"{reap.get('retention_days', 7)} days deleted, "
            f"{_n(reap.get('users_reap_skipped'))} skipped."
        )
    return lines


def news_sentences(stored: Any) -> list[str]:
    """A news shard run (inline) or pass (pipeline): one report, the same fields either way
    (what a pass's workers wrote since the shard's previous report is under ``workers``)."""
    report = _d(stored)
    status = report.get("status")
    if report.get("skipped") is True or status == "skipped":
        return [f"skipped: {report.get('reason') or 'another worker held the shard'}."]
    lines: list[str] = []
    if status == "superseded":
        lines.append(
            "superseded: a newer holder of the shard's lease wrote first, so this run stopped"
            " (not a failure); what it did not write waits for the newer one."
        )
    # a pipeline pass writes nothing itself: its workers' results since the last report
    workers = _d(report.get("workers")) if report.get("pipeline") == "rabbitmq" else {}
    done = workers or report
    window = " by the workers since the last report" if workers else ""
    lines.append(
        f"{_n(report.get('queuedCount'))} story(ies) waiting, "
        f"{_n(done.get('processedCount'))} written{window}, "
        f"{_n(done.get('acceptedCount'))} accepted, "
        f"{_n(done.get('rejectedCount'))} rejected."
    )
    if workers:
        lines.append(f"{_n(report.get('admittedCount'))} admitted into the stages by this pass.")
    if translated := _n(report.get("translatedCount")):
        lines.append(f"{translated} summary(ies) translated.")
    if deferred := _n(report.get("deferredCount")):
        reasons = ", ".join(str(r) for r in _l(report.get("deferredReasons"))) or "no reason given"
        lines.append(f"{deferred} deferred to a later run ({reasons}); nothing is dropped.")
    if errors := _l(report.get("fetchErrors")):
        lines.append(f"{len(errors)} feed(s) could not be fetched.")
    if dropped := sum(_n(_d(d).get("count")) for d in _l(report.get("droppedItems"))):
        lines.append(f"{dropped} feed item(s) dropped: their link cannot be kept.")
    if refused := _l(report.get("writeErrors")):
        lines.append(f"{len(refused)} article(s) refused by the database (kept as rejected).")
    return lines


def lane_sentences(lane: str, stored: Any, name: Name = short_name) -> list[str]:
    """Every sentence for one run of ``lane``, failures last."""
    report = _d(stored)
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
    failures = [
        f"{failure.get('event', 'error')}: {failure.get('error', '')}"
        for failure in map(_d, _l(report.get("errors")))
        if failure
    ]
    lines += [f"failed — {line}" for line in grouped(failures)]
    return lines


def grouped(lines: list[str]) -> list[str]:
    """Repeated lines once, in order of first appearance, with how many times: "… (5 times)"
    (one failure of five items was five identical lines on the run page and in the demo)."""
    counts = Counter(lines)
    return [line if counts[line] == 1 else f"{line} ({counts[line]} times)" for line in counts]
