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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypeVar
from uuid import UUID

from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import DrainReport, deliver_effects
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle.overage_mail import Overage
from nightcrew.lifecycle.overage_owed import (
    Feed,
    claim_stage,
    idempotency_key,
    invalidate_feeds,
    owe_email,
    owe_invalidations,
    parse_key,
    send_owed,
)
from nightcrew.lifecycle.overage_report import EscalationReport, Restored, StageClaim, Tally
from nightcrew.log import event
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
SCAN_SETTINGS = {"enable_nestloop": "off", "work_mem": "32MB"}


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def stage_due(elapsed: timedelta) -> int:
    """The highest nag stage due after ``elapsed`` (clamped to the final warning)."""
    due = 0
    for stage, days in enumerate(NAG_STAGE_DAYS):
        if elapsed >= timedelta(days=days):
            due = stage
    return min(due, FINAL_STAGE)


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainAndClaims:
    """The minute lane's ``deliverEffects``: the effects drain's report, and the overage stages
    its emails claimed — an email the drain delivered (a retry after Resend failed the first
    attempt) claims its stage then, as the sweep would have: ``emails_sent`` counts them."""

    drain: DrainReport
    claims: list[StageClaim]
    emails_sent: int

    @property
    def errors(self) -> list[Failure]:
        return self.drain.errors

    def counts(self) -> dict[str, int]:
        return {**self.drain.counts(), "emails_sent": self.emails_sent}

    def to_json(self) -> JsonObject:
        # the drain's report, and what its emails claimed beside it
        return {
            **self.drain.to_json(),
            "emails_sent": self.emails_sent,
            "claims": [c.to_json() for c in self.claims],
        }


async def deliver_and_claim(runtime: Runtime, clock: Clock) -> DrainAndClaims:
    """The effects drain; then each stage email it delivered claims its stage, at the
    delivery's time, with the sweep's conditional claim (the first claim wins; a stage never
    goes back)."""
    drain = await deliver_effects(runtime, clock)
    tally = Tally()
    sent = 0
    for key, delivered_at in drain.mail_delivered:
        parsed = parse_key(key)
        if parsed is None:
            continue
        account, since, stage = parsed
        sent += 1
        event("overage_email_sent", account_id=account, stage=stage, idempotency_key=key)
        await claim_stage(runtime, account, since, stage, delivered_at, tally)
    return DrainAndClaims(drain=drain, claims=tally.claims, emails_sent=sent)


Podcast = TypeVar("Podcast")


def sanction_set(
    podcasts: Sequence[Podcast],
    *,
    over_storage: bool,
    over_count: bool,
    podcast_cap: float | None,
) -> list[Podcast]:
    """Storage overage → every occupying feed (bytes have no per-feed excess); count overage
    only → the excess, newest first, keeping the oldest ``cap`` serving. ``podcasts`` are the
    occupying ones (active/paused), oldest first by created_at then id."""
    if over_storage:
        return list(podcasts)
    if over_count and podcast_cap is not None:
        return list(podcasts[int(podcast_cap) :])
    return []


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockColumns:
    """An account's 30-day clock as stored (arm, read_clock)."""

    content_overage_since: datetime | None
    content_overage_deadline: datetime | None
    content_overage_nag_stage: int | None
    content_overage_last_nag_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured(ClockColumns):
    """An account measured against its live caps, and its clock (scan, measure_account)."""

    id: UUID
    podcasts: int
    bytes: Decimal  # NUMERIC: coerced where it is used
    stamped: bool
    podcast_cap: Decimal | None  # None: unlimited
    storage_cap_gb: Decimal | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Locked:
    """A row of lock_clock."""

    content_overage_since: datetime | None
    content_overage_nag_stage: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Occupying:
    """A row of occupying_podcasts, oldest first."""

    id: UUID
    slug: str
    title: str | None


async def scan(runtime: Runtime) -> list[Measured]:
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
    return sorted((found for part in parts for found in part.result()), key=lambda m: str(m.id))


async def scan_slice(runtime: Runtime, slices: int, n: int) -> list[Measured]:
    async with runtime.db.session(settings=SCAN_SETTINGS) as session:
        return await session.fetch_as(Measured, SQL["scan"], {"slices": slices, "slice": n})


async def run_overage_escalation(runtime: Runtime, clock: Clock) -> EscalationReport:
    """The daily sweep: every account that can need work; one failing never stops the next."""
    tally = Tally()
    accounts = await scan(runtime)
    for measured in accounts:
        await _isolated(runtime, clock, measured, tally)
    report = tally.report(scanned=len(accounts))
    event("overage_escalation_completed", **report.counts(), errors=len(report.errors))
    return report


async def reconcile_account_overage(
    runtime: Runtime, clock: Clock, account_id: str
) -> EscalationReport:
    """The webhook's entry: the same legs and claims, for one account."""
    tally = Tally()
    accounts = await runtime.db.fetch_as(
        Measured, SQL["measure_account"], {"account_id": account_id}
    )
    for measured in accounts:
        await _isolated(runtime, clock, measured, tally)
    return tally.report(scanned=len(accounts))


async def _isolated(runtime: Runtime, clock: Clock, scanned: Measured, tally: Tally) -> None:
    with one_item(tally.errors, "overage_escalation_account_failed", account_id=str(scanned.id)):
        await _process(runtime, clock, scanned, tally)


@dataclass(frozen=True, slots=True)
class OverageClock:
    """An account's 30-day clock, as read at the query boundary (all None: not armed)."""

    since: datetime | None
    deadline: datetime | None
    stage: int
    last_nag_at: datetime | None

    @classmethod
    def of(cls, stored: ClockColumns) -> OverageClock:
        return cls(
            since=stored.content_overage_since,
            deadline=stored.content_overage_deadline,
            stage=int(stored.content_overage_nag_stage or 0),
            last_nag_at=stored.content_overage_last_nag_at,
        )


@dataclass(frozen=True, slots=True)
class _Leg:
    """One account's pass through a leg (nag, suspend, restore): what each of them acts on."""

    runtime: Runtime
    clock: Clock
    account: str
    clock_state: OverageClock
    overage: Overage
    tally: Tally


async def _process(runtime: Runtime, clock: Clock, scanned: Measured, tally: Tally) -> None:
    now = clock.now()
    account = str(scanned.id)
    # Measure again, now: the scan row may be minutes old, and the webhook may have moved the
    # clock or the owner the usage since. Decisions are taken on live state only.
    fresh = await runtime.db.fetch_one_as(Measured, SQL["measure_account"], {"account_id": account})
    if fresh is None:
        return  # the account is gone
    # NUMERIC and BIGINT sums arrive as Decimal: coerce at the boundary (invariant 7).
    podcast_cap = _number(fresh.podcast_cap)
    storage_cap = _number(fresh.storage_cap_gb)
    used_podcasts, used_bytes = int(fresh.podcasts), int(fresh.bytes)
    over_count = podcast_cap is not None and used_podcasts > podcast_cap
    over_storage = storage_cap is not None and used_bytes > storage_cap * GB
    clock_state = OverageClock.of(fresh)
    overage = Overage(
        podcasts=used_podcasts,
        podcast_cap=podcast_cap,
        bytes=used_bytes,
        storage_cap_gb=storage_cap,
        deadline=clock_state.deadline,
        app_url=runtime.settings.public_app_url or "",
    )

    if not (over_count or over_storage):
        if clock_state.since is not None or fresh.stamped:
            await _restore(_Leg(runtime, clock, account, clock_state, overage, tally))
        return
    armed = await _arm(runtime, now, account, clock_state, tally)
    if armed is None or armed.since is None:
        return  # the account is gone
    overage = replace(overage, deadline=armed.deadline)  # if just armed
    if armed.stage < FINAL_STAGE:
        await _nag(_Leg(runtime, clock, account, armed, overage, tally))
        return
    await _suspend(
        _Leg(runtime, clock, account, armed, overage, tally),
        over_storage=over_storage,
        over_count=over_count,
        podcast_cap=podcast_cap,
    )


async def _arm(
    runtime: Runtime,
    now: datetime,
    account: str,
    clock_state: OverageClock,
    tally: Tally,
) -> OverageClock | None:
    """Start the clock if it is not running; the clock as it now stands (None: no account)."""
    if clock_state.since is not None:
        return clock_state
    armed = await runtime.db.fetch_one_as(
        ClockColumns, SQL["arm"], {"id": account, "now": now, "grace_days": OVERAGE_GRACE_DAYS}
    )
    if armed is not None:
        tally.counts["armed"] += 1
        deadline = armed.content_overage_deadline
        assert deadline is not None  # arm sets it
        event("overage_armed", account_id=account, deadline=deadline.isoformat())
        return OverageClock.of(armed)
    # lost the race to the other entry point: take its clock
    current = await runtime.db.fetch_one_as(ClockColumns, SQL["read_clock"], {"id": account})
    return OverageClock.of(current) if current is not None else None


async def _nag(leg: _Leg) -> None:
    """Owe and send the warning whose stage is due, if one is."""
    runtime, clock, account = leg.runtime, leg.clock, leg.account
    clock_state, overage, tally = leg.clock_state, leg.overage, leg.tally
    now, since = clock.now(), clock_state.since
    assert since is not None
    due = stage_due(now - since)
    if due <= clock_state.stage:
        return
    async with runtime.db.transaction() as tx:
        nag = await owe_email(runtime, tx, now, account, since, due, overage, [])
    if await send_owed(runtime, clock, account, due, nag, tally):
        await claim_stage(runtime, account, since, due, now, tally)


async def _suspend(
    leg: _Leg, *, over_storage: bool, over_count: bool, podcast_cap: float | None
) -> None:
    """Stage 3 aged its notice: stamp the sanction set and send the suspension notice. Stage
    4: re-derive the set (stamp the new, restore the no longer needed)."""
    runtime, clock, account = leg.runtime, leg.clock, leg.account
    clock_state, overage, tally = leg.clock_state, leg.overage, leg.tally
    now, since, stage = clock.now(), clock_state.since, clock_state.stage
    assert since is not None
    last_nag = clock_state.last_nag_at
    if stage == FINAL_STAGE and (
        last_nag is None or last_nag + timedelta(days=SUSPEND_NOTICE_DAYS) > now
    ):
        return  # the final warning has not aged its full notice yet
    podcasts = await runtime.db.fetch_as(_Occupying, SQL["occupying_podcasts"], {"id": account})
    sanctioned = sanction_set(
        podcasts, over_storage=over_storage, over_count=over_count, podcast_cap=podcast_cap
    )
    ids = [str(p.id) for p in sanctioned]
    notice: effects.Effect | None = None
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one_as(_Locked, SQL["lock_clock"], {"id": account})
        if locked is None or (
            locked.content_overage_since,
            locked.content_overage_nag_stage,
        ) != (since, stage):
            return  # restored or moved on by the other entry point meanwhile
        stamped = await tx.fetch_as(Feed, SQL["stamp"], {"ids": ids, "now": now})
        cleared = await tx.fetch_as(
            Feed, SQL["unstamp_except"], {"id": account, "keep": ids, "now": now}
        )
        # Newly stamped feeds are suspended; feeds no longer in the re-derived set are restored.
        owed = [
            *await owe_invalidations(tx, now, stamped, "podcast.suspended", "overage_suspension"),
            *await owe_invalidations(tx, now, cleared, "podcast.restored", "overage_restored"),
        ]
        if stage == FINAL_STAGE:
            names = [p.title or p.slug for p in sanctioned]
            notice = await owe_email(
                runtime, tx, now, account, since, SUSPENDED_STAGE, overage, names
            )
    if stamped:
        event(
            "overage_podcasts_suspended",
            account_id=account,
            podcast_ids=[str(p.id) for p in stamped],
        )
    await invalidate_feeds(runtime, clock, owed, tally)
    if stage == FINAL_STAGE:
        tally.counts["suspended_accounts"] += 1
        tally.counts["suspended_podcasts"] += len(stamped)
        if await send_owed(runtime, clock, account, SUSPENDED_STAGE, notice, tally):
            await claim_stage(runtime, account, since, SUSPENDED_STAGE, now, tally)
    else:
        tally.counts["suspended_podcasts"] += len(stamped)


async def _restore(leg: _Leg) -> None:
    runtime, clock, account = leg.runtime, leg.clock, leg.account
    clock_state, overage, tally = leg.clock_state, leg.overage, leg.tally
    now = clock.now()
    since = clock_state.since
    restored: effects.Effect | None = None
    async with runtime.db.transaction() as tx:
        locked = await tx.fetch_one_as(_Locked, SQL["lock_clock"], {"id": account})
        if locked is None or locked.content_overage_since != since:
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
            episode = await tx.fetch_value(datetime, SQL["newest_stamp"], {"id": account})
        cleared = await tx.fetch_as(
            Feed, SQL["unstamp_except"], {"id": account, "keep": [], "now": now}
        )
        if since is None and not cleared:
            return  # another caller restored it first
        owed = await owe_invalidations(tx, now, cleared, "podcast.restored", "overage_restored")
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
            names = [p.slug for p in cleared]
            restored = await owe_email(
                runtime, tx, now, account, episode, "restored", overage, names
            )
    tally.counts["restored_podcasts"] += len(cleared)
    tally.restored.append(
        Restored(
            account_id=account,
            since=since.isoformat() if since else None,
            podcasts=[p.slug for p in cleared],
        )
    )
    event("overage_restored", account_id=account, podcast_ids=[str(p.id) for p in cleared])
    await invalidate_feeds(runtime, clock, owed, tally)
    if episode is not None:
        await send_owed(runtime, clock, account, "restored", restored, tally)
