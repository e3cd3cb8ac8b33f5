"""The overage escalation against real PostgreSQL, a loopback Resend and a loopback feed worker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.mail import ResendMailer
from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.overage import (
    idempotency_key,
    reconcile_account_overage,
    run_overage_escalation,
)
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.support.servers import RecordingServer

DAY = timedelta(days=1)
GB = 1_000_000_000


async def runtime_with(
    db: Database,
    clock: FrozenClock,
    url: str,
    http: httpx.AsyncClient,
    resend: RecordingServer,
    feed: RecordingServer,
    *,
    api_key: str | None = "re_test_key",
) -> Runtime:
    return await make_runtime(
        db,
        clock,
        url,
        env={"PUBLIC_APP_URL": "https://app.example"},
        mail=ResendMailer(
            http, api_base=resend.url, api_key=api_key, from_email="billing@podcasts.example"
        ),
        feedcache=HttpFeedCache(http, feed.url, "feed-secret"),
    )


async def _limits(db: Database) -> None:
    await db.execute(
        "INSERT INTO public.plan_limits VALUES ('starter', 'podcasts_per_account', 1),"
        " ('starter', 'storage_gb_per_account', 1) ON CONFLICT DO NOTHING"
    )


async def _account(
    db: Database,
    *,
    podcasts: int = 2,
    email: str = "owner@example.test",
    created: datetime = NOW - 100 * DAY,
) -> tuple[str, list[str]]:
    await _limits(db)
    owner = await f.user(db, email=email)
    account = await f.account(db, plan="starter", owner_user_id=owner)
    await db.execute(
        "INSERT INTO public.user_profiles (id, email, billing_account_id)"
        " VALUES (%(u)s, %(e)s, %(a)s)",
        {"u": owner, "e": email, "a": account},
    )
    ids = [
        await f.podcast(db, billing_account_id=account, created_at=created + n * DAY)
        for n in range(podcasts)
    ]
    return account, ids


async def _clock_columns(db: Database, account: str) -> tuple[Any, ...]:
    row = await db.fetch_one(
        "SELECT content_overage_since, content_overage_deadline, content_overage_nag_stage,"
        " content_overage_last_nag_at FROM public.billing_accounts WHERE id = %(a)s",
        {"a": account},
    )
    assert row is not None
    return tuple(row.values())


async def _stamps(db: Database, ids: list[str]) -> list[Any]:
    rows = await db.fetch(
        "SELECT id::text, overage_suspended_at FROM public.podcasts"
        " WHERE id = ANY(%(ids)s::uuid[])",
        {"ids": ids},
    )
    by_id = {r["id"]: r["overage_suspended_at"] for r in rows}
    return [by_id.get(i) for i in ids]


def _sent(resend: RecordingServer) -> list[tuple[str, str, str]]:
    return [
        (r.json()["to"][0], r.json()["subject"], r.headers["Idempotency-Key"])
        for r in resend.requests
    ]


async def _counts(db: Database) -> tuple[int, ...]:
    row = await db.fetch_one(
        "SELECT (SELECT count(*) FROM public.podcasts) AS p,"
        " (SELECT count(*) FROM public.episodes) AS e,"
        " (SELECT count(*) FROM public.billing_accounts) AS b"
    )
    assert row is not None
    return tuple(row.values())


async def test_the_30_day_walk(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, (oldest, newest) = await _account(db)
    before = await _counts(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    t0_key = lambda stage: idempotency_key(account, NOW, stage)  # noqa: E731

    async def day(n: float) -> Any:
        clock.set(NOW + timedelta(days=n))
        resend_server.reset()
        feed_server.reset()
        return await run_overage_escalation(runtime, clock)

    report = await day(0)
    assert report.armed == 1 and report.emails_sent == 1
    assert _sent(resend_server) == [
        ("owner@example.test", "Your account is over its plan limits — you have 30 days", t0_key(0))
    ]
    assert await _clock_columns(db, account) == (NOW, NOW + 30 * DAY, 0, NOW)
    body = resend_server.requests[0].json()
    assert "2 podcasts on a plan that includes 1 (1 over)" in body["text"]
    assert "https://app.example/settings/billing" in body["html"]
    assert resend_server.requests[0].headers["Authorization"] == "Bearer re_test_key"

    for n, stage in ((7, 1), (21, 2), (27, 3)):
        await day(n)
        assert [k for *_, k in _sent(resend_server)] == [t0_key(stage)], n
        assert await _clock_columns(db, account) == (NOW, NOW + 30 * DAY, stage, NOW + n * DAY)
        assert await _stamps(db, [oldest, newest]) == [None, None]

    report = await day(29)
    assert resend_server.requests == [] and report.emails_sent == 0
    assert await _stamps(db, [oldest, newest]) == [None, None]

    report = await day(30)  # the final warning aged its 3 days: suspend the excess
    assert report.suspended_accounts == 1 and report.suspended_podcasts == 1
    assert await _stamps(db, [oldest, newest]) == [None, NOW + 30 * DAY]  # newest goes
    assert [k for *_, k in _sent(resend_server)] == [t0_key(4)]
    assert (await _clock_columns(db, account))[2] == 4
    assert [c.json() for c in feed_server.requests] == [{"id": newest}]
    assert feed_server.requests[0].query == {"wait": "1"}
    queued = await f.queue_messages(db, PUBLIC_API_INVALIDATION)
    assert [m["body"]["type"] for m in queued] == ["podcast.suspended"]

    report = await day(30.5)  # stage 4, nothing changed: nothing sent, nothing stamped
    assert resend_server.requests == [] and feed_server.requests == []

    # the owner schedules the newer podcast for deletion: back under the cap
    await db.execute(
        "UPDATE public.podcasts SET status = 'pending_deletion',"
        " deletion_scheduled_at = %(d)s WHERE id = %(p)s",
        {"d": NOW + 60 * DAY, "p": newest},
    )
    report = await day(31)
    assert report.restored_accounts == 1 and report.restored_podcasts == 1
    assert await _clock_columns(db, account) == (None, None, None, None)
    assert await _stamps(db, [oldest, newest]) == [None, None]
    assert [k for *_, k in _sent(resend_server)] == [t0_key("restored")]
    queued = await f.queue_messages(db, PUBLIC_API_INVALIDATION)
    assert [m["body"]["type"] for m in queued] == ["podcast.suspended", "podcast.restored"]
    assert await _counts(db) == before  # nothing was ever deleted


async def test_a_gap_collapses_into_one_final_warning_and_never_suspends_early(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    account, ids = await _account(db)
    clock = FrozenClock(NOW + DAY)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    await run_overage_escalation(runtime, clock)  # day 1: armed, stage 0
    since = NOW + DAY
    resend_server.reset()
    clock.set(NOW + 40 * DAY)  # the cron was down for 39 days
    report = await run_overage_escalation(runtime, clock)
    assert [k for *_, k in _sent(resend_server)] == [idempotency_key(account, since, 3)]
    assert report.suspended_accounts == 0 and await _stamps(db, ids) == [None, None]
    clock.set(NOW + 42 * DAY)
    assert (await run_overage_escalation(runtime, clock)).suspended_accounts == 0
    clock.set(NOW + 43 * DAY)
    assert (await run_overage_escalation(runtime, clock)).suspended_accounts == 1


@pytest.mark.parametrize(("status", "claimed"), [(429, False), (500, False), (422, True)])
async def test_send_outcomes_decide_the_claim(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
    status: int,
    claimed: bool,
) -> None:
    account, _ = await _account(db)
    resend_server.status = status
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    report = await run_overage_escalation(runtime, clock)
    stage = (await _clock_columns(db, account))[2]
    assert stage == (0 if claimed else -1)
    assert report.errors[0]["event"] == "overage_email_failed"
    assert report.errors[0]["transient"] is (not claimed)
    if not claimed:  # retried next run, with the same key
        resend_server.reset()
        clock.set(NOW + timedelta(hours=1))
        await run_overage_escalation(runtime, clock)
        assert [k for *_, k in _sent(resend_server)] == [idempotency_key(account, NOW, 0)]
        assert (await _clock_columns(db, account))[2] == 0


async def test_unconfigured_resend_skips_the_mail_and_the_machine_advances(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    from structlog.testing import capture_logs

    account, _ = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(
        db, clock, fresh_db_url, http, resend_server, feed_server, api_key=None
    )
    with capture_logs() as logs:
        await run_overage_escalation(runtime, clock)
    assert resend_server.requests == []
    assert any(e["event"] == "overage_email_skipped" for e in logs)
    assert (await _clock_columns(db, account))[2] == 0


async def test_no_owner_email_advances_best_effort(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    from structlog.testing import capture_logs

    await _limits(db)
    account = await f.account(db, plan="starter")  # no owner at all
    for _ in range(2):
        await f.podcast(db, billing_account_id=account)
    clock = FrozenClock(NOW)
    with capture_logs() as logs:
        await run_overage_escalation(
            await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server), clock
        )
    assert any(e["event"] == "overage_email_no_owner" for e in logs)
    assert (await _clock_columns(db, account))[2] == 0


async def test_the_sweep_and_the_webhook_racing_claim_every_stage_once(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    accounts = [(await _account(db, email=f"o{n}@example.test"))[0] for n in range(200)]
    clock = FrozenClock(NOW)
    other_db = await Database.open(fresh_db_url)
    try:
        sweep_rt = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
        hook_rt = await runtime_with(
            other_db, clock, fresh_db_url, http, resend_server, feed_server
        )

        async def webhook() -> list[Any]:
            return [await reconcile_account_overage(hook_rt, clock, a) for a in accounts]

        sweep, hooks = await asyncio.gather(run_overage_escalation(sweep_rt, clock), webhook())
    finally:
        await other_db.close()
    claims = Counter((c.account_id, c.stage) for r in [sweep, *hooks] for c in r.claims)
    assert set(claims) == {(a, 0) for a in accounts} and set(claims.values()) == {1}
    armed = sweep.armed + sum(h.armed for h in hooks)
    assert armed == 200  # first detection wins, once per account
    keys = Counter(k for *_, k in _sent(resend_server))
    assert set(keys) == {idempotency_key(a, NOW, 0) for a in accounts}  # duplicates share keys

    # resolved, then reopened the same day: a fresh stage 0 under a new key
    account = accounts[0]
    podcasts = await db.fetch(
        "SELECT id FROM public.podcasts WHERE billing_account_id = %(a)s ORDER BY created_at",
        {"a": account},
    )
    await db.execute(
        "UPDATE public.podcasts SET status = 'pending_deletion' WHERE id = %(p)s",
        {"p": podcasts[1]["id"]},
    )
    clock.set(NOW + timedelta(hours=2))
    resend_server.reset()
    await reconcile_account_overage(sweep_rt, clock, account)
    await db.execute(
        "UPDATE public.podcasts SET status = 'active' WHERE id = %(p)s", {"p": podcasts[1]["id"]}
    )
    clock.set(NOW + timedelta(hours=3))
    await reconcile_account_overage(sweep_rt, clock, account)
    keys_now = [k for *_, k in _sent(resend_server)]
    assert keys_now == [
        idempotency_key(account, NOW, "restored"),
        idempotency_key(account, NOW + timedelta(hours=3), 0),
    ]


async def _suspend_now(runtime: Runtime, db: Database, account: str, clock: FrozenClock) -> None:
    """Put an account at the end of its clock: armed 31 days ago, final warning 4 days ago."""
    await db.execute(
        "UPDATE public.billing_accounts SET content_overage_since = %(s)s,"
        " content_overage_deadline = %(d)s, content_overage_nag_stage = 3,"
        " content_overage_last_nag_at = %(l)s WHERE id = %(a)s",
        {
            "s": clock.now() - 31 * DAY,
            "d": clock.now() - DAY,
            "l": clock.now() - 4 * DAY,
            "a": account,
        },
    )
    await run_overage_escalation(runtime, clock)


async def test_sanction_sets_storage_count_tiebreak_and_pending_deletion(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    same = NOW - 50 * DAY
    # count overage only: 3 podcasts created at the same instant, cap 1 → keep the lowest id
    count_acct, count_ids = await _account(db, podcasts=0)
    for _ in range(3):
        count_ids.append(await f.podcast(db, billing_account_id=count_acct, created_at=same))
    leaving = await f.podcast(
        db, billing_account_id=count_acct, status="pending_deletion", created_at=same + DAY
    )
    await _suspend_now(runtime, db, count_acct, clock)
    keep = min(count_ids)
    stamps = dict(zip(count_ids, await _stamps(db, count_ids), strict=True))
    assert stamps[keep] is None and all(stamps[i] == NOW for i in count_ids if i != keep)
    assert await _stamps(db, [leaving]) == [None]  # pending_deletion is never selected

    # storage overage: every occupying feed, even within the podcast count
    storage_acct, (only,) = await _account(db, podcasts=1)
    # the audio was stored on a bigger plan; the account then downgraded
    await db.execute(
        "UPDATE public.billing_accounts SET plan = 'pro' WHERE id = %(a)s", {"a": storage_acct}
    )
    await f.episode(  # the escalation counts the enclosure only: 1.2 GB > 1 GB
        db, only, audio_file_size_bytes=int(1.2 * GB), original_audio_file_size_bytes=int(0.3 * GB)
    )
    await db.execute(
        "UPDATE public.billing_accounts SET plan = 'starter' WHERE id = %(a)s", {"a": storage_acct}
    )
    await _suspend_now(runtime, db, storage_acct, clock)
    assert await _stamps(db, [only]) == [NOW]


async def test_restore_leaves_a_user_disabled_podcast_disabled_and_honours_an_override(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    account, (first, second) = await _account(db)
    await db.execute("UPDATE public.podcasts SET is_active = false WHERE id = %(p)s", {"p": second})
    await _suspend_now(runtime, db, account, clock)
    assert await _stamps(db, [first, second]) == [None, NOW]
    # support raises the cap: the next run restores
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource,"
        " limit_value) VALUES (%(a)s, 'podcasts_per_account', 5)",
        {"a": account},
    )
    clock.set(NOW + DAY)
    report = await run_overage_escalation(runtime, clock)
    assert report.restored_accounts == 1
    rows = await db.fetch(
        "SELECT id::text, is_active, status, overage_suspended_at"
        " FROM public.podcasts WHERE id = ANY(%(i)s::uuid[]) ORDER BY created_at",
        {"i": [first, second]},
    )
    assert [(r["is_active"], r["status"], r["overage_suspended_at"]) for r in rows] == [
        (True, "active", None),
        (False, "active", None),
    ]


async def test_an_account_that_throws_never_stops_the_sweep(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    broken, _ = await _account(db, email="a@example.test")
    fine, _ = await _account(db, email="b@example.test")
    await db.execute(
        "CREATE FUNCTION public.explode() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.id = '" + broken + "'::uuid THEN RAISE EXCEPTION 'boom'; END IF;"
        " RETURN NEW; END $$"
    )
    await db.execute(
        "CREATE TRIGGER explode BEFORE UPDATE ON public.billing_accounts"
        " FOR EACH ROW EXECUTE FUNCTION public.explode()"
    )
    clock = FrozenClock(NOW)
    report = await run_overage_escalation(
        await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server), clock
    )
    assert [e["event"] for e in report.errors] == ["overage_escalation_account_failed"]
    assert report.errors[0]["account_id"] == broken
    assert (await _clock_columns(db, fine))[2] == 0


async def test_a_stale_scan_never_suspends_an_account_the_webhook_just_restored(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    from nightcrew.lifecycle import overage

    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    account, (first, second) = await _account(db)
    await db.execute(
        "UPDATE public.billing_accounts SET content_overage_since = %(s)s,"
        " content_overage_deadline = %(d)s, content_overage_nag_stage = 3,"
        " content_overage_last_nag_at = %(l)s WHERE id = %(a)s",
        {"s": NOW - 31 * DAY, "d": NOW - DAY, "l": NOW - 4 * DAY, "a": account},
    )
    [stale] = await overage.scan(runtime)
    # meanwhile the owner upgrades and the webhook restores the account
    await db.execute(
        "INSERT INTO public.cap_overrides (billing_account_id, resource,"
        " limit_value) VALUES (%(a)s, 'podcasts_per_account', 9)",
        {"a": account},
    )
    await reconcile_account_overage(runtime, clock, account)
    resend_server.reset()
    from nightcrew.lifecycle.overage_report import Tally

    tally = Tally()
    await overage._process(runtime, clock, stale, tally)  # the sweep, on its stale row
    assert await _stamps(db, [first, second]) == [None, None]
    assert tally.report(scanned=1).suspended_accounts == 0 and resend_server.requests == []
    assert await _clock_columns(db, account) == (None, None, None, None)


async def test_the_scan_and_the_single_account_measurement_agree(
    db: Database, fresh_db_url: str
) -> None:
    from nightcrew.lifecycle import overage

    over, _ = await _account(db, podcasts=3)
    armed_under, _ = await _account(db, podcasts=1)
    await db.execute(
        "UPDATE public.billing_accounts SET content_overage_since = %(n)s,"
        " content_overage_nag_stage = 0 WHERE id = %(a)s",
        {"n": NOW, "a": armed_under},
    )
    stamped, (p,) = await _account(db, podcasts=1)
    await db.execute(
        "UPDATE public.podcasts SET overage_suspended_at = %(n)s WHERE id = %(p)s",
        {"n": NOW, "p": p},
    )
    quiet, _ = await _account(db, podcasts=1)
    armed_empty, _ = await _account(db, podcasts=0)  # armed, every podcast since deleted
    await db.execute(
        "UPDATE public.billing_accounts SET content_overage_since = %(n)s,"
        " content_overage_nag_stage = 1 WHERE id = %(a)s",
        {"n": NOW, "a": armed_empty},
    )
    runtime = await make_runtime(db, FrozenClock(NOW), fresh_db_url)
    rows = {str(m.id): m for m in await overage.scan(runtime)}
    # only accounts that can need work
    assert set(rows) == {over, armed_under, stamped, armed_empty}
    for slices in (1, 3, 7):  # the slices share out the accounts: each exactly once
        parts = [
            await db.fetch(overage.SQL["scan"], {"slices": slices, "slice": n})
            for n in range(slices)
        ]
        ids = [str(r["id"]) for part in parts for r in part]
        assert sorted(ids) == sorted(rows), slices
    for account in (over, armed_under, stamped, quiet, armed_empty):
        single = await db.fetch_one(overage.SQL["measure_account"], {"account_id": account})
        assert single is not None
        if account in rows:  # every column, the record's too
            assert {k: str(v) for k, v in single.items()} == {
                k: str(v) for k, v in dataclasses.asdict(rows[account]).items()
            }


async def test_a_reconciler_whose_backend_is_terminated_fails_alone_and_the_escalation_runs(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
    tmp_path: Path,
) -> None:
    """Spec 000: "a reconcile failure cannot block the rest of daily maintenance". The daily
    lane runs the real reconciler; while its listing is in flight, an admin connection
    terminates its PostgreSQL backend (pg_terminate_backend, found by its application_name, as
    an operator or a pooler's lifetime would): scheduled_reconcile_failed is logged, and the
    overage escalation still arms the over-cap account in the same run, on a fresh
    connection."""
    from structlog.testing import capture_logs

    from nightcrew.lifecycle.lanes import run_lane
    from nightcrew.lifecycle.reconcile.engine import SESSION_NAME

    account, _ = await _account(db)
    clock = FrozenClock(NOW)
    store = _HeldListing(open_store(f"file://{tmp_path}"))
    runtime = await make_runtime(
        db,
        clock,
        fresh_db_url,
        env={"PUBLIC_APP_URL": "https://app.example", "R2_PUBLIC_URL": "https://media.example"},
        mail=ResendMailer(
            http, api_base=resend_server.url, api_key="re_test_key", from_email="b@podcasts.example"
        ),
        feedcache=HttpFeedCache(http, feed_server.url, "feed-secret"),
        store=store,
    )

    async def terminate_the_reconciler() -> list[dict[str, Any]]:
        await asyncio.wait_for(store.listing.wait(), 30)
        try:
            async with await psycopg.AsyncConnection.connect(fresh_db_url) as admin:
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity"
                    " WHERE application_name = %s AND datname = current_database()",
                    (SESSION_NAME,),
                )
                return [dict(zip(["terminated"], r, strict=True)) for r in await cur.fetchall()]
        finally:
            store.proceed.set()

    with capture_logs() as logs:
        report, terminated = await asyncio.gather(
            run_lane(runtime, clock, "daily"), terminate_the_reconciler()
        )
    assert terminated == [{"terminated": True}]
    assert report is not None
    outcomes = {j.name: j for j in report.jobs}
    assert outcomes["runReconcile"].status == "failed"
    [failed] = [e for e in logs if e["event"] == "scheduled_reconcile_failed"]
    assert "terminat" in failed["error"] or "lost PostgreSQL" in failed["error"], failed
    assert outcomes["runOverageEscalation"].status == "ok"
    assert outcomes["runOverageEscalation"].count("armed") == 1, outcomes[
        "runOverageEscalation"
    ].counts
    armed = await db.fetch_one(
        "SELECT content_overage_since FROM public.billing_accounts WHERE id = %(a)s",
        {"a": account},
    )
    assert armed is not None and armed["content_overage_since"] is not None
    assert [e["event"] for e in logs][-1] == "lifecycle_cron_completed"


class _HeldListing:
    """A real store whose listing of podcasts/ tells the test it started, then waits for it."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.listing = asyncio.Event()
        self.proceed = asyncio.Event()

    async def list_children(self, prefix: str) -> Any:
        self.listing.set()
        await self.proceed.wait()
        return await self._inner.list_children(prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_warning_the_minute_lane_delivers_is_claimed_then_and_counted_by_it(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend_server: RecordingServer,
    feed_server: RecordingServer,
) -> None:
    """Resend answers 500 to the stage-0 email: the daily run leaves the stage unclaimed. The
    minute lane's drain delivers it a few minutes later and claims stage 0 then — at the
    delivery's time, counted as emails_sent in that run's report — and the next daily run
    sends no second stage-0 email."""
    from nightcrew.lifecycle.lanes import MINUTE, run_jobs

    account, _ = await _account(db)
    clock = FrozenClock(NOW)
    runtime = await runtime_with(db, clock, fresh_db_url, http, resend_server, feed_server)
    resend_server.status = 500
    daily = await run_overage_escalation(runtime, clock)
    assert daily.armed == 1 and daily.emails_sent == 0
    assert (await _clock_columns(db, account))[2:] == (-1, None)  # stage, last nag: unclaimed

    resend_server.reset()  # Resend answers again
    clock.set(NOW + timedelta(minutes=5))
    minute = await run_jobs(runtime, clock, MINUTE)
    assert minute.total("emails_sent") == 1
    assert [s[1] for s in _sent(resend_server)] == [
        "Your account is over its plan limits — you have 30 days"
    ]
    stage, last_nag = (await _clock_columns(db, account))[2:]
    assert (stage, last_nag) == (0, NOW + timedelta(minutes=5))

    resend_server.reset()
    clock.set(NOW + DAY)
    again = await run_overage_escalation(runtime, clock)
    assert again.emails_sent == 0 and _sent(resend_server) == []
    assert (await _clock_columns(db, account))[2:] == (0, NOW + timedelta(minutes=5))
