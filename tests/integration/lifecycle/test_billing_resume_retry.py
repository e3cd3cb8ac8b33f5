"""`billing_resumed_after_reactivation` when the resume succeeds on a retry.

The pause-expiry job owes the Stripe resume as a `billing_resume` effect; when its first
attempt fails, the minute lane's drain retries it. The event says the billing was resumed, so it
is logged by whichever attempt Stripe confirms — the first, or a later retry — and once.
Real PostgreSQL; Stripe is the loopback stand-in, failing with 500 first.
"""

from __future__ import annotations

from datetime import timedelta

from structlog.testing import capture_logs

from nightcrew.adapters.billing import StripeBilling
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects.deliver import deliver_effects
from nightcrew.lifecycle.pauses import reactivate_expired_pauses
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_pauses import _paused_podcast
from tests.support.servers import RecordingServer, stripe_responder

EVENT = "billing_resumed_after_reactivation"


async def test_a_resume_that_succeeds_on_the_drains_retry_logs_the_event_once(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe_server: RecordingServer
) -> None:
    podcast, account = await _paused_podcast(db, expires=NOW - timedelta(minutes=1))
    stripe_server.responder = stripe_responder({}, fail_status=500)
    billing = StripeBilling("sk_test_123", api_base=stripe_server.url, max_network_retries=0)
    runtime = await make_runtime(db, clock, fresh_db_url, billing=billing)
    try:
        with capture_logs() as first_logs:
            report = await reactivate_expired_pauses(runtime, clock)
        assert report.counts()["billing_pending"] == 1
        assert EVENT not in [e["event"] for e in first_logs]  # not resumed yet
        effect_id = report.reactivated[0].billing.effect_id

        stripe_server.responder = stripe_responder({})  # Stripe recovers
        clock.advance(timedelta(hours=1))  # past the retry's backoff
        with capture_logs() as retry_logs:
            drained = await deliver_effects(runtime, clock)
        assert drained.delivered == 1

        clock.advance(timedelta(hours=1))
        with capture_logs() as later_logs:
            await deliver_effects(runtime, clock)
    finally:
        await billing.close()

    [resumed] = [e for e in retry_logs if e["event"] == EVENT]
    assert resumed["podcast_id"] == podcast and resumed["account_id"] == account
    assert resumed["subscription_id"] == "sub_1" and resumed["self_healed"] is False
    assert resumed["effect_id"] == effect_id and resumed["attempts"] == 2
    assert resumed["log_level"] == "info"
    assert EVENT not in [e["event"] for e in later_logs]  # once
    posts = [r for r in stripe_server.requests if r.method == "POST"]
    assert len(posts) == 2


async def test_a_resume_confirmed_at_once_is_logged_by_its_first_attempt_only(
    db: Database, clock: FrozenClock, fresh_db_url: str, stripe_server: RecordingServer
) -> None:
    await _paused_podcast(db, expires=NOW)
    stripe_server.responder = stripe_responder({})
    billing = StripeBilling("sk_test_123", api_base=stripe_server.url, max_network_retries=0)
    runtime = await make_runtime(db, clock, fresh_db_url, billing=billing)
    try:
        with capture_logs() as logs:
            await reactivate_expired_pauses(runtime, clock)
            clock.advance(timedelta(hours=1))
            await deliver_effects(runtime, clock)
    finally:
        await billing.close()
    assert [e["event"] for e in logs].count(EVENT) == 1
