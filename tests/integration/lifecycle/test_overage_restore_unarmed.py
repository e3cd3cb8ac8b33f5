"""The restore of an account whose feeds are stamped but whose clock is not armed.

Spec 000, the escalation's leg 4: "Armed or stamped, now under both caps → Disarm (clear all
four clock columns) + clear every overage_suspended_at stamp, invalidate both caches, send the
restored email." Stamped but unarmed (the clock cleared elsewhere while the feeds stayed
stamped) is a restore like any other: the owner hears the feeds are back. With no clock, the
email's `{since}` is the newest stamp's time. Real PostgreSQL, loopback Resend and feed worker.
"""

from __future__ import annotations

from datetime import timedelta

import httpx

from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.lifecycle.overage import run_overage_escalation
from nightcrew.lifecycle.overage_mail import STAGE_SUBJECTS
from nightcrew.lifecycle.overage_owed import idempotency_key
from tests import factories as f
from tests.conftest import NOW
from tests.integration.lifecycle.test_overage import (
    _account,
    _clock_columns,
    _sent,
    _stamps,
    runtime_with,
)
from tests.support.servers import RecordingServer

DAY = timedelta(days=1)


async def _stamp(db: Database, podcast: str, at: object) -> None:
    await db.execute(
        "UPDATE public.podcasts SET overage_suspended_at = %(t)s WHERE id = %(p)s",
        {"t": at, "p": podcast},
    )


async def test_stamped_but_unarmed_under_both_caps_restores_and_sends_the_restored_email(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    # two podcasts on a plan of one: under the caps once support lifts the count to two
    account, (first, second) = await _account(db, podcasts=2)
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'podcasts_per_account', 2)",
        {"a": account},
    )
    older, newer = NOW - 9 * DAY, NOW - 2 * DAY  # stamped at two instants
    await _stamp(db, first, older)
    await _stamp(db, second, newer)
    assert await _clock_columns(db, account) == (None, None, None, None)  # not armed
    # a final warning of the overage whose clock is gone, still being retried
    stale_nag = await outbox.record(
        db,
        key=idempotency_key(account, NOW - 40 * DAY, 3),
        payload=outbox.MailPayload(to="owner@example.test", subject="s", text="t", html="h"),
        now=NOW - DAY,
    )
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)

    report = await run_overage_escalation(runtime, clock)

    assert report.restored_accounts == 1 and report.restored_podcasts == 2
    assert await _stamps(db, [first, second]) == [None, None]
    assert await _clock_columns(db, account) == (None, None, None, None)
    # the restored email, keyed by the newest stamp: stable, and this suspension's own
    key = idempotency_key(account, newer, "restored")
    assert _sent(resend_server) == [("owner@example.test", STAGE_SUBJECTS["restored"], key)]
    assert report.emails_sent == 1
    body = resend_server.requests[0].json()
    assert "being served again" in body["text"]
    # both caches invalidated
    assert sorted(c.json()["id"] for c in feed_server.requests) == sorted([first, second])
    queued = await f.queue_messages(db, PUBLIC_API_INVALIDATION)
    assert sorted(m["body"]["type"] for m in queued) == 2 * ["podcast.restored"]
    nag = await outbox.get(db, stale_nag.id)
    assert nag is not None and nag.dead_reason == "superseded"  # never after "you're back"

    # the next run owes nothing more: no email twice
    resend_server.reset()
    clock.advance(DAY)
    again = await run_overage_escalation(runtime, clock)
    assert again.restored_accounts == 0 and resend_server.requests == []


async def test_a_later_suspension_of_the_same_account_gets_its_own_restored_email(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, (only,) = await _account(db, podcasts=1)  # under both caps
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    keys = []
    for stamped_at in (NOW - 5 * DAY, NOW + 3 * DAY):
        clock.set(max(stamped_at, NOW) + DAY)
        await _stamp(db, only, stamped_at)
        resend_server.reset()
        report = await run_overage_escalation(runtime, clock)
        assert report.restored_accounts == 1
        keys.append(idempotency_key(account, stamped_at, "restored"))
        assert [k for *_, k in _sent(resend_server)] == [keys[-1]]
    assert keys[0] != keys[1]
