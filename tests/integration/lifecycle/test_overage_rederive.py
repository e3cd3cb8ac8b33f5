"""Stage 4 (suspended): the sanction set is re-derived from live state every run, and both
caches are told what changed — ``podcast.restored`` for the feeds no longer sanctioned,
``podcast.suspended`` for the newly sanctioned ones, nothing for those that stay."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.overage import run_overage_escalation
from tests import factories as f
from tests.conftest import NOW
from tests.integration.lifecycle.test_overage import (
    _account,
    _clock_columns,
    _stamps,
    _suspend_now,
    runtime_with,
)
from tests.support.servers import RecordingServer

DAY = timedelta(days=1)


async def _messages(db: Database, after: int = 0) -> list[dict[str, Any]]:
    return (await f.queue_messages(db, PUBLIC_API_INVALIDATION))[after:]


def _by_type(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in messages:
        out.setdefault(m["body"]["type"], []).append(m["body"]["podcast_id"])
    return {k: sorted(v) for k, v in out.items()}


async def _cap(db: Database, account: str, podcasts: int) -> None:
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'podcasts_per_account', %(n)s)"
        " ON CONFLICT (billing_account_id, resource)"
        " DO UPDATE SET limit_value = EXCLUDED.limit_value",
        {"a": account, "n": podcasts},
    )


async def test_a_shrinking_sanction_set_restores_the_unstamped_and_suspends_only_the_new(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    account, ids = await _account(db, podcasts=4)  # cap 1: three over, a count-only overage
    _p0, p1, p2, p3 = ids
    slugs = {
        r["id"]: r["slug"] for r in await db.fetch("SELECT id::text, slug FROM public.podcasts")
    }

    await _suspend_now(runtime, db, account, clock)
    assert await _stamps(db, ids) == [None, NOW, NOW, NOW]
    assert (await _clock_columns(db, account))[2] == 4  # suspended
    first = await _messages(db)
    assert _by_type(first) == {"podcast.suspended": sorted([p1, p2, p3])}

    # support raises the cap to 2: still over (4 > 2), but p1 is no longer sanctioned
    await _cap(db, account, 2)
    clock.set(NOW + DAY)
    feed_server.reset()
    await run_overage_escalation(runtime, clock)
    assert await _stamps(db, ids) == [None, None, NOW, NOW]
    assert (await _clock_columns(db, account))[2] == 4  # still suspended
    second = await _messages(db, after=len(first))
    assert _by_type(second) == {"podcast.restored": [p1]}
    [restored] = second
    body = dict(restored["body"])
    effect_id = body.pop("effect_id")
    assert isinstance(effect_id, int) and not isinstance(effect_id, bool)
    assert body == {
        "type": "podcast.restored",
        "podcast_id": p1,
        "podcast_slug": slugs[p1],
    }
    assert [c.json() for c in feed_server.requests] == [{"id": p1}]  # the feed cache too

    # a new, newer podcast and a cap of 3: 5 occupy, so p3 stays, p2 goes free, p4 is stamped
    p4 = await f.podcast(db, billing_account_id=account, created_at=NOW + DAY)
    await _cap(db, account, 3)
    clock.set(NOW + 2 * DAY)
    feed_server.reset()
    report = await run_overage_escalation(runtime, clock)
    assert await _stamps(db, [*ids, p4]) == [None, None, None, NOW, NOW + 2 * DAY]
    third = await _messages(db, after=len(first) + len(second))
    assert _by_type(third) == {"podcast.restored": [p2], "podcast.suspended": [p4]}
    assert all(isinstance(m["body"]["effect_id"], int) for m in third)
    assert len({m["body"]["effect_id"] for m in [*first, *second, *third]}) == 6
    assert sorted(c.json()["id"] for c in feed_server.requests) == sorted([p2, p4])
    assert report.suspended_podcasts == 1 and report.suspended_accounts == 0

    # nothing changed: nothing is sent
    clock.set(NOW + 3 * DAY)
    feed_server.reset()
    await run_overage_escalation(runtime, clock)
    assert await _messages(db, after=len(first) + len(second) + len(third)) == []
    assert feed_server.requests == []


async def test_the_owner_leaving_a_sanctioned_feed_restores_none_but_frees_the_next(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    account, ids = await _account(db, podcasts=3)  # cap 1
    p0, p1, _p2 = ids
    await _suspend_now(runtime, db, account, clock)
    assert await _stamps(db, ids) == [None, NOW, NOW]
    before = len(await _messages(db))

    # the owner schedules the oldest (serving) podcast for deletion: 2 occupy, cap 1, still
    # over; p1 becomes the one kept serving and is un-stamped
    await db.execute(
        "UPDATE public.podcasts SET status = 'pending_deletion',"
        " deletion_scheduled_at = %(d)s WHERE id = %(p)s",
        {"d": NOW + 60 * DAY, "p": p0},
    )
    clock.set(NOW + DAY)
    await run_overage_escalation(runtime, clock)
    assert await _stamps(db, ids) == [None, None, NOW]
    assert _by_type(await _messages(db, after=before)) == {"podcast.restored": [p1]}
