"""What the overage escalation owes the outside world, recorded in the transaction that
decides it: the stage's email (keyed ``overage:{account}:{since}:{stage}``), the feeds to
invalidate, and the claim of a stage once its email was really sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import Clock
from nightcrew.db.database import Tx
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects
from nightcrew.effects.deliver import deliver_now
from nightcrew.lifecycle import feed_outbox
from nightcrew.lifecycle.overage_mail import Overage, render
from nightcrew.lifecycle.overage_report import SentEmail, StageClaim, Tally
from nightcrew.log import event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Feed:
    """A podcast whose feed changed: the rows overage.sql's stamp and unstamp_except return."""

    id: UUID
    slug: str


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


async def owe_email(
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
    recipient = await tx.fetch_value(str, SQL["owner_email"], {"id": account})
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
        key=idempotency_key(account, since, stage),
        payload=effects.MailPayload(to=recipient, subject=subject, text=text, html=markup),
        now=now,
    )


async def send_owed(
    runtime: Runtime,
    clock: Clock,
    account: str,
    stage: int | str,
    email: effects.Effect | None,
    tally: Tally,
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
                SentEmail(
                    account_id=account,
                    stage=stage,
                    to=email.read(effects.MailPayload).to,
                    idempotency_key=email.key,
                )
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


async def claim_stage(
    runtime: Runtime,
    account: str,
    since: datetime,
    stage: int,
    now: datetime,
    tally: Tally,
) -> None:
    claimed = await runtime.db.fetch_one(
        SQL["claim_stage"], {"id": account, "since": since, "stage": stage, "now": now}
    )
    if claimed is not None:
        tally.claims.append(StageClaim(account_id=account, stage=stage))


async def owe_invalidations(
    tx: Tx, now: datetime, podcasts: Sequence[Feed], kind: str, reason: str
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
            patterns=[f"{PUBLIC_API_INVALIDATION}:{opposite}:{p.id}:%" for p in podcasts],
        )
    owed = await feed_outbox.record(tx, [str(p.id) for p in podcasts], reason, now)
    for podcast in podcasts:
        podcast_id = str(podcast.id)
        message = feed_outbox.PodcastInvalidation(
            type=kind, podcast_id=podcast_id, podcast_slug=podcast.slug
        )
        owed.append(
            await effects.record(
                tx,
                key=f"{PUBLIC_API_INVALIDATION}:{kind}:{podcast_id}:{int(now.timestamp() * 1000)}",
                payload=effects.QueuePayload(queue=PUBLIC_API_INVALIDATION, body=message.to_json()),
                now=now,
            )
        )
    return owed


def _podcast_of(effect: effects.Effect) -> str:
    """The podcast an owed invalidation is about: the feed worker's intent, or the message."""
    if effect.kind == "feed_invalidate":
        return effect.read(feed_outbox.FeedInvalidatePayload).podcast_id
    # only the id: a message of any shape that names its podcast will do
    return str(effect.read(effects.QueuePayload).body["podcast_id"])


async def invalidate_feeds(
    runtime: Runtime, clock: Clock, owed: list[effects.Effect], tally: Tally
) -> None:
    """The first attempt of the invalidations owed; a failure is reported and retried by the
    minute lane until it is confirmed."""
    for effect, delivery in zip(owed, await deliver_now(runtime, clock, owed), strict=True):
        if delivery.status == "delivered":
            continue
        failure: Failure = {
            "event": "overage_cache_invalidation_failed",
            "podcast_id": _podcast_of(effect),
            "cache": "rss" if effect.kind == "feed_invalidate" else "public-api",
            "effect_id": effect.id,
            "retried": delivery.status == "transient",
            "error": delivery.error,
        }
        warning(**failure)
        tally.errors.append(failure)
