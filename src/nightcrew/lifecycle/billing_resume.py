"""Resume the owner's Stripe billing after a paused podcast is reactivated.

Two halves, because the Stripe call is an effect (``billing_resume``) owed by the reactivation:
``owed_resume`` decides, inside the reactivation's transaction, whether a resume is owed at all
(an owner with a subscription-billed account); ``resume_billing`` is the delivery, run right
after the commit and again by the minute lane's drain until Stripe confirms it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal
from uuid import UUID

from nightcrew.adapters.billing import is_transient
from nightcrew.db.database import Tx
from nightcrew.db.queries import load_queries
from nightcrew.effects.deliver import Delivery, EffectHandler, delivered, failed
from nightcrew.effects.outbox import EFFECT_MAX_AGE, Effect, EffectPayload
from nightcrew.errors import BillingError
from nightcrew.jsonable import JsonObject, named
from nightcrew.log import event
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# Billing models that are not billed through a Stripe subscription.
NON_SUBSCRIPTION_BILLING_MODELS = frozenset({"enterprise_manual", "ltd"})
STRIPE_NOT_CONFIGURED = "Stripe is not configured (STRIPE_SECRET_KEY is unset)"

BillingOutcome = Literal["resumed", "skipped", "failed", "pending"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BillingResumePayload(EffectPayload):
    """The owner's Stripe billing to resume after ``podcast_id`` was reactivated."""

    kind: ClassVar[str] = "billing_resume"
    max_age: ClassVar[timedelta] = EFFECT_MAX_AGE
    account_id: str = named("account_id")
    podcast_id: str | None = named("podcast_id", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class BillingResume:
    outcome: BillingOutcome
    reason: str | None = None
    account_id: str | None = None
    subscription_id: str | None = None
    self_healed: bool = False
    effect_id: int | None = None

    def to_json(self) -> JsonObject:
        # only what the outcome has: no null members, and self_healed only when it was
        return {
            k: v
            for k, v in {
                "outcome": self.outcome,
                "reason": self.reason,
                "account_id": self.account_id,
                "subscription_id": self.subscription_id,
                "self_healed": self.self_healed or None,
                "effect_id": self.effect_id,
            }.items()
            if v is not None
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class _BillingAccount:
    """A row of owner_billing_account and billing_account."""

    id: UUID
    billing_model: str | None
    stripe_customer_id: str | None
    stripe_subscription_id: str | None


async def owed_resume(tx: Tx, podcast_id: str) -> tuple[str | None, BillingResume | None]:
    """(account id owed a resume, None) — or (None, the skip) when nothing is owed."""
    account = await tx.fetch_one_as(
        _BillingAccount, SQL["owner_billing_account"], {"podcast_id": podcast_id}
    )
    if account is None:
        return None, BillingResume(outcome="skipped", reason="no owner billing account")
    account_id = str(account.id)
    if account.billing_model in NON_SUBSCRIPTION_BILLING_MODELS:
        return None, BillingResume(
            outcome="skipped",
            reason=f"billing_model {account.billing_model}",
            account_id=account_id,
        )
    return account_id, None


def log_resumed(
    *, podcast_id: str, account_id: str, detail: Mapping[str, Any], effect_id: int, **extra: Any
) -> bool:
    """``billing_resumed_after_reactivation``, once Stripe confirmed a resume: by its first
    attempt (pauses.py) or by a retry of the minute lane's drain (``HANDLER.drain_delivered``).
    Not for a delivery that resumed nothing (skipped) or that an earlier caller had already
    settled. Returns whether it was logged."""
    if detail.get("outcome") != "resumed" or detail.get("earlier"):
        return False
    event(
        "billing_resumed_after_reactivation",
        podcast_id=podcast_id,
        account_id=account_id,
        subscription_id=detail.get("subscription_id"),
        self_healed=bool(detail.get("self_healed")),
        effect_id=effect_id,
        **extra,
    )
    return True


async def resume_billing(
    runtime: Runtime, account_id: str, *, idempotency_key: str
) -> BillingResume:
    """Find the subscription (self-healing a missing id from the customer) and clear its
    ``pause_collection``. Raises BillingError when Stripe fails or is not configured."""
    if not runtime.billing.configured:
        raise BillingError(STRIPE_NOT_CONFIGURED)
    account = await runtime.db.fetch_one_as(
        _BillingAccount, SQL["billing_account"], {"account_id": account_id}
    )
    if account is None:
        return BillingResume(outcome="skipped", reason="billing account is gone")
    subscription_id = account.stripe_subscription_id
    self_healed = False
    if not subscription_id:
        customer_id = account.stripe_customer_id
        if not customer_id:
            return BillingResume(
                outcome="skipped", reason="no stripe customer", account_id=account_id
            )
        # Self-heal: the subscription id was never cached; resolve it from the customer.
        subscription_id = await runtime.billing.find_subscription_id(customer_id)
        if subscription_id is None:
            return BillingResume(
                outcome="skipped", reason="customer has no subscription", account_id=account_id
            )
        await runtime.db.execute(
            SQL["cache_subscription_id"],
            {"subscription_id": subscription_id, "account_id": account_id},
        )
        self_healed = True

    await runtime.billing.resume_collection(subscription_id, idempotency_key=idempotency_key)
    return BillingResume(
        outcome="resumed",
        account_id=account_id,
        subscription_id=subscription_id,
        self_healed=self_healed,
    )


# --- the effect's delivery (registered at assembly: lifecycle/effect_kinds.py) -----------------
async def _deliver(runtime: Runtime, effects: Sequence[Effect], _now: datetime) -> Delivery:
    [effect] = effects
    try:
        resumed = await resume_billing(
            runtime, effect.read(BillingResumePayload).account_id, idempotency_key=effect.key
        )
    except BillingError as exc:
        permanent = not runtime.billing.configured or not is_transient(exc)
        return failed(str(exc), permanent=permanent)
    return delivered(**resumed.to_json())


def _drain_delivered(effect: Effect, delivery: Delivery) -> None:
    resume = effect.read(BillingResumePayload)
    log_resumed(
        podcast_id=str(resume.podcast_id),
        account_id=resume.account_id,
        detail=delivery.detail,
        effect_id=effect.id,
        attempts=effect.attempts,
    )


HANDLER = EffectHandler(kind="billing_resume", deliver=_deliver, drain_delivered=_drain_delivered)
