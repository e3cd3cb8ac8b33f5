"""Effects meet the overage machine's claims: what a long outage, a restore and Resend's own
idempotency answers must never do (each found in a review of the outbox's first cut)."""

from __future__ import annotations

from datetime import timedelta

import httpx

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects.deliver import deliver_effects
from nightcrew.lifecycle.overage import (
    idempotency_key,
    reconcile_account_overage,
    run_overage_escalation,
)
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.integration.effects.test_effects import _accept_queues, _refuse_queue
from tests.integration.lifecycle.test_overage import (
    _account,
    _clock_columns,
    _stamps,
    _suspend_now,
    runtime_with,
)
from tests.support.servers import RecordingServer

DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)


def _keys(resend: RecordingServer) -> list[str]:
    return [r.headers["Idempotency-Key"] for r in resend.requests]


async def test_a_final_warning_that_expired_unsent_is_sent_before_any_suspension(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, (oldest, newest) = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    for day in (0, 7, 21):
        clock.set(NOW + day * DAY)
        await run_overage_escalation(runtime, clock)
    final = idempotency_key(account, NOW, 3)

    resend_server.status = 503  # Resend is down for 21 hours from day 27
    clock.set(NOW + 27 * DAY)
    await run_overage_escalation(runtime, clock)
    for minutes in range(1, 21 * 60 + 2, 30):
        clock.set(NOW + 27 * DAY + minutes * MINUTE)
        await deliver_effects(runtime, clock)
    row = await db.fetch_one(
        "SELECT delivered_at, dead_reason FROM nightcrew.effects WHERE key = %(k)s", {"k": final}
    )
    assert row == {"delivered_at": None, "dead_reason": "expired"}
    assert (await _clock_columns(db, account))[2] == 2  # stage 3 not claimed

    resend_server.reset()  # Resend recovers; the next daily run sends it, then claims it
    clock.set(NOW + 28 * DAY)
    report = await run_overage_escalation(runtime, clock)
    assert _keys(resend_server) == [final] and report.emails_sent == 1
    assert (await _clock_columns(db, account))[2:] == (3, NOW + 28 * DAY)

    clock.set(NOW + 30 * DAY)  # only two days since the final warning arrived: no suspension
    await run_overage_escalation(runtime, clock)
    assert await _stamps(db, [oldest, newest]) == [None, None]
    clock.set(NOW + 31 * DAY)
    await run_overage_escalation(runtime, clock)
    assert await _stamps(db, [oldest, newest]) == [None, NOW + 31 * DAY]


async def test_a_nag_still_being_retried_never_arrives_after_the_restored_email(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, (_, newest) = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    await run_overage_escalation(runtime, clock)
    resend_server.status = 503
    clock.set(NOW + 7 * DAY)
    await run_overage_escalation(runtime, clock)  # the stage-1 reminder fails: retried
    resend_server.reset()
    await db.execute(  # the owner schedules the newer podcast for deletion: back under the cap
        "UPDATE public.podcasts SET status = 'pending_deletion', deletion_scheduled_at = %(d)s"
        " WHERE id = %(p)s",
        {"d": NOW + 60 * DAY, "p": newest},
    )
    clock.advance(timedelta(seconds=10))
    await reconcile_account_overage(runtime, clock, account)  # the webhook restores it
    clock.advance(MINUTE)
    await deliver_effects(runtime, clock)
    clock.advance(DAY)
    await deliver_effects(runtime, clock)
    assert _keys(resend_server) == [idempotency_key(account, NOW, "restored")]
    reminder = await db.fetch_one(
        "SELECT dead_reason, last_error FROM nightcrew.effects WHERE key = %(k)s",
        {"k": idempotency_key(account, NOW, 1)},
    )
    assert reminder is not None and reminder["dead_reason"] == "superseded"


async def test_a_suspended_message_still_retried_never_arrives_after_restored(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, (_, newest) = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    await _refuse_queue(db, PUBLIC_API_INVALIDATION)  # while the feed is suspended
    await _suspend_now(runtime, db, account, clock)
    assert await _stamps(db, [newest]) == [NOW]
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'podcasts_per_account', 5)",
        {"a": account},
    )
    await _accept_queues(db)
    clock.advance(MINUTE)  # restored before the suspended message was ever delivered
    await run_overage_escalation(runtime, clock)
    clock.advance(DAY)
    await deliver_effects(runtime, clock)
    messages = await f.queue_messages(db, "public-api-invalidation")
    assert [m["body"]["type"] for m in messages] == ["podcast.restored"]
    suspended = await db.fetch(
        "SELECT dead_reason FROM nightcrew.effects WHERE key LIKE 'public-api-invalidation:%'"
        " ORDER BY id"
    )
    assert [r["dead_reason"] for r in suspended] == ["superseded", None]


async def test_resend_409_for_a_key_still_in_progress_is_retried_not_given_up(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, _ = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    resend_server.status = 409  # the same key is still being processed at Resend
    await run_overage_escalation(runtime, clock)
    assert (await _clock_columns(db, account))[2] == -1  # not claimed
    resend_server.reset()
    clock.advance(MINUTE)
    drained = await deliver_effects(runtime, clock)
    assert drained.delivered == 1 and drained.dead == 0
    assert _keys(resend_server) == [idempotency_key(account, NOW, 0)]


async def test_a_feed_invalidation_owed_through_a_day_long_outage_is_still_delivered(
    db: Database, clock: FrozenClock, fresh_db_url: str, feed_server: RecordingServer
) -> None:
    podcast = await f.podcast(db)
    await db.execute(
        "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)"
        " VALUES (%(p)s, 'overage_suspension', %(t)s)",
        {"p": podcast, "t": NOW},
    )
    async with httpx.AsyncClient() as http:
        runtime = await make_runtime(
            db, clock, fresh_db_url, feedcache=HttpFeedCache(http, feed_server.url, "secret")
        )
        feed_server.status = 503
        for _ in range(3 * 24 * 2):  # down for three days, a drain every half hour
            await deliver_effects(runtime, clock)
            clock.advance(30 * MINUTE)
        feed_server.status = 200
        clock.advance(DAY)
        drained = await deliver_effects(runtime, clock)
    assert drained.delivered == 1
    row = await db.fetch_one("SELECT delivered_at FROM public.feed_invalidation_outbox")
    assert row == {"delivered_at": clock.now()}
