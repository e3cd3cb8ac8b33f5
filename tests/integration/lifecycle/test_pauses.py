"""Pause expiry and billing resume: real PostgreSQL, a real HTTP server standing in for Stripe."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.billing import StripeBilling
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.pauses import reactivate_expired_pauses
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.support.servers import RecordingServer, stripe_responder


@pytest.fixture
def stripe(stripe_server: RecordingServer) -> RecordingServer:
    stripe_server.responder = stripe_responder({"cus_heal": ["sub_healed"]})
    return stripe_server


async def _paused_podcast(
    db: Database,
    *,
    expires: Any,
    billing_model: str = "subscription",
    customer: str | None = "cus_1",
    subscription: str | None = "sub_1",
) -> tuple[str, str]:
    owner = await f.user(db)
    account = await f.account(
        db,
        owner_user_id=owner,
        billing_model=billing_model,
        stripe_customer_id=customer,
        stripe_subscription_id=subscription,
    )
    await db.execute(
        "INSERT INTO public.user_profiles (id, email, billing_account_id)"
        " VALUES (%(u)s, 'owner@example.test', %(a)s)",
        {"u": owner, "a": account},
    )
    podcast = await f.podcast(
        db,
        billing_account_id=account,
        status="paused",
        paused_at=NOW - timedelta(days=30),
        pause_expires_at=expires,
    )
    await db.execute(
        "INSERT INTO public.podcast_members (podcast_id, user_id, role)"
        " VALUES (%(p)s, %(u)s, 'owner')",
        {"p": podcast, "u": owner},
    )
    return podcast, account


async def _with_stripe(
    db: Database, clock: FrozenClock, url: str, server: RecordingServer
) -> Runtime:
    return await make_runtime(
        db, clock, url, billing=StripeBilling("sk_test_123", api_base=server.url)
    )


async def _podcast(db: Database, podcast: str) -> dict[str, Any]:
    row = await db.fetch_one("SELECT * FROM public.podcasts WHERE id = %(id)s", {"id": podcast})
    assert row is not None
    return row


@pytest.mark.parametrize(("offset", "expected"), [(-1, True), (0, True), (+1, False)])
async def test_due_not_yet_due_and_the_boundary(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    stripe: RecordingServer,
    offset: int,
    expected: bool,
) -> None:
    podcast, _ = await _paused_podcast(db, expires=NOW + timedelta(seconds=offset))
    runtime = await _with_stripe(db, clock, fresh_db_url, stripe)
    with capture_logs() as logs:
        report = await reactivate_expired_pauses(runtime, clock)
    row = await _podcast(db, podcast)
    if expected:
        assert report.counts()["podcasts_reactivated"] == 1
        assert row["status"] == "active" and row["paused_at"] is None
        assert row["pause_expires_at"] is None and row["last_pause_ended_at"] == NOW
        assert row["is_active"] is True and row["overage_suspended_at"] is None
        names = [e["event"] for e in logs]
        assert names == ["pause_auto_reactivated", "billing_resumed_after_reactivation"]
        [update] = stripe.requests
        assert (update.method, update.path) == ("POST", "/v1/subscriptions/sub_1")
        assert update.form() == {"pause_collection": ""}
        assert update.headers["Authorization"] == "Bearer sk_test_123"
    else:
        assert report.counts()["podcasts_reactivated"] == 0
        assert row["status"] == "paused" and stripe.requests == []


async def test_missing_subscription_id_is_self_healed_and_cached(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe: RecordingServer
) -> None:
    _, account = await _paused_podcast(db, expires=NOW, customer="cus_heal", subscription=None)
    report = await reactivate_expired_pauses(
        await _with_stripe(db, clock, fresh_db_url, stripe), clock
    )
    billing = report.reactivated[0].billing.to_json()  # as the run's report writes it
    assert isinstance(billing.pop("effect_id"), int)
    assert billing == {
        "outcome": "resumed",
        "account_id": account,
        "subscription_id": "sub_healed",
        "self_healed": True,
    }
    lookup, update = stripe.requests
    assert (lookup.method, lookup.path) == ("GET", "/v1/subscriptions")
    assert lookup.query == {"customer": "cus_heal", "limit": "1"}
    assert update.path == "/v1/subscriptions/sub_healed"
    cached = await db.fetch_one(
        "SELECT stripe_subscription_id FROM public.billing_accounts WHERE id = %(a)s",
        {"a": account},
    )
    assert cached == {"stripe_subscription_id": "sub_healed"}


@pytest.mark.parametrize("model", ["enterprise_manual", "ltd"])
async def test_non_subscription_billing_models_are_skipped(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe: RecordingServer, model: str
) -> None:
    podcast, _ = await _paused_podcast(db, expires=NOW, billing_model=model)
    report = await reactivate_expired_pauses(
        await _with_stripe(db, clock, fresh_db_url, stripe), clock
    )
    assert report.reactivated[0].billing.outcome == "skipped"
    assert model in (report.reactivated[0].billing.reason or "")
    assert stripe.requests == []
    assert (await _podcast(db, podcast))["status"] == "active"


async def test_a_stripe_5xx_is_billing_resume_failed_and_the_podcast_stays_active(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe: RecordingServer
) -> None:
    stripe.responder = stripe_responder({}, fail_status=500)
    podcast, _ = await _paused_podcast(db, expires=NOW)
    with capture_logs() as logs:
        report = await reactivate_expired_pauses(
            await _with_stripe(db, clock, fresh_db_url, stripe), clock
        )
    assert (await _podcast(db, podcast))["status"] == "active"
    failed = [e for e in logs if e["event"] == "billing_resume_failed"]
    assert len(failed) == 1 and failed[0]["podcast_id"] == podcast
    assert "500" in failed[0]["error"]
    # not lost: pending, retried by the minute lane (tests/integration/effects)
    assert report.counts()["billing_pending"] == 1 and failed[0]["retried"] is True
    assert report.errors[0]["event"] == "billing_resume_failed"
    assert len(stripe.requests) >= 1  # the SDK may retry a 5xx; every attempt failed


async def test_without_stripe_the_resume_is_skipped_loudly_and_the_podcast_reactivated(
    db: Database, runtime: Runtime, clock: FrozenClock
) -> None:
    podcast, _ = await _paused_podcast(db, expires=NOW)
    with capture_logs() as logs:
        report = await reactivate_expired_pauses(runtime, clock)  # runtime has NoBilling
    assert (await _podcast(db, podcast))["status"] == "active"
    assert report.reactivated[0].billing.reason == "stripe not configured"
    skipped = [e for e in logs if e["event"] == "billing_resume_skipped"]
    assert skipped and skipped[0]["log_level"] == "warning"


async def test_two_replicas_reactivate_and_resume_billing_once(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe: RecordingServer
) -> None:
    import asyncio

    for _ in range(5):
        await _paused_podcast(db, expires=NOW - timedelta(hours=1))
    other_db = await Database.open(fresh_db_url)
    try:
        reports = await asyncio.gather(
            reactivate_expired_pauses(await _with_stripe(db, clock, fresh_db_url, stripe), clock),
            reactivate_expired_pauses(
                await _with_stripe(other_db, clock, fresh_db_url, stripe), clock
            ),
        )
    finally:
        await other_db.close()
    assert sum(r.counts()["podcasts_reactivated"] for r in reports) == 5
    assert len([r for r in stripe.requests if r.method == "POST"]) == 5
