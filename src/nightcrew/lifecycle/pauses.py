"""Daily lane, job 1: reactivate podcasts whose pause expired, then resume the owner's billing.

Each podcast is its own claim (a conditional UPDATE, its own transaction); billing is resumed
after the reactivation commits, so a Stripe failure never undoes a reactivation — it is logged
(``billing_resume_failed``), reported, and the podcast stays active.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.log import describe_error, error, event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# Billing models that are not billed through a Stripe subscription.
NON_SUBSCRIPTION_BILLING_MODELS = frozenset({"enterprise_manual", "ltd"})

BillingOutcome = Literal["resumed", "skipped", "failed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BillingResume:
    outcome: BillingOutcome
    reason: str | None = None
    account_id: str | None = None
    subscription_id: str | None = None
    self_healed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in {
                "outcome": self.outcome,
                "reason": self.reason,
                "account_id": self.account_id,
                "subscription_id": self.subscription_id,
                "self_healed": self.self_healed or None,
            }.items()
            if v is not None
        }


async def resume_owner_billing_after_reactivation(
    runtime: Runtime, podcast_id: str
) -> BillingResume:
    """spec 000 resumeOwnerBillingAfterReactivation: owner → account → subscription → resume."""
    account = await runtime.db.fetch_one(SQL["owner_billing_account"], {"podcast_id": podcast_id})
    if account is None:
        return BillingResume(outcome="skipped", reason="no owner billing account")
    account_id = str(account["id"])
    if account["billing_model"] in NON_SUBSCRIPTION_BILLING_MODELS:
        return BillingResume(
            outcome="skipped",
            reason=f"billing_model {account['billing_model']}",
            account_id=account_id,
        )
    if not runtime.billing.configured:
        warning(
            "billing_resume_skipped",
            podcast_id=podcast_id,
            account_id=account_id,
            reason="STRIPE_SECRET_KEY is unset",
        )
        return BillingResume(
            outcome="skipped", reason="stripe not configured", account_id=account_id
        )

    subscription_id = account["stripe_subscription_id"]
    self_healed = False
    if not subscription_id:
        customer_id = account["stripe_customer_id"]
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

    await runtime.billing.resume_collection(subscription_id)
    return BillingResume(
        outcome="resumed",
        account_id=account_id,
        subscription_id=subscription_id,
        self_healed=self_healed,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PausesReport:
    reactivated: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        billing = [r["billing"]["outcome"] for r in self.reactivated]
        return {
            "podcasts_reactivated": len(self.reactivated),
            "reactivation_failed": sum(
                1 for e in self.errors if e["event"] == "pause_reactivation_failed"
            ),
            "billing_resumed": billing.count("resumed"),
            "billing_skipped": billing.count("skipped"),
            "billing_failed": billing.count("failed"),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.counts(), "podcasts": self.reactivated, "errors": self.errors}


async def reactivate_expired_pauses(runtime: Runtime, clock: Clock) -> PausesReport:
    now = clock.now()
    due = await runtime.db.fetch(SQL["due_paused_podcasts"], {"now": now})
    reactivated: list[dict[str, Any]] = []
    errors: list[Failure] = []
    for podcast in due:
        podcast_id, slug = str(podcast["id"]), podcast["slug"]
        try:
            claimed = await runtime.db.fetch_one(
                SQL["reactivate_podcast"], {"id": podcast_id, "now": now}
            )
        except Exception as exc:  # one podcast never stops the next
            failure = {
                "event": "pause_reactivation_failed",
                "podcast_id": podcast_id,
                "slug": slug,
                "error": describe_error(exc),
            }
            error(**failure)
            errors.append(failure)
            continue
        if claimed is None:
            continue  # resumed by hand, or by another replica, since the scan
        event(
            "pause_auto_reactivated",
            podcast_id=podcast_id,
            slug=slug,
            pause_expires_at=podcast["pause_expires_at"].isoformat(),
        )

        try:
            billing = await resume_owner_billing_after_reactivation(runtime, podcast_id)
        except Exception as exc:  # Stripe, or the database, failing for this one podcast
            billing = BillingResume(outcome="failed", reason=describe_error(exc))
            failure = {
                "event": "billing_resume_failed",
                "podcast_id": podcast_id,
                "slug": slug,
                "error": billing.reason,
            }
            error(**failure)
            errors.append(failure)
        else:
            if billing.outcome == "resumed":
                event(
                    "billing_resumed_after_reactivation",
                    podcast_id=podcast_id,
                    account_id=billing.account_id,
                    subscription_id=billing.subscription_id,
                    self_healed=billing.self_healed,
                )
        reactivated.append({"podcast_id": podcast_id, "slug": slug, "billing": billing.to_json()})
    return PausesReport(reactivated=reactivated, errors=errors)
