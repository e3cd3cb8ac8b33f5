"""The hosted-content overage escalation: a 30-day state machine that warns, suspends and
restores — never deletes, never double-sends.

Two entry points, one machine: ``run_overage_escalation`` (the daily sweep) and
``reconcile_account_overage`` (the payment webhook's plan-flip call). Per account, by its live
usage against its live caps:

* Arm     — over a cap and not armed: ``since = now``, ``deadline = now + 30 d``, stage -1
            (a conditional UPDATE: first detection wins; a loser re-reads and continues).
* Nag     — armed, stage due by elapsed days (0/7/21/27 → 0/1/2/3): send first, then claim
            (``… WHERE nag_stage < D``). A transient send failure leaves it unclaimed; a
            permanent one advances best-effort. A gap collapses into the latest stage due.
* Suspend — stage 3 whose notice aged 3 days: stamp the sanction set, invalidate both caches,
            send the notice, claim stage 4 once the send outcome is final. At stage 4 the
            sanction set is re-derived from live state every run.
* Restore — armed or stamped and under both caps: disarm, clear every stamp, invalidate both
            caches, send the restored email. Never touches ``is_active`` or ``status``.

The Resend Idempotency-Key ``overage:{account}:{since_ms}:{stage}`` is the send-once guard;
the conditional claims are the advance-once guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.mail import Email
from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.lifecycle import outbox as feed_outbox
from nightcrew.lifecycle.overage_mail import Overage, render
from nightcrew.log import describe_error, error, event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

OVERAGE_GRACE_DAYS = 30
# Nag stages by elapsed days since content_overage_since.
NAG_STAGE_DAYS = (0, 7, 21, 27)
FINAL_STAGE = 3
SUSPENDED_STAGE = 4
SUSPEND_NOTICE_DAYS = 3
GB = 1_000_000_000


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def stage_due(elapsed: timedelta) -> int:
    """The highest nag stage due after ``elapsed`` (clamped to the final warning)."""
    due = 0
    for stage, days in enumerate(NAG_STAGE_DAYS):
        if elapsed >= timedelta(days=days):
            due = stage
    return min(due, FINAL_STAGE)


def idempotency_key(account_id: str, since: datetime, stage: int | str) -> str:
    """``overage:{account}:{since}:{stage}``, since in epoch milliseconds (DESIGN §6)."""
    return f"overage:{account_id}:{int(since.timestamp() * 1000)}:{stage}"


def sanction_set(
    podcasts: list[dict[str, Any]],
    *,
    over_storage: bool,
    over_count: bool,
    podcast_cap: float | None,
) -> list[dict[str, Any]]:
    """Storage overage → every occupying feed (bytes have no per-feed excess); count overage
    only → the excess, newest first, keeping the oldest ``cap`` serving. ``podcasts`` are the
    occupying ones (active/paused), oldest first by created_at then id."""
    if over_storage:
        return list(podcasts)
    if over_count and podcast_cap is not None:
        return list(podcasts[int(podcast_cap) :])
    return []


@dataclass(kw_only=True)
class EscalationReport:
    scanned: int = 0
    armed: int = 0
    emails_sent: int = 0
    suspended_accounts: int = 0
    suspended_podcasts: int = 0
    restored_accounts: int = 0
    restored_podcasts: int = 0
    claims: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "scanned": self.scanned,
            "armed": self.armed,
            "emails_sent": self.emails_sent,
            "suspended_accounts": self.suspended_accounts,
            "suspended_podcasts": self.suspended_podcasts,
            "restored_accounts": self.restored_accounts,
            "restored_podcasts": self.restored_podcasts,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "claims": self.claims,
            "emails": self.emails,
            "errors": self.errors,
        }


async def run_overage_escalation(runtime: Runtime, clock: Clock) -> EscalationReport:
    """The daily sweep: every account that can need work; one failing never stops the next."""
    report = EscalationReport()
    rows = await runtime.db.fetch(SQL["scan"], {"now": clock.now()})
    report.scanned = len(rows)
    for row in rows:
        await _isolated(runtime, clock, row, report)
    event("overage_escalation_completed", **report.counts(), errors=len(report.errors))
    return report


async def reconcile_account_overage(
    runtime: Runtime, clock: Clock, account_id: str
) -> EscalationReport:
    """The webhook's entry: the same legs and claims, for one account."""
    report = EscalationReport()
    rows = await runtime.db.fetch(
        SQL["measure_account"], {"now": clock.now(), "account_id": account_id}
    )
    report.scanned = len(rows)
    for row in rows:
        await _isolated(runtime, clock, row, report)
    return report


async def _isolated(
    runtime: Runtime, clock: Clock, row: dict[str, Any], report: EscalationReport
) -> None:
    try:
        await _process(runtime, clock, row, report)
    except Exception as exc:
        failure = {
            "event": "overage_escalation_account_failed",
            "account_id": str(row["id"]),
            "error": describe_error(exc),
        }
        error(**failure)
        report.errors.append(failure)


async def _process(
    runtime: Runtime, clock: Clock, row: dict[str, Any], report: EscalationReport
) -> None:
    now = clock.now()
    account = str(row["id"])
    # Measure again, now: the scan row may be minutes old, and the webhook may have moved the
    # clock or the owner the usage since. Decisions are taken on live state only.
    fresh = await runtime.db.fetch_one(SQL["measure_account"], {"now": now, "account_id": account})
    if fresh is None:
        return  # the account is gone
    row = fresh
    # NUMERIC and BIGINT sums arrive as Decimal: coerce at the boundary (invariant 7).
    podcast_cap = _number(row["podcast_cap"])
    storage_cap = _number(row["storage_cap_gb"])
    used_podcasts, used_bytes = int(row["podcasts"]), int(row["bytes"])
    over_count = podcast_cap is not None and used_podcasts > podcast_cap
    over_storage = storage_cap is not None and used_bytes > storage_cap * GB
    clock_row = {
        k: row[k]
        for k in (
            "content_overage_since",
            "content_overage_deadline",
            "content_overage_nag_stage",
            "content_overage_last_nag_at",
        )
    }
    overage = Overage(
        podcasts=used_podcasts,
        podcast_cap=podcast_cap,
        bytes=used_bytes,
        storage_cap_gb=storage_cap,
        deadline=row["content_overage_deadline"],
        app_url=runtime.settings.public_app_url or "",
    )

    if not (over_count or over_storage):
        if clock_row["content_overage_since"] is not None or row["stamped"]:
            await _restore(runtime, now, account, clock_row, overage, report)
        return

    # --- Arm ------------------------------------------------------------------------------
    if clock_row["content_overage_since"] is None:
        armed = await runtime.db.fetch_one(
            SQL["arm"], {"id": account, "now": now, "grace_days": OVERAGE_GRACE_DAYS}
        )
        if armed is not None:
            report.armed += 1
            event(
                "overage_armed",
                account_id=account,
                deadline=armed["content_overage_deadline"].isoformat(),
            )
            clock_row = armed
        else:  # lost the race to the other entry point: take its clock
            clock_row = await runtime.db.fetch_one(SQL["read_clock"], {"id": account}) or {}
    since: datetime = clock_row["content_overage_since"]
    stage: int = clock_row["content_overage_nag_stage"]
    overage = replace(overage, deadline=clock_row["content_overage_deadline"])  # if just armed

    # --- Nag ------------------------------------------------------------------------------
    if stage < FINAL_STAGE:
        due = stage_due(now - since)
        if due > stage:
            result = await _send(runtime, account, since, due, overage, [], report)
            if result:
                await _claim(runtime, account, since, due, now, report)
        return

    # --- Suspend (stage 3 aged) and re-derive (stage 4) ----------------------------------
    last_nag = clock_row["content_overage_last_nag_at"]
    if stage == FINAL_STAGE and (
        last_nag is None or last_nag + timedelta(days=SUSPEND_NOTICE_DAYS) > now
    ):
        return  # the final warning has not aged its full notice yet
    podcasts = await runtime.db.fetch(SQL["occupying_podcasts"], {"id": account})
    sanctioned = sanction_set(
        podcasts, over_storage=over_storage, over_count=over_count, podcast_cap=podcast_cap
    )
    ids = [str(p["id"]) for p in sanctioned]
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one(SQL["lock_clock"], {"id": account})
        if locked is None or (
            locked["content_overage_since"],
            locked["content_overage_nag_stage"],
        ) != (since, stage):
            return  # restored or moved on by the other entry point meanwhile
        stamped = await tx.fetch(SQL["stamp"], {"ids": ids, "now": now})
        cleared = await tx.fetch(SQL["unstamp_except"], {"id": account, "keep": ids, "now": now})
        changed = [*stamped, *cleared]
        outbox = await feed_outbox.record(
            tx, [str(p["id"]) for p in changed], "overage_suspension", now
        )
    if stamped:
        event(
            "overage_podcasts_suspended",
            account_id=account,
            podcast_ids=[str(p["id"]) for p in stamped],
        )
    await _invalidate(runtime, now, changed, outbox, "podcast.suspended", report)
    if stage == FINAL_STAGE:
        report.suspended_accounts += 1
        report.suspended_podcasts += len(stamped)
        names = [p["title"] or p["slug"] for p in sanctioned]
        if await _send(runtime, account, since, SUSPENDED_STAGE, overage, names, report):
            await _claim(runtime, account, since, SUSPENDED_STAGE, now, report)
    else:
        report.suspended_podcasts += len(stamped)


async def _restore(
    runtime: Runtime,
    now: datetime,
    account: str,
    clock_row: dict[str, Any],
    overage: Overage,
    report: EscalationReport,
) -> None:
    since = clock_row["content_overage_since"]
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one(SQL["lock_clock"], {"id": account})
        if locked is None or locked["content_overage_since"] != since:
            return  # re-armed (or restored) by the other entry point meanwhile
        await tx.execute(SQL["disarm"], {"id": account, "since": since})
        cleared = await tx.fetch(SQL["unstamp_except"], {"id": account, "keep": [], "now": now})
        if since is None and not cleared:
            return  # another caller restored it first
        outbox = await feed_outbox.record(
            tx, [str(p["id"]) for p in cleared], "overage_restored", now
        )
    report.restored_accounts += 1
    report.restored_podcasts += len(cleared)
    event("overage_restored", account_id=account, podcast_ids=[str(p["id"]) for p in cleared])
    await _invalidate(runtime, now, cleared, outbox, "podcast.restored", report)
    if since is not None:
        names = [p["slug"] for p in cleared]
        await _send(runtime, account, since, "restored", overage, names, report)


async def _send(
    runtime: Runtime,
    account: str,
    since: datetime,
    stage: int | str,
    overage: Overage,
    suspended: list[str],
    report: EscalationReport,
) -> bool:
    """Send a stage's email; True when its outcome is final (sent, or permanently not)."""
    key = idempotency_key(account, since, stage)
    owner = await runtime.db.fetch_one(SQL["owner_email"], {"id": account})
    recipient = owner["email"] if owner else None
    if not runtime.mail.configured:
        warning(
            "overage_email_skipped",
            account_id=account,
            stage=stage,
            reason="RESEND_API_KEY or RESEND_FROM_EMAIL is unset",
        )
        return True
    if not recipient:
        warning("overage_email_no_owner", account_id=account, stage=stage)
        return True
    subject, text, markup = render(stage, overage, suspended)
    result = await runtime.mail.send(
        Email(to=recipient, subject=subject, text=text, html=markup, idempotency_key=key)
    )
    if result.outcome == "sent":
        report.emails_sent += 1
        report.emails.append(
            {"account_id": account, "stage": stage, "to": recipient, "idempotency_key": key}
        )
        event("overage_email_sent", account_id=account, stage=stage, idempotency_key=key)
        return True
    failure: Failure = {
        "event": "overage_email_failed",
        "account_id": account,
        "stage": stage,
        "transient": result.outcome == "transient",
        "error": result.error,
    }
    warning(**failure)
    report.errors.append(failure)
    return result.final


async def _claim(
    runtime: Runtime,
    account: str,
    since: datetime,
    stage: int,
    now: datetime,
    report: EscalationReport,
) -> None:
    claimed = await runtime.db.fetch_one(
        SQL["claim_stage"], {"id": account, "since": since, "stage": stage, "now": now}
    )
    if claimed is not None:
        report.claims.append({"account_id": account, "stage": stage})


async def _invalidate(
    runtime: Runtime,
    now: datetime,
    podcasts: list[dict[str, Any]],
    outbox: list[dict[str, Any]],
    kind: str,
    report: EscalationReport,
) -> None:
    """Both caches, per podcast: the feed worker's confirmable lane (its outbox intent is marked
    delivered only on a 2xx, else the reconciler's drain retries it) and public-api's queue."""
    intents = {str(o["podcast_id"]): str(o["id"]) for o in outbox}
    for podcast in podcasts:
        podcast_id = str(podcast["id"])
        result = await runtime.feedcache.invalidate(podcast_id, wait=True)
        intent = intents.get(podcast_id)
        if result.ok and intent:
            await feed_outbox.mark_delivered(runtime.db, [intent], now)
        elif not result.ok:
            if intent:
                await feed_outbox.mark_failed(runtime.db, [intent], result.error or "")
            report.errors.append(
                {
                    "event": "overage_cache_invalidation_failed",
                    "podcast_id": podcast_id,
                    "cache": "rss",
                    "error": result.error,
                }
            )
        try:
            await runtime.queues.send(
                PUBLIC_API_INVALIDATION,
                {"type": kind, "podcast_id": podcast_id, "podcast_slug": podcast["slug"]},
            )
        except NightcrewError as exc:
            report.errors.append(
                {
                    "event": "overage_cache_invalidation_failed",
                    "podcast_id": podcast_id,
                    "cache": "public-api",
                    "error": describe_error(exc),
                }
            )
