"""Delivering effects: one attempt per kind, the first attempt after a commit, and the drain.

Every delivery ends in one of three outcomes:

* ``delivered`` — the outside system confirmed it (a 2xx, a publisher confirm);
* ``transient`` — it may work later (429, 5xx, 408/409, a timeout, a refused connection, a queue
  that refused): retried with backoff until the effect's maximum age, then dead;
* ``permanent`` — it will fail the same way again (another 4xx, the service not configured):
  dead at once, visible in ``nightcrew effects list --dead``, re-driven with ``effects retry``.

Each attempt carries the effect's stable key: Resend's ``Idempotency-Key``, Stripe's
``idempotency_key``, and ``effect_id`` in every queue message, so a retry of something that
was delivered but not confirmed is recognised as the same thing by whoever receives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from nightcrew.adapters.billing import is_transient
from nightcrew.adapters.mail import Email
from nightcrew.clock import Clock, wall_now
from nightcrew.effects import billing_resume, feed_outbox, outbox
from nightcrew.effects.outbox import (
    KINDS,
    BillingResumePayload,
    Effect,
    FeedInvalidatePayload,
    MailPayload,
    QueuePayload,
    Settle,
)
from nightcrew.errors import BillingError, DatabaseUnavailableError, NightcrewError
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error, event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

# One delivery may take at most this long (Stripe's SDK retries inside it); well inside the
# claim lease, so an effect is never delivered twice at once.
DELIVERY_TIMEOUT_SECONDS = 60
# The drain: effects claimed per statement, deliveries in flight at once, and the time after
# which it claims no more (what it holds is finished), so a minute-lane run stays near its minute.
DRAIN_BATCH = 100
DRAIN_CONCURRENCY = 16
DRAIN_BUDGET_SECONDS = 40.0
# The first attempts after a commit start within this long; the rest are left to the drain.
FIRST_ATTEMPT_BUDGET_SECONDS = 60.0
# A retry is never scheduled later than this before the effect's maximum age.
LAST_CALL = timedelta(minutes=2)
# Undelivered feed_invalidation_outbox rows given an effect per run.
ADOPT_FEED_OUTBOX_MAX = 500
# Delivered effects are kept this long for inspection, then purged (a bounded batch per run).
DELIVERED_RETENTION = timedelta(days=14)
PURGE_BATCH = 1000

Status = Literal["delivered", "transient", "permanent"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    status: Status
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        """Confirmed, or given up: nothing more will be tried by itself."""
        return self.status != "transient"


def _delivered(**detail: Any) -> Delivery:
    return Delivery(status="delivered", detail=detail)


def _failed(error: str, *, permanent: bool, **detail: Any) -> Delivery:
    return Delivery(status="permanent" if permanent else "transient", error=error, detail=detail)


# --- one attempt, by kind ----------------------------------------------------------------------
async def deliver(
    runtime: Runtime, effect: Effect, now: datetime, siblings: Sequence[Effect] = ()
) -> Delivery:
    """One attempt. Never raises: an unexpected failure is a transient outcome with its text.
    ``siblings`` are effects that this one attempt settles too (see ``_same_delivery``)."""
    try:
        async with asyncio.timeout(DELIVERY_TIMEOUT_SECONDS):
            if effect.kind == "queue":
                return await _queue(runtime, effect)
            if effect.kind == "mail":
                return await _mail(runtime, effect)
            if effect.kind == "billing_resume":
                return await _billing(runtime, effect)
            if effect.kind == "feed_invalidate":
                return await _feed(runtime, [effect, *siblings], now)
            return _failed(f"unknown effect kind {effect.kind!r}", permanent=True)
    except TimeoutError:
        return _failed(f"no answer within {DELIVERY_TIMEOUT_SECONDS} s", permanent=False)
    except DatabaseUnavailableError:
        raise  # the run stops: every claimed effect is retried once the database is back
    except Exception as exc:  # a bug or the database: retried, and reported with its text
        return _failed(describe_error(exc), permanent=False)


async def _queue(runtime: Runtime, effect: Effect) -> Delivery:
    message = effect.read(QueuePayload)
    body = {**message.body, "effect_id": effect.id}
    try:
        await runtime.queues.send(message.queue, body, int(message.delay_seconds or 0))
        return _delivered(via="queue")
    except DatabaseUnavailableError:
        raise
    except NightcrewError as exc:
        queue_error = describe_error(exc)
    fallback = message.fallback_invalidate
    if not fallback:
        return _failed(queue_error, permanent=False)
    # The deletion's feed invalidation: the feed worker's endpoint when the queue refuses.
    warning(
        "rss_invalidation_queue_failed", podcast_id=fallback, error=queue_error, fallback="http"
    )
    result = await runtime.feedcache.invalidate(str(fallback))
    if result.ok:
        return _delivered(via="http")
    return _failed(f"queue: {queue_error}; http: {result.error}", permanent=False)


async def _mail(runtime: Runtime, effect: Effect) -> Delivery:
    mail = effect.read(MailPayload)
    result = await runtime.mail.send(
        Email(
            to=mail.to,
            subject=mail.subject,
            text=mail.text,
            html=mail.html,
            idempotency_key=effect.key,
        )
    )
    if result.outcome == "sent":
        return _delivered(message_id=result.message_id)
    return _failed(result.error or "not sent", permanent=result.outcome == "permanent")


async def _billing(runtime: Runtime, effect: Effect) -> Delivery:
    try:
        resumed = await billing_resume.resume_billing(
            runtime, effect.read(BillingResumePayload).account_id, idempotency_key=effect.key
        )
    except BillingError as exc:
        permanent = not runtime.billing.configured or not is_transient(exc)
        return _failed(str(exc), permanent=permanent)
    return _delivered(**resumed.to_json())


async def _feed(runtime: Runtime, effects: Sequence[Effect], now: datetime) -> Delivery:
    """One confirmable call per podcast, for every intent of it the given effects drive."""
    intents = [e.read(FeedInvalidatePayload) for e in effects]
    podcast_id = intents[0].podcast_id
    # A confirmation settles every intent of the podcast owed before the call; intents that an
    # earlier confirmation already settled need no call at all.
    owed = await feed_outbox.pending_for_podcast(runtime.db, podcast_id)
    mine = [i.outbox_id for i in intents if i.outbox_id]
    if mine and not runtime.dry_run and not set(mine) & set(owed):
        return _delivered(via="an earlier confirmed invalidation")
    result = await runtime.feedcache.invalidate(podcast_id, wait=True)
    if result.ok:
        await feed_outbox.mark_delivered(runtime.db, owed, now)
        return _delivered(status=result.status, intents=len(owed))
    error = result.error or "not confirmed"
    await feed_outbox.mark_failed(runtime.db, [i for i in mine if i in owed] or owed, error)
    return _failed(error, permanent=result.permanent)


def _same_delivery(effect: Effect) -> str:
    """Effects that one attempt delivers together: a podcast's feed invalidations (a
    confirmed call settles every intent of that podcast); every other effect is its own."""
    if effect.kind == "feed_invalidate":
        return f"feed_invalidate:{effect.read(FeedInvalidatePayload).podcast_id}"
    return f"effect:{effect.id}"


# --- settling ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class DrainReport:
    adopted: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    purged: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    dead_by_kind: dict[str, int] = field(default_factory=dict)
    errors: list[Failure] = field(default_factory=list)
    # (key, delivered at) of every email the drain delivered: a sent warning's stage is
    # claimed by its sender (``overage.deliver_and_claim``)
    mail_delivered: list[tuple[str, datetime]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "effects_delivered": self.delivered,
            "effects_retried": self.retried,
            "effects_dead": self.dead,
        }

    def to_json(self) -> JsonObject:
        # the counts under the lane's names, beside the outbox's state by kind
        return {
            **self.counts(),
            "effects_adopted": self.adopted,
            "effects_released": self.released,
            "effects_purged": self.purged,
            "pending": self.pending,
            "dead": self.dead_by_kind,
            "errors": self.errors,
        }


@dataclass(kw_only=True, slots=True)
class _Tally:
    """What a drain's settlements came to so far; a DrainReport once the drain ends."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    errors: list[Failure] = field(default_factory=list)
    mail_delivered: list[tuple[str, datetime]] = field(default_factory=list)

    def failed(self, event_name: str, effect: Effect, error: str, **detail: Any) -> None:
        """One effect's failed attempt: logged under ``event_name`` and kept for the report."""
        failure: Failure = {
            "event": event_name,
            **_ids(effect),
            "attempts": effect.attempts,
            **detail,
            "error": error,
        }
        warning(**failure)
        self.errors.append(failure)

    def report(
        self,
        *,
        adopted: int = 0,
        purged: int = 0,
        pending: dict[str, int] | None = None,
        dead_by_kind: dict[str, int] | None = None,
    ) -> DrainReport:
        """The drain's report; deliverEffects adds what it did around the drain."""
        return DrainReport(
            adopted=adopted,
            delivered=self.delivered,
            retried=self.retried,
            dead=self.dead,
            released=self.released,
            purged=purged,
            pending=pending or {},
            dead_by_kind=dead_by_kind or {},
            errors=self.errors,
            mail_delivered=self.mail_delivered,
        )


def _ids(effect: Effect) -> dict[str, Any]:
    return {"effect_id": effect.id, "kind": effect.kind, "key": effect.key}


def _settlement(
    runtime: Runtime,
    effect: Effect,
    delivery: Delivery,
    now: datetime,
    tally: _Tally,
    *,
    log_delivered: bool,
) -> Settle:
    """What a delivery's outcome makes of its effect; logs and counts it. A first attempt's
    caller logs its own event for a delivery (``overage_email_sent``, …), the drain this one."""
    if delivery.status == "delivered":
        tally.delivered += 1
        if effect.kind == "mail":
            tally.mail_delivered.append((effect.key, now))
        if not runtime.dry_run:
            runtime.metrics.inc("nightcrew_effects_delivered_total", kind=effect.kind)
        if log_delivered:
            event("effect_delivered", **_ids(effect), attempts=effect.attempts, **delivery.detail)
            if effect.kind == "billing_resume":  # a retry succeeded: its caller logged nothing
                resume = effect.read(BillingResumePayload)
                billing_resume.log_resumed(
                    podcast_id=str(resume.podcast_id),
                    account_id=resume.account_id,
                    detail=delivery.detail,
                    effect_id=effect.id,
                    attempts=effect.attempts,
                )
        return Settle(effect_id=effect.id, claimed_until=effect.claimed_until, outcome="delivered")
    error = delivery.error or "not confirmed"
    # The last retry is due a little before the maximum age, so a minute tick still makes it.
    next_at = min(
        now + outbox.retry_delay(effect.id, effect.attempts), effect.expires_at - LAST_CALL
    )
    if delivery.status == "transient" and next_at > now:
        tally.retried += 1
        tally.failed("effect_delivery_failed", effect, error, next_attempt_at=next_at.isoformat())
        return Settle(
            effect_id=effect.id,
            claimed_until=effect.claimed_until,
            outcome="retry",
            next_attempt_at=next_at,
            error=error,
        )
    expired = delivery.status == "transient"
    if expired:
        max_age = effect.expires_at - effect.created_at
        error = f"expired: not confirmed within {max_age} (last error: {error})"
    tally.dead += 1
    tally.failed("effects_dead", effect, error, reason="expired" if expired else "permanent")
    return Settle(
        effect_id=effect.id,
        claimed_until=effect.claimed_until,
        outcome="expired" if expired else "permanent",
        error=error,
    )


async def _deliver_claimed(
    runtime: Runtime,
    clock: Clock,
    claimed: Sequence[Effect],
    tally: _Tally,
    *,
    deadline: float | None = None,
    log_delivered: bool = True,
) -> dict[int, Delivery]:
    """Deliver claimed effects (bounded concurrency) and settle them in one statement."""
    gate = asyncio.Semaphore(DRAIN_CONCURRENCY)
    now = wall_now(clock)
    settles: dict[int, Settle] = {}
    deliveries: dict[int, Delivery] = {}

    def settle_as(effect: Effect, delivery: Delivery, at: datetime) -> None:
        deliveries[effect.id] = delivery
        settles[effect.id] = _settlement(
            runtime, effect, delivery, at, tally, log_delivered=log_delivered
        )

    async def one(group: list[Effect]) -> None:
        live = []
        for effect in group:
            if effect.expires_at <= now:  # its window closed while it waited for a retry
                settle_as(
                    effect, _failed(effect.last_error or "never attempted", permanent=False), now
                )
                settles[effect.id] = replace(settles[effect.id], unsent=True)
            else:
                live.append(effect)
        if not live:
            return
        async with gate:
            if deadline is not None and time.monotonic() > deadline:
                for effect in live:
                    tally.released += 1
                    settles[effect.id] = Settle(
                        effect_id=effect.id,
                        claimed_until=effect.claimed_until,
                        outcome="released",
                        next_attempt_at=now,
                    )
                return
            delivery = await deliver(runtime, live[0], now, live[1:])
        for effect in live:
            settle_as(effect, delivery, wall_now(clock))

    groups: dict[str, list[Effect]] = {}
    for effect in claimed:
        groups.setdefault(_same_delivery(effect), []).append(effect)
    try:
        await asyncio.gather(*(one(g) for g in groups.values()))
    finally:
        # What was settled is recorded even when the run is being cancelled (SIGTERM): a lost
        # 'delivered' would have the next drain send it again once the lease runs out.
        await asyncio.shield(outbox.settle(runtime.db, list(settles.values()), wall_now(clock)))
    return deliveries


async def deliver_now(runtime: Runtime, clock: Clock, effects: Sequence[Effect]) -> list[Delivery]:
    """The first attempt, right after the commit that recorded ``effects`` (in their order).

    An effect that was already settled (the same key owed before), or that a concurrent drain
    holds, is not sent again here: its outcome is read from its row (in flight → transient).
    A dry run sends to the dry-run view's recording stand-ins and settles nothing.
    """
    if not effects:
        return []
    if runtime.dry_run:
        return [
            _settled_outcome(e) if e.settled else await deliver(runtime, e, wall_now(clock))
            for e in effects
        ]
    claimed = await outbox.claim_ids(
        runtime.db, [e.id for e in effects if not e.settled], wall_now(clock)
    )
    done = await _deliver_claimed(
        runtime,
        clock,
        claimed,
        _Tally(),  # the caller reports each delivery itself
        deadline=time.monotonic() + FIRST_ATTEMPT_BUDGET_SECONDS,
        log_delivered=False,
    )
    out: list[Delivery] = []
    for effect in effects:
        if effect.id in done:
            out.append(done[effect.id])
            continue
        current = effect if effect.settled else await outbox.get(runtime.db, effect.id)
        if current is not None and current.settled:
            out.append(_settled_outcome(current))
        else:  # in flight elsewhere, or left to the drain by the time budget
            out.append(_failed("left to deliverEffects", permanent=False))
    return out


def _settled_outcome(effect: Effect) -> Delivery:
    """The outcome of an effect settled before this caller could attempt it."""
    if effect.delivered_at is not None:
        return _delivered(earlier=True)
    return _failed(effect.last_error or "dead", permanent=True)


async def drain(
    runtime: Runtime,
    clock: Clock,
    *,
    kinds: Sequence[str] | None = None,
    budget_seconds: float = DRAIN_BUDGET_SECONDS,
) -> DrainReport:
    """Deliver every due effect (of ``kinds``), a batch at a time, until none is due or the
    time budget is spent."""
    tally = _Tally()
    await _drain(runtime, clock, tally, kinds=kinds, budget_seconds=budget_seconds)
    return tally.report()


async def _drain(
    runtime: Runtime,
    clock: Clock,
    tally: _Tally,
    *,
    kinds: Sequence[str] | None = None,
    budget_seconds: float = DRAIN_BUDGET_SECONDS,
) -> None:
    deadline = time.monotonic() + budget_seconds
    while time.monotonic() < deadline:
        claimed = await outbox.claim_due(
            runtime.db, wall_now(clock), limit=DRAIN_BATCH, kinds=kinds
        )
        if not claimed:
            break
        await _deliver_claimed(runtime, clock, claimed, tally, deadline=deadline)
        if runtime.dry_run:
            break  # its claims are rolled back: the same rows would come back forever


async def deliver_effects(runtime: Runtime, clock: Clock) -> DrainReport:
    """The minute lane's fifth sweep (``deliverEffects``): adopt undelivered feed-outbox
    intents, drain what is due, purge old delivered rows, refresh the gauges."""
    tally = _Tally()
    now = wall_now(clock)
    adopted = await outbox.adopt_feed_outbox(runtime.db, now, limit=ADOPT_FEED_OUTBOX_MAX)
    await _drain(runtime, clock, tally)
    purged = await outbox.purge_delivered(runtime.db, now - DELIVERED_RETENTION, limit=PURGE_BATCH)
    by_kind = await outbox.counts(runtime.db)
    for kind in KINDS:
        runtime.metrics.set("nightcrew_effects_pending", by_kind[kind]["pending"], kind=kind)
        runtime.metrics.set("nightcrew_effects_dead", by_kind[kind]["dead"], kind=kind)
    return tally.report(
        adopted=len(adopted),
        purged=purged,
        pending={k: v["pending"] for k, v in by_kind.items()},
        dead_by_kind={k: v["dead"] for k, v in by_kind.items()},
    )
