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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from nightcrew.adapters.mail import Email
from nightcrew.clock import Clock, wall_now
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.effects.outbox import Effect, MailPayload, QueuePayload, Settle
from nightcrew.errors import DatabaseUnavailableError, NightcrewError
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


def delivered(**detail: Any) -> Delivery:
    return Delivery(status="delivered", detail=detail)


def failed(error: str, *, permanent: bool, **detail: Any) -> Delivery:
    return Delivery(status="permanent" if permanent else "transient", error=error, detail=detail)


# --- the kinds: a handler each ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class EffectHandler:
    """How the effects of one kind are delivered. ``queue`` and ``mail`` are built in; a domain
    that records effects of its own kinds hands their handlers to the runtime at assembly
    (``assembly.py``), so this package knows no domain.

    * ``deliver(runtime, effects, now)``: one attempt for ``effects`` (one, or every effect
      ``together`` groups with it), never raising but for a lost database;
    * ``together(effect)``: a key shared by effects that one attempt delivers at once (a
      podcast's feed invalidations); None: each effect on its own;
    * ``drain_delivered(effect, delivery)``: what to log when the drain, not the caller that
      recorded it, delivered an effect (a retry that succeeded);
    * ``adopt(db, now)``: effects owed elsewhere (a platform's own outbox) that the minute lane
      records before it drains; how many."""

    kind: str
    deliver: Callable[[Runtime, Sequence[Effect], datetime], Awaitable[Delivery]]
    together: Callable[[Effect], str] | None = None
    drain_delivered: Callable[[Effect, Delivery], None] | None = None
    adopt: Callable[[Database, datetime], Awaitable[int]] | None = None


def handlers(runtime: Runtime) -> Mapping[str, EffectHandler]:
    """Every kind this runtime delivers: the built-in ones and those registered at assembly."""
    return {**BUILT_IN, **runtime.effect_handlers}


def _handler(runtime: Runtime, kind: str) -> EffectHandler | None:
    """``handlers(runtime)[kind]``, without building the mapping for each effect."""
    return runtime.effect_handlers.get(kind) or BUILT_IN.get(kind)


# --- one attempt, by kind ----------------------------------------------------------------------
async def deliver(
    runtime: Runtime, effect: Effect, now: datetime, siblings: Sequence[Effect] = ()
) -> Delivery:
    """One attempt. Never raises: an unexpected failure is a transient outcome with its text.
    ``siblings`` are effects that this one attempt settles too (see ``_same_delivery``)."""
    handler = _handler(runtime, effect.kind)
    if handler is None:  # a process assembled without it: one that has it delivers it
        error = f"no handler for effect kind {effect.kind!r} in this process"
        return failed(error, permanent=False)
    try:
        async with asyncio.timeout(DELIVERY_TIMEOUT_SECONDS):
            return await handler.deliver(runtime, [effect, *siblings], now)
    except TimeoutError:
        return failed(f"no answer within {DELIVERY_TIMEOUT_SECONDS} s", permanent=False)
    except DatabaseUnavailableError:
        raise  # the run stops: every claimed effect is retried once the database is back
    except Exception as exc:  # a bug or the database: retried, and reported with its text
        return failed(describe_error(exc), permanent=False)


async def _queue(runtime: Runtime, effects: Sequence[Effect], _now: datetime) -> Delivery:
    [effect] = effects
    message = effect.read(QueuePayload)
    body = {**message.body, "effect_id": effect.id}
    try:
        await runtime.queues.send(message.queue, body, int(message.delay_seconds or 0))
        return delivered(via="queue")
    except DatabaseUnavailableError:
        raise
    except NightcrewError as exc:
        queue_error = describe_error(exc)
    fallback = message.fallback_invalidate
    if not fallback:
        return failed(queue_error, permanent=False)
    # The deletion's feed invalidation: the feed worker's endpoint when the queue refuses.
    warning(
        "rss_invalidation_queue_failed", podcast_id=fallback, error=queue_error, fallback="http"
    )
    result = await runtime.feedcache.invalidate(str(fallback))
    if result.ok:
        return delivered(via="http")
    return failed(f"queue: {queue_error}; http: {result.error}", permanent=False)


async def _mail(runtime: Runtime, effects: Sequence[Effect], _now: datetime) -> Delivery:
    [effect] = effects
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
        return delivered(message_id=result.message_id)
    return failed(result.error or "not sent", permanent=result.outcome == "permanent")


BUILT_IN: Mapping[str, EffectHandler] = {
    h.kind: h
    for h in (
        EffectHandler(kind="queue", deliver=_queue),
        EffectHandler(kind="mail", deliver=_mail),
    )
}


def _same_delivery(runtime: Runtime, effect: Effect) -> str:
    """Effects that one attempt delivers together (their handler's ``together``); every other
    effect is its own."""
    handler = _handler(runtime, effect.kind)
    if handler is not None and handler.together is not None:
        return f"{effect.kind}:{handler.together(effect)}"
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
            handler = _handler(runtime, effect.kind)
            if handler is not None and handler.drain_delivered is not None:
                handler.drain_delivered(effect, delivery)  # its caller logged nothing
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
                    effect, failed(effect.last_error or "never attempted", permanent=False), now
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
        groups.setdefault(_same_delivery(runtime, effect), []).append(effect)
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
            out.append(failed("left to deliverEffects", permanent=False))
    return out


def _settled_outcome(effect: Effect) -> Delivery:
    """The outcome of an effect settled before this caller could attempt it."""
    if effect.delivered_at is not None:
        return delivered(earlier=True)
    return failed(effect.last_error or "dead", permanent=True)


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
    """The minute lane's fifth sweep (``deliverEffects``): adopt what the kinds' handlers owe
    from elsewhere (the feed-invalidation outbox), drain what is due, purge old delivered rows,
    refresh the gauges."""
    tally = _Tally()
    now = wall_now(clock)
    kinds = handlers(runtime)
    adopted = 0
    for handler in kinds.values():
        if handler.adopt is not None:
            adopted += await handler.adopt(runtime.db, now)
    await _drain(runtime, clock, tally)
    purged = await outbox.purge_delivered(runtime.db, now - DELIVERED_RETENTION, limit=PURGE_BATCH)
    by_kind = await outbox.counts(runtime.db, kinds)
    for kind in by_kind:
        runtime.metrics.set("nightcrew_effects_pending", by_kind[kind]["pending"], kind=kind)
        runtime.metrics.set("nightcrew_effects_dead", by_kind[kind]["dead"], kind=kind)
    return tally.report(
        adopted=adopted,
        purged=purged,
        pending={k: v["pending"] for k, v in by_kind.items()},
        dead_by_kind={k: v["dead"] for k, v in by_kind.items()},
    )
