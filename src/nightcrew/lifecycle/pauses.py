"""Daily lane, job 1: reactivate podcasts whose pause expired, then resume the owner's billing.

Each podcast is its own claim (a conditional UPDATE) in its own transaction, and that same
transaction records the ``billing_resume`` effect the reactivation owes. The Stripe call is
made right after the commit; if Stripe fails it is ``billing_resume_failed`` for this run and
the minute lane's ``deliverEffects`` retries it, with the same idempotency key, until Stripe
confirms it. A Stripe failure never undoes a reactivation, and a reactivation never loses its
billing resume — not to an outage, not to a crash right after the commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import Delivery, deliver_now
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle.billing_resume import (
    STRIPE_NOT_CONFIGURED,
    BillingResume,
    BillingResumePayload,
    log_resumed,
    owed_resume,
)
from nightcrew.log import error, event, warning
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)


def billing_resume_key(podcast_id: str, reactivated_at: datetime) -> str:
    """One resume per reactivation: Stripe's idempotency key and the effect's key."""
    return f"billing_resume:{podcast_id}:{int(reactivated_at.timestamp() * 1000)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class _DuePause:
    """A row of due_paused_podcasts."""

    id: UUID
    slug: str
    pause_expires_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Reactivation:
    """A podcast this run reactivated, and what became of its owner's billing."""

    podcast_id: str
    slug: str
    billing: BillingResume

    def to_json(self) -> JsonObject:
        # the billing outcome as BillingResume writes it: only the members it has
        return {"podcast_id": self.podcast_id, "slug": self.slug, "billing": self.billing.to_json()}


@dataclass(frozen=True, kw_only=True, slots=True)
class PausesReport:
    reactivated: list[Reactivation] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        billing = [r.billing.outcome for r in self.reactivated]
        return {
            "podcasts_reactivated": len(self.reactivated),
            "reactivation_failed": sum(
                1 for e in self.errors if e["event"] == "pause_reactivation_failed"
            ),
            "billing_resumed": billing.count("resumed"),
            "billing_skipped": billing.count("skipped"),
            "billing_failed": billing.count("failed"),
            "billing_pending": billing.count("pending"),
        }

    def to_json(self) -> JsonObject:
        return {
            **self.counts(),
            "podcasts": [r.to_json() for r in self.reactivated],
            "errors": self.errors,
        }


async def reactivate_expired_pauses(runtime: Runtime, clock: Clock) -> PausesReport:
    now = clock.now()
    due = await runtime.db.fetch_as(_DuePause, SQL["due_paused_podcasts"], {"now": now})
    reactivated: list[Reactivation] = []
    errors: list[Failure] = []
    for podcast in due:
        podcast_id, slug = str(podcast.id), podcast.slug
        owed: effects.Effect | None = None
        skipped: BillingResume | None = None
        claimed = None
        with one_item(
            errors, "pause_reactivation_failed", podcast_id=podcast_id, slug=slug
        ) as item:
            async with runtime.db.transaction() as tx:
                claimed = await tx.fetch_one(
                    SQL["reactivate_podcast"], {"id": podcast_id, "now": now}
                )
                if claimed is not None:
                    account_id, skipped = await owed_resume(tx, podcast_id)
                    if account_id is not None:
                        owed = await effects.record(
                            tx,
                            key=billing_resume_key(podcast_id, now),
                            payload=BillingResumePayload(
                                podcast_id=podcast_id, account_id=account_id
                            ),
                            now=now,
                        )
        if item.failed:
            continue  # one podcast never stops the next
        if claimed is None:
            continue  # resumed by hand, or by another replica, since the scan
        event(
            "pause_auto_reactivated",
            podcast_id=podcast_id,
            slug=slug,
            pause_expires_at=podcast.pause_expires_at.isoformat(),
        )
        billing = skipped or BillingResume(outcome="skipped")
        if owed is not None:
            [delivery] = await deliver_now(runtime, clock, [owed])
            billing = _billing_outcome(podcast_id, slug, owed, delivery, errors)
        reactivated.append(Reactivation(podcast_id=podcast_id, slug=slug, billing=billing))
    return PausesReport(reactivated=reactivated, errors=errors)


def _billing_outcome(
    podcast_id: str, slug: str, owed: effects.Effect, delivery: Delivery, errors: list[Failure]
) -> BillingResume:
    account_id = owed.read(BillingResumePayload).account_id
    if delivery.status == "delivered":
        detail = delivery.detail
        resumed = BillingResume(
            outcome="skipped" if detail.get("outcome") == "skipped" else "resumed",
            reason=detail.get("reason"),
            account_id=account_id,
            subscription_id=detail.get("subscription_id"),
            self_healed=bool(detail.get("self_healed")),
            effect_id=owed.id,
        )
        # a retry that succeeds later logs it from the drain (effects/deliver.py)
        log_resumed(podcast_id=podcast_id, account_id=account_id, detail=detail, effect_id=owed.id)
        return resumed
    if delivery.error == STRIPE_NOT_CONFIGURED:
        # Loud, and kept: the effect is dead, so `nightcrew effects retry --dead --kind
        # billing_resume` resumes these once STRIPE_SECRET_KEY is set.
        warning(
            "billing_resume_skipped",
            podcast_id=podcast_id,
            account_id=account_id,
            reason="STRIPE_SECRET_KEY is unset",
            effect_id=owed.id,
        )
        return BillingResume(
            outcome="skipped",
            reason="stripe not configured",
            account_id=account_id,
            effect_id=owed.id,
        )
    retried = delivery.status == "transient"
    failure: Failure = {
        "event": "billing_resume_failed",
        "podcast_id": podcast_id,
        "slug": slug,
        "effect_id": owed.id,
        "retried": retried,
        "error": delivery.error,
    }
    error(**failure)
    errors.append(failure)
    return BillingResume(
        outcome="pending" if retried else "failed",
        reason=delivery.error,
        account_id=account_id,
        effect_id=owed.id,
    )
