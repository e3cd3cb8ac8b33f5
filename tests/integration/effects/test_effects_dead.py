"""Dead letters: a permanent error ends an effect at once, loudly and countably, and the operator
lists and re-drives dead effects by kind.

A 4xx other than 408/409/429 from Resend or Stripe will fail the same way on every retry: the
effect is dead at that attempt (``dead_reason`` permanent), an ``effects_dead`` warning is
logged, ``nightcrew_effects_dead{kind}`` counts it on /metrics, and nothing is sent again until
``nightcrew effects retry``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from nightcrew.adapters.billing import StripeBilling
from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.effects.deliver import deliver_effects
from nightcrew.http import create_app
from nightcrew.lifecycle.billing_resume import BillingResumePayload
from nightcrew.lifecycle.overage import run_overage_escalation
from nightcrew.lifecycle.overage_owed import idempotency_key
from nightcrew.lifecycle.pauses import billing_resume_key, reactivate_expired_pauses
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.acceptance.test_cli import _env, run
from tests.conftest import NOW, make_runtime
from tests.integration.effects.test_effects import Resend, _effects, _minute, _runtime
from tests.integration.lifecycle.test_overage import _account
from tests.integration.lifecycle.test_pauses import _paused_podcast
from tests.support.servers import RecordingServer, stripe_responder

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


async def _scrape(runtime: Runtime) -> str:
    """GET /metrics of the app `nightcrew serve` runs, over this runtime's metrics."""
    transport = httpx.ASGITransport(app=create_app(runtime.metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


def _dead_gauges(text: str) -> dict[str, str]:
    prefix = 'nightcrew_effects_dead{kind="'
    return {
        line[len(prefix) :].split('"', 1)[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def _died(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "effects_dead"]


@pytest.fixture
def resend(resend_server: RecordingServer) -> Resend:
    return Resend(resend_server)


def _stripe_posts(stripe: RecordingServer) -> list[str | None]:
    return [r.headers.get("Idempotency-Key") for r in stripe.requests if r.method == "POST"]


# "first attempt": the 4xx answers the send right after the commit; "drain": a 500 first, and
# the 4xx answers the minute lane's retry.
WHEN = ["first attempt", "drain"]


@pytest.mark.parametrize("when", WHEN)
async def test_a_422_from_resend_kills_the_email_at_once_and_says_so(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
    when: str,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    account, _ = await _account(db)
    key = idempotency_key(account, NOW, 0)
    resend.mode = "422" if when == "first attempt" else "500"
    with capture_logs() as logs:
        report = await run_overage_escalation(runtime, clock)
        assert report.armed == 1 and report.emails_sent == 0
        if when == "drain":
            assert _died(logs) == []  # a 500 is retried
            resend.mode = "422"
            await _minute(runtime, clock, MINUTE)
    attempts = 1 if when == "first attempt" else 2
    [effect] = await _effects(db, "mail")
    assert effect["key"] == key and effect["attempts"] == attempts
    assert effect["dead_reason"] == "permanent" and effect["dead_at"] == clock.now()
    assert effect["delivered_at"] is None and "422" in effect["last_error"]
    [died] = _died(logs)
    assert died["log_level"] == "warning"
    assert (died["effect_id"], died["kind"], died["key"]) == (effect["id"], "mail", key)
    assert died["reason"] == "permanent" and "422" in died["error"]

    resend.mode = "ok"  # even once Resend would take it: never sent again by itself
    drained = await _minute(runtime, clock, MINUTE)
    await _minute(runtime, clock, HOUR)
    assert resend.keys == attempts * [key] and resend.delivered[key] == 0
    assert drained["dead"]["mail"] == 1
    gauges = _dead_gauges(await _scrape(runtime))
    assert gauges == {"mail": "1", "queue": "0", "billing_resume": "0", "feed_invalidate": "0"}


@pytest.mark.parametrize("when", WHEN)
async def test_a_400_from_stripe_kills_the_billing_resume_at_once_and_says_so(
    db: Database, fresh_db_url: str, stripe_server: RecordingServer, when: str
) -> None:
    clock = FrozenClock(NOW)
    podcast, _ = await _paused_podcast(db, expires=NOW - MINUTE)
    key = billing_resume_key(podcast, NOW)
    first = 400 if when == "first attempt" else 500
    stripe_server.responder = stripe_responder({}, fail_status=first)
    billing = StripeBilling("sk_test_123", api_base=stripe_server.url, max_network_retries=0)
    runtime = await make_runtime(db, clock, fresh_db_url, billing=billing)
    try:
        with capture_logs() as logs:
            report = await reactivate_expired_pauses(runtime, clock)
            outcome = "failed" if when == "first attempt" else "pending"
            assert [r.billing.outcome for r in report.reactivated] == [outcome]
            if when == "drain":
                assert _died(logs) == []
                stripe_server.responder = stripe_responder({}, fail_status=400)
                await _minute(runtime, clock, MINUTE)
        attempts = 1 if when == "first attempt" else 2
        [effect] = await _effects(db, "billing_resume")
        assert effect["key"] == key and effect["attempts"] == attempts
        assert effect["dead_reason"] == "permanent" and effect["dead_at"] == clock.now()
        assert "400" in effect["last_error"]
        [died] = _died(logs)
        assert died["log_level"] == "warning"
        assert (died["effect_id"], died["kind"], died["key"]) == (
            effect["id"],
            "billing_resume",
            key,
        )
        assert died["reason"] == "permanent"

        stripe_server.responder = stripe_responder({})
        await _minute(runtime, clock, MINUTE)
        await _minute(runtime, clock, HOUR)
    finally:
        await billing.close()
    assert _stripe_posts(stripe_server) == attempts * [key]
    gauges = _dead_gauges(await _scrape(runtime))
    assert gauges == {"mail": "0", "queue": "0", "billing_resume": "1", "feed_invalidate": "0"}


# --- the operator's view, by kind -------------------------------------------------------------
async def test_effects_list_and_retry_dead_by_kind(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
    stripe_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    podcast, account = await _paused_podcast(db, expires=NOW + DAY)
    billing = StripeBilling("sk_test_123", api_base=stripe_server.url, max_network_retries=0)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server, billing=billing)
    mail = outbox.MailPayload(to="owner@example.test", subject="s", text="t", html="<p>h</p>")
    async with db.transaction() as tx:
        dead_mail = await outbox.record(tx, key="cli:mail", payload=mail, now=NOW)
        dead_resume = await outbox.record(
            tx,
            key="cli:resume",
            payload=BillingResumePayload(podcast_id=podcast, account_id=account),
            now=NOW,
        )
        dead_queue = await outbox.record(  # owed for longer than a queue message's max age
            tx,
            key="cli:queue",
            payload=outbox.QueuePayload(queue=RSS_INVALIDATION, body={"type": "podcast.deleted"}),
            now=NOW - outbox.IDEMPOTENT_EFFECT_MAX_AGE - DAY,
        )
    resend.mode = "422"
    stripe_server.responder = stripe_responder({}, fail_status=400)
    clock.advance(MINUTE)
    try:
        drained = await deliver_effects(runtime, clock)
    finally:
        await billing.close()
    assert drained.dead == 3
    async with db.transaction() as tx:  # and one still pending, owed just now
        pending_mail = await outbox.record(tx, key="cli:pending", payload=mail, now=clock.now())
    resend_calls, stripe_calls = len(resend.keys), len(stripe_server.requests)

    env = _env(
        DATABASE_URL=fresh_db_url,
        RESEND_API_KEY="re_test",
        RESEND_FROM_EMAIL="billing@podcasts.example",
        RESEND_API_BASE=resend.server.url,
        STRIPE_SECRET_KEY="sk_test_123",
        STRIPE_API_BASE=stripe_server.url,
    )

    def listed(*flags: str) -> list[tuple[int, str, bool]]:
        out = run("effects", "list", *flags, "--json", env=env)
        assert out.returncode == 0, out.stderr
        return [(e["id"], e["kind"], e["dead_at"] is not None) for e in json.loads(out.stdout)]

    assert listed("--kind", "mail") == [
        (dead_mail.id, "mail", True),
        (pending_mail.id, "mail", False),
    ]
    assert listed("--kind", "mail", "--dead") == [(dead_mail.id, "mail", True)]
    assert listed("--kind", "billing_resume") == [(dead_resume.id, "billing_resume", True)]
    assert listed("--kind", "feed_invalidate") == []
    human = run("effects", "list", "--kind", "queue", env=env)
    assert human.returncode == 0 and "cli:queue" in human.stdout
    assert "cli:mail" not in human.stdout and "cli:resume" not in human.stdout

    # Resend and Stripe are fixed; the operator re-drives the dead emails only
    resend.mode = "ok"
    stripe_server.responder = stripe_responder({})
    retried = run("effects", "retry", "--dead", "--kind", "mail", "--json", env=env)
    assert retried.returncode == 0, retried.stderr
    assert [(o["id"], o["kind"], o["outcome"]) for o in json.loads(retried.stdout)] == [
        (dead_mail.id, "mail", "delivered")
    ]
    assert resend.keys[resend_calls:] == ["cli:mail"]  # not the pending one: it is not dead
    assert len(stripe_server.requests) == stripe_calls  # the dead billing resume stayed dead
    assert await f.queue_messages(db, RSS_INVALIDATION) == []
    assert listed("--dead") == [
        (dead_resume.id, "billing_resume", True),
        (dead_queue.id, "queue", True),
    ]

    retried = run("effects", "retry", "--dead", "--kind", "billing_resume", env=env)
    assert retried.returncode == 0, retried.stderr
    assert "billing_resume" in retried.stdout and "delivered" in retried.stdout
    assert _stripe_posts(stripe_server)[-1] == "cli:resume"
    assert listed("--dead") == [(dead_queue.id, "queue", True)]  # its kind was never named
    assert await f.queue_messages(db, RSS_INVALIDATION) == []


async def test_an_effect_whose_window_closed_before_any_attempt_dies_with_no_attempt_counted(
    db: Database, fresh_db_url: str
) -> None:
    """Its claim is no attempt: the row keeps saying it was never tried, and nothing is sent."""
    clock = FrozenClock(NOW)
    queued = await outbox.record(
        db,
        key="never-tried",
        payload=outbox.QueuePayload(queue=RSS_INVALIDATION, body={"type": "podcast.deleted"}),
        now=NOW - DAY * 8,
    )
    await db.execute(
        "UPDATE nightcrew.effects SET expires_at = %(t)s, next_attempt_at = %(t)s"
        " WHERE id = %(id)s",
        {"t": NOW - MINUTE, "id": queued.id},
    )

    report = await deliver_effects(await make_runtime(db, clock, fresh_db_url), clock)

    assert report.dead == 1 and report.delivered == 0
    [row] = await _effects(db, "queue")
    assert row["dead_reason"] == "expired" and row["attempts"] == 0
    assert "never attempted" in row["last_error"]
    assert await f.queue_messages(db, RSS_INVALIDATION) == []
