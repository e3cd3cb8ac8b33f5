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

Every email and every cache invalidation is an effect (``nightcrew.effects``): the stamps, the
restore and their invalidations and emails commit together, so none of them can be lost to a
failing send or a crash; the first attempt follows the commit, the minute lane retries within
minutes. A nag's email is recorded (by its key) and attempted before its claim, as before: the
claim decides which stage is owed, the effect makes sure its email arrives once.

The Resend Idempotency-Key ``overage:{account}:{since_ms}:{stage}`` is the send-once guard (and
the email effect's key); the conditional claims are the advance-once guard.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import Clock
from nightcrew.db.database import Tx
from nightcrew.db.queries import load_queries
from nightcrew.effects import feed_outbox
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import DrainReport, deliver_effects, deliver_now
from nightcrew.lifecycle.overage_mail import Overage, render
from nightcrew.log import event, warning
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

OVERAGE_GRACE_DAYS = 30
# Nag stages by elapsed days since content_overage_since.
NAG_STAGE_DAYS = (0, 7, 21, 27)
FINAL_STAGE = 3
SUSPENDED_STAGE = 4
SUSPEND_NOTICE_DAYS = 3
GB = 1_000_000_000
# The scan's session: its slice filter (a function of the account id) is estimated at 0.5% of
# the rows, really 1/slices, so the planner would probe the episodes index once per podcast;
# one pass over episodes into a hash join is ~20% faster at 100k accounts (bench.overage).
SCAN_SETTINGS = {"enable_nestloop": "off"}


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


def parse_key(key: str) -> tuple[str, datetime, int] | None:
    """(account, since, stage) of a stage email's key; None for any other key."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "overage" or not parts[3].isdigit():
        return None
    try:
        since = datetime.fromtimestamp(int(parts[2]) / 1000, tz=UTC)
    except ValueError:
        return None
    return parts[1], since, int(parts[3])


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainAndClaims:
    """The minute lane's ``deliverEffects``: the effects drain's report, and the overage stages
    its emails claimed — an email the drain delivered (a retry after Resend failed the first
    attempt) claims its stage then, as the sweep would have: ``emails_sent`` counts them."""

    drain: DrainReport
    claims: list[dict[str, Any]]
    emails_sent: int

    @property
    def errors(self) -> list[Failure]:
        return self.drain.errors

    def counts(self) -> dict[str, int]:
        return {**self.drain.counts(), "emails_sent": self.emails_sent}

    def to_json(self) -> dict[str, Any]:
        return {**self.drain.to_json(), "emails_sent": self.emails_sent, "claims": self.claims}


async def deliver_and_claim(runtime: Runtime, clock: Clock) -> DrainAndClaims:
    """The effects drain; then each stage email it delivered claims its stage, at the
    delivery's time, with the sweep's conditional claim (the first claim wins; a stage never
    goes back)."""
    drain = await deliver_effects(runtime, clock)
    tally = _Tally()
    sent = 0
    for key, delivered_at in drain.mail_delivered:
        parsed = parse_key(key)
        if parsed is None:
            continue
        account, since, stage = parsed
        sent += 1
        event("overage_email_sent", account_id=account, stage=stage, idempotency_key=key)
        await _claim(runtime, account, since, stage, delivered_at, tally)
    return DrainAndClaims(drain=drain, claims=tally.claims, emails_sent=sent)


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


@dataclass(frozen=True, kw_only=True, slots=True)
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
    # who was restored, so the run history (and the dashboard) can say it
    restored: list[dict[str, Any]] = field(default_factory=list)
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
            "restored": self.restored,
            "errors": self.errors,
        }


# What a sweep counts besides its lists (emails sent and accounts restored are their lengths).
_Count = Literal["armed", "suspended_accounts", "suspended_podcasts", "restored_podcasts"]


@dataclass(slots=True)
class _Tally:
    """What a sweep has done so far; frozen into its EscalationReport when the sweep ends."""

    counts: Counter[_Count] = field(default_factory=Counter)
    claims: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)
    restored: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def report(self, *, scanned: int) -> EscalationReport:
        return EscalationReport(
            scanned=scanned,
            armed=self.counts["armed"],
            emails_sent=len(self.emails),
            suspended_accounts=self.counts["suspended_accounts"],
            suspended_podcasts=self.counts["suspended_podcasts"],
            restored_accounts=len(self.restored),
            restored_podcasts=self.counts["restored_podcasts"],
            claims=self.claims,
            emails=self.emails,
            restored=self.restored,
            errors=self.errors,
        )


async def scan(runtime: Runtime) -> list[dict[str, Any]]:
    """Every account that can need work, ordered by id. The platform's effective_cap() is
    called per account and cannot run in a parallel query, so the scan's slices
    (NIGHTCREW_OVERAGE_SCAN_SLICES) run at once, each on a pooled connection (one is left free
    for everything else): that is how it uses more than one of the database's cores. A slice
    that fails cancels the others."""
    slices = max(
        1, min(runtime.settings.overage_scan_slices, runtime.settings.db_pool_max_size - 1)
    )
    try:
        async with asyncio.TaskGroup() as group:
            parts = [group.create_task(scan_slice(runtime, slices, n)) for n in range(slices)]
    except ExceptionGroup as failed:  # the lane names the first cause, not a group of them
        raise failed.exceptions[0] from None
    return sorted((row for part in parts for row in part.result()), key=lambda r: str(r["id"]))


async def scan_slice(runtime: Runtime, slices: int, n: int) -> list[dict[str, Any]]:
    async with runtime.db.session(settings=SCAN_SETTINGS) as session:
        return await session.fetch(SQL["scan"], {"slices": slices, "slice": n})


async def run_overage_escalation(runtime: Runtime, clock: Clock) -> EscalationReport:
    """The daily sweep: every account that can need work; one failing never stops the next."""
    tally = _Tally()
    rows = await scan(runtime)
    for row in rows:
        await _isolated(runtime, clock, row, tally)
    report = tally.report(scanned=len(rows))
    event("overage_escalation_completed", **report.counts(), errors=len(report.errors))
    return report


async def reconcile_account_overage(
    runtime: Runtime, clock: Clock, account_id: str
) -> EscalationReport:
    """The webhook's entry: the same legs and claims, for one account."""
    tally = _Tally()
    rows = await runtime.db.fetch(SQL["measure_account"], {"account_id": account_id})
    for row in rows:
        await _isolated(runtime, clock, row, tally)
    return tally.report(scanned=len(rows))


async def _isolated(runtime: Runtime, clock: Clock, row: dict[str, Any], tally: _Tally) -> None:
    with one_item(tally.errors, "overage_escalation_account_failed", account_id=str(row["id"])):
        await _process(runtime, clock, row, tally)


@dataclass(frozen=True, slots=True)
class OverageClock:
    """An account's 30-day clock, as read at the query boundary (all None: not armed)."""

    since: datetime | None
    deadline: datetime | None
    stage: int
    last_nag_at: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OverageClock:
        return cls(
            since=row["content_overage_since"],
            deadline=row["content_overage_deadline"],
            stage=int(row["content_overage_nag_stage"] or 0),
            last_nag_at=row["content_overage_last_nag_at"],
        )


async def _process(runtime: Runtime, clock: Clock, row: dict[str, Any], tally: _Tally) -> None:
    now = clock.now()
    account = str(row["id"])
    # Measure again, now: the scan row may be minutes old, and the webhook may have moved the
    # clock or the owner the usage since. Decisions are taken on live state only.
    fresh = await runtime.db.fetch_one(SQL["measure_account"], {"account_id": account})
    if fresh is None:
        return  # the account is gone
    # NUMERIC and BIGINT sums arrive as Decimal: coerce at the boundary (invariant 7).
    podcast_cap = _number(fresh["podcast_cap"])
    storage_cap = _number(fresh["storage_cap_gb"])
    used_podcasts, used_bytes = int(fresh["podcasts"]), int(fresh["bytes"])
    over_count = podcast_cap is not None and used_podcasts > podcast_cap
    over_storage = storage_cap is not None and used_bytes > storage_cap * GB
    clock_state = OverageClock.from_row(fresh)
    overage = Overage(
        podcasts=used_podcasts,
        podcast_cap=podcast_cap,
        bytes=used_bytes,
        storage_cap_gb=storage_cap,
        deadline=clock_state.deadline,
        app_url=runtime.settings.public_app_url or "",
    )

    if not (over_count or over_storage):
        if clock_state.since is not None or fresh["stamped"]:
            await _restore(runtime, clock, account, clock_state, overage, tally)
        return
    armed = await _arm(runtime, now, account, clock_state, tally)
    if armed is None or armed.since is None:
        return  # the account is gone
    overage = replace(overage, deadline=armed.deadline)  # if just armed
    if armed.stage < FINAL_STAGE:
        await _nag(runtime, clock, account, armed, overage, tally)
        return
    await _suspend(
        runtime,
        clock,
        account,
        armed,
        overage,
        tally,
        over_storage=over_storage,
        over_count=over_count,
        podcast_cap=podcast_cap,
    )


async def _arm(
    runtime: Runtime,
    now: datetime,
    account: str,
    clock_state: OverageClock,
    tally: _Tally,
) -> OverageClock | None:
    """Start the clock if it is not running; the clock as it now stands (None: no account)."""
    if clock_state.since is not None:
        return clock_state
    armed = await runtime.db.fetch_one(
        SQL["arm"], {"id": account, "now": now, "grace_days": OVERAGE_GRACE_DAYS}
    )
    if armed is not None:
        tally.counts["armed"] += 1
        event(
            "overage_armed",
            account_id=account,
            deadline=armed["content_overage_deadline"].isoformat(),
        )
        return OverageClock.from_row(armed)
    # lost the race to the other entry point: take its clock
    current = await runtime.db.fetch_one(SQL["read_clock"], {"id": account})
    return OverageClock.from_row(current) if current is not None else None


async def _nag(
    runtime: Runtime,
    clock: Clock,
    account: str,
    clock_state: OverageClock,
    overage: Overage,
    tally: _Tally,
) -> None:
    """Owe and send the warning whose stage is due, if one is."""
    now, since = clock.now(), clock_state.since
    assert since is not None
    due = stage_due(now - since)
    if due <= clock_state.stage:
        return
    async with runtime.db.transaction() as tx:
        nag = await _owe_email(runtime, tx, now, account, since, due, overage, [])
    if await _send(runtime, clock, account, due, nag, tally):
        await _claim(runtime, account, since, due, now, tally)


async def _suspend(
    runtime: Runtime,
    clock: Clock,
    account: str,
    clock_state: OverageClock,
    overage: Overage,
    tally: _Tally,
    *,
    over_storage: bool,
    over_count: bool,
    podcast_cap: float | None,
) -> None:
    """Stage 3 aged its notice: stamp the sanction set and send the suspension notice. Stage
    4: re-derive the set (stamp the new, restore the no longer needed)."""
    now, since, stage = clock.now(), clock_state.since, clock_state.stage
    assert since is not None
    last_nag = clock_state.last_nag_at
    if stage == FINAL_STAGE and (
        last_nag is None or last_nag + timedelta(days=SUSPEND_NOTICE_DAYS) > now
    ):
        return  # the final warning has not aged its full notice yet
    podcasts = await runtime.db.fetch(SQL["occupying_podcasts"], {"id": account})
    sanctioned = sanction_set(
        podcasts, over_storage=over_storage, over_count=over_count, podcast_cap=podcast_cap
    )
    ids = [str(p["id"]) for p in sanctioned]
    notice: effects.Effect | None = None
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one(SQL["lock_clock"], {"id": account})
        if locked is None or (
            locked["content_overage_since"],
            locked["content_overage_nag_stage"],
        ) != (since, stage):
            return  # restored or moved on by the other entry point meanwhile
        stamped = await tx.fetch(SQL["stamp"], {"ids": ids, "now": now})
        cleared = await tx.fetch(SQL["unstamp_except"], {"id": account, "keep": ids, "now": now})
        # Newly stamped feeds are suspended; feeds no longer in the re-derived set are restored.
        owed = [
            *await _owe_invalidations(tx, now, stamped, "podcast.suspended", "overage_suspension"),
            *await _owe_invalidations(tx, now, cleared, "podcast.restored", "overage_restored"),
        ]
        if stage == FINAL_STAGE:
            names = [p["title"] or p["slug"] for p in sanctioned]
            notice = await _owe_email(
                runtime, tx, now, account, since, SUSPENDED_STAGE, overage, names
            )
    if stamped:
        event(
            "overage_podcasts_suspended",
            account_id=account,
            podcast_ids=[str(p["id"]) for p in stamped],
        )
    await _invalidate(runtime, clock, owed, tally)
    if stage == FINAL_STAGE:
        tally.counts["suspended_accounts"] += 1
        tally.counts["suspended_podcasts"] += len(stamped)
        if await _send(runtime, clock, account, SUSPENDED_STAGE, notice, tally):
            await _claim(runtime, account, since, SUSPENDED_STAGE, now, tally)
    else:
        tally.counts["suspended_podcasts"] += len(stamped)


async def _restore(
    runtime: Runtime,
    clock: Clock,
    account: str,
    clock_state: OverageClock,
    overage: Overage,
    tally: _Tally,
) -> None:
    now = clock.now()
    since = clock_state.since
    restored: effects.Effect | None = None
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one(SQL["lock_clock"], {"id": account})
        if locked is None or locked["content_overage_since"] != since:
            return  # re-armed (or restored) by the other entry point meanwhile
        await tx.execute(SQL["disarm"], {"id": account, "since": since})
        # The restored email is owed armed or stamped (spec 000, leg 4), keyed by the `{since}`
        # of the overage it ends. Stamped but not armed (the clock was cleared elsewhere while
        # the feeds stayed stamped) there is no clock: the newest stamp's time stands in. It is
        # stable — read under the account's lock from the very stamps this transaction clears,
        # so a rolled-back attempt derives the same key and a committed one leaves nothing
        # stamped to owe it again — and it is this suspension's own: a later suspension
        # stamps later, so its restore gets its own email instead of deduping against this one.
        episode = since
        if since is None:
            newest = await tx.fetch_one(SQL["newest_stamp"], {"id": account})
            episode = newest["newest"] if newest else None
        cleared = await tx.fetch(SQL["unstamp_except"], {"id": account, "keep": [], "now": now})
        if since is None and not cleared:
            return  # another caller restored it first
        owed = await _owe_invalidations(tx, now, cleared, "podcast.restored", "overage_restored")
        if episode is not None:
            # A warning or notice still being retried would now arrive after "you're back"
            # (unarmed: whichever clock they were keyed by, that clock is gone).
            keys: list[str] = []
            patterns: list[str] = []
            if since is not None:
                keys = [idempotency_key(account, since, s) for s in range(5)]
            else:
                patterns = [f"overage:{account}:%:{s}" for s in range(5)]
            await effects.supersede(
                tx,
                kind="mail",
                now=now,
                reason="superseded: the account was restored",
                keys=keys,
                patterns=patterns,
            )
            names = [p["slug"] for p in cleared]
            restored = await _owe_email(
                runtime, tx, now, account, episode, "restored", overage, names
            )
    tally.counts["restored_podcasts"] += len(cleared)
    tally.restored.append(
        {
            "account_id": account,
            "since": since.isoformat() if since else None,
            "podcasts": [p["slug"] for p in cleared],
        }
    )
    event("overage_restored", account_id=account, podcast_ids=[str(p["id"]) for p in cleared])
    await _invalidate(runtime, clock, owed, tally)
    if episode is not None:
        await _send(runtime, clock, account, "restored", restored, tally)


async def _owe_email(
    runtime: Runtime,
    tx: Tx,
    now: datetime,
    account: str,
    since: datetime,
    stage: int | str,
    overage: Overage,
    suspended: list[str],
) -> effects.Effect | None:
    """Record a stage's email as an effect keyed ``overage:{account}:{since}:{stage}``; None
    when the account has no owner address to write to."""
    owner = await tx.fetch_one(SQL["owner_email"], {"id": account})
    recipient = owner["email"] if owner else None
    if not recipient:
        warning("overage_email_no_owner", account_id=account, stage=stage)
        return None
    if not runtime.mail.configured:
        # Recorded all the same: it dies at its first attempt, and `nightcrew effects retry
        # --dead --kind mail` sends it once Resend is configured.
        warning(
            "overage_email_skipped",
            account_id=account,
            stage=stage,
            reason="RESEND_API_KEY or RESEND_FROM_EMAIL is unset",
        )
    subject, text, markup = render(stage, overage, suspended)
    return await effects.record(
        tx,
        kind="mail",
        key=idempotency_key(account, since, stage),
        payload={"to": recipient, "subject": subject, "text": text, "html": markup},
        now=now,
    )


async def _send(
    runtime: Runtime,
    clock: Clock,
    account: str,
    stage: int | str,
    email: effects.Effect | None,
    tally: _Tally,
) -> bool:
    """The email's first attempt; True when its outcome is final (sent — now or by an earlier
    caller — or permanently not: no owner, Resend unconfigured, a 4xx). A transient failure is
    retried by the minute lane with the same key, and the stage stays unclaimed meanwhile."""
    if email is None:
        return True
    if email.expired:
        # It was never confirmed, only timed out (Resend down for 20 h): the stage must not be
        # claimed on an email the owner never got. Re-drive it, with a fresh maximum age.
        await effects.retry(runtime.db, clock.now(), ids=[email.id])
        email = await effects.get(runtime.db, email.id) or email
        event("effect_retried", effect_id=email.id, kind="mail", key=email.key, reason="expired")
    [delivery] = await deliver_now(runtime, clock, [email])
    if delivery.status == "delivered":
        if not delivery.detail.get("earlier"):
            tally.emails.append(
                {
                    "account_id": account,
                    "stage": stage,
                    "to": email.payload["to"],
                    "idempotency_key": email.key,
                }
            )
            event("overage_email_sent", account_id=account, stage=stage, idempotency_key=email.key)
        return True
    if not runtime.mail.configured:
        return True  # overage_email_skipped was logged when it was recorded
    failure: Failure = {
        "event": "overage_email_failed",
        "account_id": account,
        "stage": stage,
        "transient": delivery.status == "transient",
        "effect_id": email.id,
        "error": delivery.error,
    }
    warning(**failure)
    tally.errors.append(failure)
    return delivery.final


async def _claim(
    runtime: Runtime,
    account: str,
    since: datetime,
    stage: int,
    now: datetime,
    tally: _Tally,
) -> None:
    claimed = await runtime.db.fetch_one(
        SQL["claim_stage"], {"id": account, "since": since, "stage": stage, "now": now}
    )
    if claimed is not None:
        tally.claims.append({"account_id": account, "stage": stage})


async def _owe_invalidations(
    tx: Tx, now: datetime, podcasts: list[dict[str, Any]], kind: str, reason: str
) -> list[effects.Effect]:
    """Both caches, per podcast, owed in the transaction that changed its stamp: the feed
    worker's confirmable lane (a feed_invalidation_outbox intent and its effect) and a
    public-api-invalidation message. A message of the opposite kind still being retried for the
    same podcast is superseded: it must not arrive after this one."""
    opposite = "podcast.restored" if kind == "podcast.suspended" else "podcast.suspended"
    if podcasts:
        await effects.supersede(
            tx,
            kind="queue",
            now=now,
            reason=f"superseded: {kind} is owed after it",
            patterns=[f"{PUBLIC_API_INVALIDATION}:{opposite}:{p['id']}:%" for p in podcasts],
        )
    owed = await feed_outbox.record(tx, [str(p["id"]) for p in podcasts], reason, now)
    for podcast in podcasts:
        podcast_id = str(podcast["id"])
        owed.append(
            await effects.record(
                tx,
                kind="queue",
                key=f"{PUBLIC_API_INVALIDATION}:{kind}:{podcast_id}:{int(now.timestamp() * 1000)}",
                payload={
                    "queue": PUBLIC_API_INVALIDATION,
                    "body": {
                        "type": kind,
                        "podcast_id": podcast_id,
                        "podcast_slug": podcast["slug"],
                    },
                },
                now=now,
            )
        )
    return owed


async def _invalidate(
    runtime: Runtime, clock: Clock, owed: list[effects.Effect], tally: _Tally
) -> None:
    """The first attempt of the invalidations owed; a failure is reported and retried by the
    minute lane until it is confirmed."""
    for effect, delivery in zip(owed, await deliver_now(runtime, clock, owed), strict=True):
        if delivery.status == "delivered":
            continue
        tally.errors.append(
            {
                "event": "overage_cache_invalidation_failed",
                "podcast_id": str(
                    effect.payload.get("podcast_id") or effect.payload["body"]["podcast_id"]
                ),
                "cache": "rss" if effect.kind == "feed_invalidate" else "public-api",
                "effect_id": effect.id,
                "retried": delivery.status == "transient",
                "error": delivery.error,
            }
        )
