"""The effects outbox against real PostgreSQL and loopback stand-ins that fail on command.

Each of five ways an effect used to be lost happens for real here (a Resend, a Stripe, a feed
worker that answer 500 or 429 or hang, a PostgreSQL queue that refuses one queue); each test
shows the effect delivered after the stand-in recovers, by a minute-lane run, once, with the
same key.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs
from werkzeug import Request, Response

from nightcrew.adapters.billing import StripeBilling
from nightcrew.adapters.feedcache import HttpFeedCache
from nightcrew.adapters.mail import ResendMailer
from nightcrew.adapters.queues import PUBLIC_API_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.effects.deliver import deliver_effects
from nightcrew.lifecycle import billing_resume, feed_outbox
from nightcrew.lifecycle.lanes import run_lane
from nightcrew.lifecycle.overage import run_overage_escalation
from nightcrew.lifecycle.overage_owed import idempotency_key
from nightcrew.lifecycle.pauses import billing_resume_key, reactivate_expired_pauses
from nightcrew.runtime import Runtime
from tests import factories as f
from tests.acceptance.test_cli import _env, _nightcrew, run
from tests.conftest import NOW, make_runtime
from tests.integration.lifecycle.test_overage import _account, _stamps, _suspend_now
from tests.integration.lifecycle.test_pauses import _paused_podcast
from tests.support.servers import RecordingServer, stripe_responder

DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)
# Long enough for any loopback answer on a loaded 2-core box: a normal send must not time out
CLIENT_TIMEOUT = httpx.Timeout(1.0)
# A hang outlasts the client's timeout by a wide margin (a loaded CI box is slow, not that slow)
SERVER_HANG_SECONDS = 3.0
# The Stripe and feed-worker clients of the hang tests: they keep this timeout for the attempt
# after the hang too, so it is long enough for any loopback answer on a loaded machine.
HANG_CLIENT_TIMEOUT_SECONDS = 2.0
# A Hang holds its answer at most this long, so a test that fails early frees the shared server.
HANG_LIMIT_SECONDS = 30.0


class Hang:
    """A stand-in's responder that takes the request (the cache is purged, the resume applied)
    and holds its answer until the test has seen the client give up (``answer_late``): a hang
    past the timeout by construction, not by a race of sleeps."""

    def __init__(self, answer: Callable[[Request], Any]) -> None:
        self.answer = answer
        self.received = 0
        self._release = threading.Event()
        self._answered = threading.Event()

    def __call__(self, request: Request) -> Any:
        self.received += 1
        self._release.wait(HANG_LIMIT_SECONDS)
        try:
            return self.answer(request)
        finally:
            self._answered.set()

    def release(self) -> None:
        self._release.set()

    async def answer_late(self) -> None:
        """Answer now (the client timed out long ago) and wait until that is done: the loopback
        server serves one request at a time, so the next attempt waits for it."""
        self.release()
        if not await asyncio.to_thread(self._answered.wait, 60):
            pytest.fail("the hanging stand-in never answered")


class Resend:
    """A Resend stand-in with Resend's idempotency: a key seen before is answered from its
    record and not delivered again. ``mode``: ok, a status (500, 429, 422: answered at once,
    nothing accepted), hang (the email IS accepted, but the answer comes after the client's
    timeout), down (hang without accepting)."""

    def __init__(self, server: RecordingServer) -> None:
        self.server = server
        self._mode = "ok"
        # a held answer (hang, down) is let go as soon as the mode changes, so the loopback
        # server, one request at a time, is free for the next one at once
        self._let_go = threading.Event()
        self.delivered: Counter[str] = Counter()  # emails that reached an inbox, by key
        server.responder = self._respond

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode in ("hang", "down"):
            self._let_go.clear()  # before the mode: a request arriving now holds its answer
            self._mode = mode
        else:
            self._mode = mode
            self._let_go.set()

    @property
    def keys(self) -> list[str]:
        return [r.headers["Idempotency-Key"] for r in self.server.requests]

    def _respond(self, request: Request) -> Response | tuple[int, dict[str, Any]]:
        key = request.headers["Idempotency-Key"]
        if self.mode.isdigit():
            return int(self.mode), {"name": "error", "message": f"answering {self.mode}"}
        if self.mode == "down":
            self._let_go.wait(SERVER_HANG_SECONDS)
            return 503, {}
        if key not in self.delivered:
            self.delivered[key] += 1
        if self.mode == "hang":
            self._let_go.wait(SERVER_HANG_SECONDS)
        return 200, {"id": f"email-{key}"}


@pytest.fixture
def resend(resend_server: RecordingServer) -> Resend:
    return Resend(resend_server)


async def _runtime(
    db: Database,
    clock: FrozenClock,
    url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed: RecordingServer,
    *,
    mail_timeout: httpx.Timeout = CLIENT_TIMEOUT,
    **adapters: Any,
) -> Runtime:
    return await make_runtime(
        db,
        clock,
        url,
        mail=ResendMailer(
            http,
            api_base=resend.server.url,
            api_key="re_test",
            from_email="billing@podcasts.example",
            timeout=mail_timeout,
        ),
        feedcache=HttpFeedCache(http, feed.url, "feed-secret", wait_timeout=CLIENT_TIMEOUT),
        **adapters,
    )


async def _refuse_queue(db: Database, queue: str) -> None:
    """PostgreSQL itself refuses messages to one queue (a broken consumer's table, a full
    partition): the in-database producer's INSERT fails for real."""
    await db.execute(
        "CREATE FUNCTION nightcrew.refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.queue = TG_ARGV[0] THEN RAISE EXCEPTION 'queue % refused', NEW.queue;"
        " END IF; RETURN NEW; END $$"
    )
    await db.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON nightcrew.queue_messages FOR EACH ROW"
        f" EXECUTE FUNCTION nightcrew.refuse('{queue}')"
    )


async def _accept_queues(db: Database) -> None:
    await db.execute("DROP TRIGGER refuse ON nightcrew.queue_messages")


async def _effects(db: Database, kind: str) -> list[dict[str, Any]]:
    return await db.fetch(
        "SELECT * FROM nightcrew.effects WHERE kind = %(k)s ORDER BY id", {"k": kind}
    )


async def _minute(runtime: Runtime, clock: FrozenClock, advance: timedelta) -> dict[str, Any]:
    clock.advance(advance)
    report = await run_lane(runtime, clock, "minute")
    assert report is not None
    return report.to_json()["jobs"]["deliverEffects"]


# --- loss 1: the public-api invalidation of a suspended feed ----------------------------------
async def test_a_refused_public_api_invalidation_is_delivered_once_the_queue_recovers(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    account, (_, newest) = await _account(db)
    await _refuse_queue(db, PUBLIC_API_INVALIDATION)
    with capture_logs() as logs:
        await _suspend_now(runtime, db, account, clock)
    [failed] = [e for e in logs if e["event"] == "effect_delivery_failed"]
    assert failed["kind"] == "queue" and failed["key"].startswith(PUBLIC_API_INVALIDATION)
    assert "refused" in failed["error"]
    assert await _stamps(db, [newest]) == [NOW]
    assert await f.queue_messages(db, PUBLIC_API_INVALIDATION) == []

    # Before: the stamp had committed, so no later run ever sent it. Now the minute lane does.
    drained = await _minute(runtime, clock, MINUTE)
    assert drained["effects_delivered"] == 0  # still refused: retried, not lost
    await _accept_queues(db)
    drained = await _minute(runtime, clock, 5 * MINUTE)
    assert drained["effects_delivered"] == 1
    [message] = await f.queue_messages(db, PUBLIC_API_INVALIDATION)
    [effect] = [e for e in await _effects(db, "queue")]
    assert message["body"] == {
        "type": "podcast.suspended",
        "podcast_id": newest,
        "podcast_slug": message["body"]["podcast_slug"],
        "effect_id": effect["id"],
    }
    assert effect["attempts"] == 3 and effect["delivered_at"] == clock.now()

    await _minute(runtime, clock, DAY)  # and never again
    await run_overage_escalation(runtime, clock)
    assert len(await f.queue_messages(db, PUBLIC_API_INVALIDATION)) == 1


async def test_a_refused_restored_invalidation_is_delivered_once_the_queue_recovers(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    """The other direction: a restored feed the v1 API and the embed player would keep hiding."""
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    account, (_, newest) = await _account(db)
    await _suspend_now(runtime, db, account, clock)
    assert [m["body"]["type"] for m in await f.queue_messages(db, PUBLIC_API_INVALIDATION)] == [
        "podcast.suspended"
    ]

    await _refuse_queue(db, PUBLIC_API_INVALIDATION)
    await db.execute(  # support raises the cap: the next run restores
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'podcasts_per_account', 5)",
        {"a": account},
    )
    clock.advance(DAY)
    with capture_logs() as logs:
        report = await run_overage_escalation(runtime, clock)
    assert report.restored_accounts == 1
    assert await _stamps(db, [newest]) == [None]  # the restore committed
    # logged as it failed, as well as reported
    assert any(
        line["event"] == "overage_cache_invalidation_failed" and line["cache"] == "public-api"
        for line in logs
    ), logs
    [failed] = [
        e
        for e in report.errors
        if e["event"] == "overage_cache_invalidation_failed" and e["cache"] == "public-api"
    ]
    assert failed["retried"] is True and failed["podcast_id"] == newest
    assert len(await f.queue_messages(db, PUBLIC_API_INVALIDATION)) == 1  # only the suspension

    drained = await _minute(runtime, clock, MINUTE)
    assert drained["effects_delivered"] == 0  # still refused: retried, not lost
    await _accept_queues(db)
    # the third attempt is due 60 s (±20 %) after the second: a run two minutes on takes it
    drained = await _minute(runtime, clock, 2 * MINUTE)
    assert drained["effects_delivered"] == 1
    suspended, restored = await f.queue_messages(db, PUBLIC_API_INVALIDATION)
    assert suspended["body"]["type"] == "podcast.suspended"
    assert restored["body"] == {
        "type": "podcast.restored",
        "podcast_id": newest,
        "podcast_slug": suspended["body"]["podcast_slug"],
        "effect_id": failed["effect_id"],  # the effect the failed first attempt reported
    }
    effect = await outbox.get(db, failed["effect_id"])
    assert effect is not None and effect.key.startswith(
        f"{PUBLIC_API_INVALIDATION}:podcast.restored:{newest}:"
    )
    assert effect.attempts == 3 and effect.delivered_at == clock.now()

    await _minute(runtime, clock, DAY)  # and never again
    await run_overage_escalation(runtime, clock)
    assert len(await f.queue_messages(db, PUBLIC_API_INVALIDATION)) == 2


# --- loss 2: the "restored" email --------------------------------------------------------------
@pytest.mark.parametrize("failure", ["429", "500", "down"])
async def test_the_restored_email_survives_resend_failing_and_arrives_once(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
    failure: str,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    account, _ = await _account(db)
    await _suspend_now(runtime, db, account, clock)
    since = NOW - 31 * DAY
    key = idempotency_key(account, since, "restored")

    resend.mode = failure
    await db.execute(  # support raises the cap: the next run restores
        "INSERT INTO public.cap_overrides (billing_account_id, resource, limit_value)"
        " VALUES (%(a)s, 'podcasts_per_account', 5)",
        {"a": account},
    )
    clock.advance(DAY)
    report = await run_overage_escalation(runtime, clock)
    assert report.restored_accounts == 1 and report.emails_sent == 0
    [failed] = [e for e in report.errors if e["event"] == "overage_email_failed"]
    assert failed["transient"] is True
    assert key not in resend.delivered

    await _minute(runtime, clock, MINUTE)  # still failing
    resend.mode = "ok"
    drained = await _minute(runtime, clock, 5 * MINUTE)
    assert drained["effects_delivered"] == 1
    assert resend.delivered[key] == 1
    restored_keys = [k for k in resend.keys if k.endswith(":restored")]
    assert len(restored_keys) == 3 and set(restored_keys) == {key}  # one key, every attempt
    await _minute(runtime, clock, 30 * MINUTE)
    await run_overage_escalation(runtime, clock)
    assert len([k for k in resend.keys if k.endswith(":restored")]) == 3  # nothing more


# --- loss 3: the Stripe billing resume -----------------------------------------------------------
def _stripe_updates(stripe: RecordingServer) -> list[str]:
    return [
        r.headers.get("Idempotency-Key", "")
        for r in stripe.requests
        if r.method == "POST" and r.path == "/v1/subscriptions/sub_1"
    ]


@pytest.mark.parametrize("failure", ["500", "429", "hang"])
async def test_a_failed_billing_resume_is_retried_until_stripe_confirms_it(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    stripe_server: RecordingServer,
    failure: str,
) -> None:
    podcast, account = await _paused_podcast(db, expires=NOW - MINUTE)
    # hang: Stripe applies the resume, but answers after the client's timeout
    hang = Hang(stripe_responder({}))
    stripe_server.responder = (
        hang if failure == "hang" else stripe_responder({}, fail_status=int(failure))
    )
    billing = StripeBilling(
        "sk_test_123",
        api_base=stripe_server.url,
        timeout=HANG_CLIENT_TIMEOUT_SECONDS,
        max_network_retries=0,
    )
    runtime = await make_runtime(db, clock, fresh_db_url, billing=billing)
    try:
        report = await reactivate_expired_pauses(runtime, clock)
        assert report.counts()["billing_pending"] == 1
        row = await db.fetch_one(
            "SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": podcast}
        )
        assert row == {"status": "active"}  # never re-enters the scan: the effect is the record
        if failure == "hang":
            assert hang.received == 1  # Stripe did resume it: only the answer was lost
            await hang.answer_late()

        stripe_server.responder = stripe_responder({})  # Stripe recovers
        drained = await _minute(runtime, clock, MINUTE)  # the next minute run
        assert drained["effects_delivered"] == 1
    finally:
        hang.release()
        await billing.close()
    key = billing_resume_key(podcast, NOW)
    assert _stripe_updates(stripe_server) == [key, key]
    [effect] = await _effects(db, "billing_resume")
    assert effect["delivered_at"] == clock.now() and effect["payload"]["account_id"] == account
    await _minute(runtime, clock, DAY)
    assert len(_stripe_updates(stripe_server)) == 2


# --- loss 4: the feed-invalidation outbox without R2_PUBLIC_URL ---------------------------------
@pytest.mark.parametrize("failure", ["500", "429", "hang"])
async def test_the_feed_outbox_is_drained_by_the_minute_lane_without_r2_public_url(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    feed_server: RecordingServer,
    failure: str,
) -> None:
    podcast = await f.podcast(db)
    feedcache = HttpFeedCache(
        http,
        feed_server.url,
        "feed-secret",
        wait_timeout=httpx.Timeout(HANG_CLIENT_TIMEOUT_SECONDS),
    )
    runtime = await make_runtime(db, clock, fresh_db_url, feedcache=feedcache)
    assert runtime.settings.r2_public_url is None
    daily = await run_lane(runtime, clock, "daily")
    assert daily is not None
    [reconcile] = [j for j in daily.jobs if j.name == "runReconcile"]
    assert reconcile.status == "skipped"  # (its outbox drain runs: nothing was owed yet)
    # an intent the platform itself wrote (or one written before effects existed), after it
    await db.execute(
        "INSERT INTO public.feed_invalidation_outbox (podcast_id, reason, created_at)"
        " VALUES (%(p)s, 'episode_published', %(t)s)",
        {"p": podcast, "t": NOW - DAY},
    )

    # hang: the worker purges its cache, but answers after the client's timeout
    hang = Hang(lambda _: (200, {"ok": True}))
    if failure == "hang":
        feed_server.responder = hang
    else:
        feed_server.status = int(failure)
    try:
        failed = await _minute(runtime, clock, MINUTE)
    finally:
        hang.release()
    assert failed["effects_delivered"] == 0 and failed["effects_retried"] == 1
    if failure == "hang":
        assert hang.received == 1 and "Timeout" in failed["errors"][0]["error"]
        await hang.answer_late()
    feed_server.responder, feed_server.status = None, 200  # the worker recovers
    drained = await _minute(runtime, clock, MINUTE)  # the next minute run
    assert drained["effects_delivered"] == 1
    [effect] = await _effects(db, "feed_invalidate")
    assert effect["attempts"] == 2 and effect["delivered_at"] == clock.now()
    [row] = await db.fetch(
        "SELECT delivered_at, attempts, last_error FROM public.feed_invalidation_outbox"
    )
    assert row == {"delivered_at": clock.now(), "attempts": 2, "last_error": None}
    assert [(c.query, c.json()) for c in feed_server.requests] == 2 * [
        ({"wait": "1"}, {"id": podcast})
    ]
    await _minute(runtime, clock, MINUTE)
    assert len(feed_server.requests) == 2


# --- loss 5: a send delivered but answered too late ---------------------------------------------
async def test_a_timed_out_but_delivered_email_is_retried_within_minutes_with_the_same_key(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    account, _ = await _account(db)
    resend.mode = "hang"  # Resend takes the email, then answers after our timeout
    report = await run_overage_escalation(runtime, clock)
    assert report.armed == 1 and report.emails_sent == 0 and report.claims == []
    key = idempotency_key(account, NOW, 0)
    assert resend.delivered[key] == 1

    resend.mode = "ok"
    drained = await _minute(runtime, clock, MINUTE)
    [effect] = await _effects(db, "mail")
    assert effect["delivered_at"] is not None and effect["attempts"] == 2
    # the retry came a minute after the first attempt, not a day (Resend keeps a key 24 h)
    assert effect["last_attempt_at"] - effect["created_at"] == MINUTE
    assert resend.keys == [key, key] and resend.delivered[key] == 1  # one email in the inbox
    # the minute run that delivered it claims the stage, and counts the email
    assert drained["emails_sent"] == 1
    assert drained["claims"] == [{"account_id": account, "stage": 0}]

    clock.advance(DAY)  # the next daily run: nothing to claim, nothing sent again
    report = await run_overage_escalation(runtime, clock)
    assert report.claims == [] and report.emails_sent == 0
    assert resend.keys == [key, key]


# --- a crash between the state change and the first send ----------------------------------------
def _hanging_stripe(
    server: RecordingServer, seconds: float
) -> tuple[Callable[[Request], Any], threading.Event]:
    """A Stripe that holds each POST ``seconds``; the event is set when a held one ends."""
    healthy = stripe_responder({})
    released = threading.Event()

    def respond(request: Request) -> Any:
        if request.method == "POST":
            time.sleep(seconds)
            released.set()
        return healthy(request)

    return respond, released


async def test_sigkill_after_the_commit_loses_no_billing_resume(
    db: Database, fresh_db_url: str, stripe_server: RecordingServer
) -> None:
    podcast, _ = await _paused_podcast(db, expires=NOW - MINUTE)
    stripe_server.responder, held_request_ended = _hanging_stripe(stripe_server, 4.0)
    env = _env(
        DATABASE_URL=fresh_db_url,
        STRIPE_SECRET_KEY="sk_test_123",
        STRIPE_API_BASE=stripe_server.url,
    )
    daily = await asyncio.create_subprocess_exec(
        _nightcrew(),
        *("lifecycle", "run", "daily", "--now", NOW.isoformat()),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # reactivated, committed, its first send under way
            if _stripe_updates(stripe_server):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the daily run never reached Stripe")
        os.kill(daily.pid, signal.SIGKILL)
    finally:
        await asyncio.wait_for(daily.wait(), timeout=10)
    row = await db.fetch_one("SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": podcast})
    assert row == {"status": "active"}
    [effect] = await _effects(db, "billing_resume")
    assert effect["delivered_at"] is None and effect["attempts"] == 1

    # the stand-in finishes the request it was holding (its client is gone)
    assert await asyncio.to_thread(held_request_ended.wait, 10)
    stripe_server.responder = stripe_responder({})
    # the next minute run after the claim's lease (5 minutes) delivers it
    minute = run(
        "lifecycle",
        "run",
        "minute",
        "--json",
        "--now",
        (NOW + outbox.CLAIM_LEASE + MINUTE).isoformat(),
        env=env,
    )
    assert minute.returncode == 0, minute.stderr
    [effect] = await _effects(db, "billing_resume")
    assert effect["delivered_at"] is not None and effect["attempts"] == 2
    key = billing_resume_key(podcast, NOW)
    assert _stripe_updates(stripe_server) == [key, key]  # Stripe sees one resume, twice asked


# --- two drains at once ------------------------------------------------------------------------
async def test_two_minute_lanes_in_parallel_never_deliver_an_effect_twice(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    async with db.transaction() as tx:
        for n in range(150):
            await outbox.record(
                tx,
                key=f"parallel:{n}",
                payload=outbox.MailPayload(to="a@example.test", subject="s", text="t", html="h"),
                now=NOW,
            )
    other = await Database.open(fresh_db_url)
    try:
        clock_a, clock_b = FrozenClock(NOW + MINUTE), FrozenClock(NOW + MINUTE)
        # Not the hang tests' 1 s: 150 sends to a threaded test server on a busy 2-core
        # machine can take longer to connect (a timeout here was a flake, not a double send).
        patient = httpx.Timeout(10.0)
        a = await _runtime(
            db, clock_a, fresh_db_url, http, resend, feed_server, mail_timeout=patient
        )
        b = await _runtime(
            other, clock_b, fresh_db_url, http, resend, feed_server, mail_timeout=patient
        )
        first, second = await asyncio.gather(
            deliver_effects(a, clock_a), deliver_effects(b, clock_b)
        )
    finally:
        await other.close()
    assert first.delivered + second.delivered == 150
    assert first.delivered > 0 and second.delivered > 0  # both really worked
    assert Counter(resend.keys) == Counter({f"parallel:{n}": 1 for n in range(150)})


# --- dead letters ------------------------------------------------------------------------------
async def test_an_effect_that_keeps_failing_dies_at_its_maximum_age_and_retry_delivers_it(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    resend.mode = "500"
    async with db.transaction() as tx:
        effect = await outbox.record(
            tx,
            key="overage:acct:1:0",
            payload=outbox.MailPayload(
                to="owner@example.test", subject="s", text="t", html="<p>h</p>"
            ),
            now=NOW,
        )
    attempts_at: list[datetime] = []
    with capture_logs() as logs:
        while clock.now() < NOW + outbox.EFFECT_MAX_AGE + DAY:
            row = await outbox.get(db, effect.id)
            assert row is not None
            if row.dead_at is not None:
                break
            before = len(resend.keys)
            await deliver_effects(runtime, clock)
            if len(resend.keys) > before:
                attempts_at.append(clock.now())
            clock.advance(MINUTE)
    dead = await outbox.get(db, effect.id)
    assert dead is not None and dead.dead_at is not None and dead.delivered_at is None
    assert "expired" in (dead.last_error or "") and "500" in (dead.last_error or "")
    [died] = [e for e in logs if e["event"] == "effects_dead"]
    assert died["effect_id"] == effect.id and died["log_level"] == "warning"
    # backoff: 30 s doubling to 30 min (±20 %), never past the maximum age
    gaps = [b - a for a, b in itertools.pairwise(attempts_at)]
    assert gaps[0] <= 2 * MINUTE and max(gaps) <= 37 * MINUTE and gaps[-2] >= 20 * MINUTE
    # a last call just before the maximum age, none after it
    assert NOW + outbox.EFFECT_MAX_AGE - 5 * MINUTE < attempts_at[-1] < NOW + outbox.EFFECT_MAX_AGE
    assert dead.dead_reason == "expired"

    env = _env(
        DATABASE_URL=fresh_db_url,
        RESEND_API_KEY="re_test",
        RESEND_FROM_EMAIL="billing@podcasts.example",
        RESEND_API_BASE=resend.server.url,
    )
    listed = run("effects", "list", "--dead", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    [shown] = json.loads(listed.stdout)
    assert shown["id"] == effect.id and shown["dead_at"] is not None
    human = run("effects", "list", "--dead", env=env)
    assert "nightcrew effects retry" in human.stdout and "overage:acct:1:0" in human.stdout

    resend.mode = "ok"
    retried = run("effects", "retry", str(effect.id), env=env)
    assert retried.returncode == 0, retried.stderr
    assert "delivered" in retried.stdout
    assert resend.delivered["overage:acct:1:0"] == 1
    assert json.loads(run("effects", "list", "--dead", "--json", env=env).stdout) == []

    again = run("effects", "retry", str(effect.id), env=env)  # delivered: nothing to re-drive
    assert again.returncode == 1 and "no undelivered effect" in again.stderr
    bad = run("effects", "retry", env=env)
    assert bad.returncode == 2 and "give an effect ID or --dead" in bad.stderr


async def test_drop_forgets_an_undelivered_effect_and_metrics_count_by_kind(
    db: Database, fresh_db_url: str, runtime: Runtime, clock: FrozenClock
) -> None:
    async with db.transaction() as tx:
        doomed = await outbox.record(
            tx, key="q:1", payload=outbox.QueuePayload(queue="", body={}), now=NOW
        )
        await outbox.record(tx, key="q:2", payload=outbox.QueuePayload(queue="x", body={}), now=NOW)
    clock.advance(MINUTE)
    report = await deliver_effects(runtime, clock)
    assert report.delivered == 1 and report.retried == 1  # an empty queue name is refused
    assert runtime.metrics.value("nightcrew_effects_pending", kind="queue") == 1
    assert runtime.metrics.value("nightcrew_effects_delivered_total", kind="queue") == 1
    rendered = runtime.metrics.render()
    assert 'nightcrew_effects_pending{kind="mail"} 0' in rendered

    env = _env(DATABASE_URL=fresh_db_url)
    dropped = run("effects", "drop", str(doomed.id), env=env)
    assert dropped.returncode == 0 and "dropped effect" in dropped.stdout
    assert await outbox.get(db, doomed.id) is None
    assert run("effects", "drop", str(doomed.id), env=env).returncode == 1


async def test_a_dry_run_of_the_minute_lane_delivers_nothing_and_changes_no_effect(
    db: Database,
    fresh_db_url: str,
    http: httpx.AsyncClient,
    resend: Resend,
    feed_server: RecordingServer,
) -> None:
    clock = FrozenClock(NOW)
    runtime = await _runtime(db, clock, fresh_db_url, http, resend, feed_server)
    async with db.transaction() as tx:
        await outbox.record(
            tx,
            key="dry:1",
            payload=outbox.MailPayload(to="a@example.test", subject="s", text="t", html="h"),
            now=NOW,
        )
        await outbox.record(
            tx,
            key="dry:2",
            payload=outbox.QueuePayload(queue="rss-invalidation", body={}),
            now=NOW,
        )
    before = await db.fetch("SELECT * FROM nightcrew.effects ORDER BY id")
    clock.advance(MINUTE)
    report = await run_lane(runtime, clock, "minute", dry_run=True)
    assert report is not None
    drained = report.to_json()["jobs"]["deliverEffects"]
    assert drained["effects_delivered"] == 2  # what a real run would deliver
    assert resend.server.requests == [] and await f.queue_messages(db, "rss-invalidation") == []
    assert await db.fetch("SELECT * FROM nightcrew.effects ORDER BY id") == before


async def test_retry_never_starts_a_second_delivery_of_an_effect_in_flight(
    db: Database, clock: FrozenClock
) -> None:
    async with db.transaction() as tx:
        effect = await outbox.record(
            tx, key="inflight:1", payload=outbox.QueuePayload(queue="q", body={}), now=NOW
        )
    [claimed] = await outbox.claim_due(db, NOW, limit=10)  # a drain holds it, mid-send
    assert claimed.id == effect.id
    assert await outbox.retry(db, NOW + MINUTE, ids=[effect.id]) == []
    assert await outbox.claim_due(db, NOW + MINUTE, limit=10) == []
    # once the lease has run out (the drain died), the operator may re-drive it
    later = NOW + outbox.CLAIM_LEASE + MINUTE
    assert [r.id for r in await outbox.retry(db, later, ids=[effect.id])] == [effect.id]


async def test_a_dropped_deletion_invalidation_stops_being_reported(
    db: Database, clock: FrozenClock, fresh_db_url: str
) -> None:
    from nightcrew.adapters.queues import MemoryQueueProducer
    from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts

    podcast = await f.podcast(db, status="pending_deletion", deletion_scheduled_at=NOW - DAY)
    down = MemoryQueueProducer(clock, failing_queues=frozenset({"rss-invalidation"}))
    async with httpx.AsyncClient() as http:  # and no feed worker to fall back on
        runtime = await make_runtime(
            db, clock, fresh_db_url, queues=down, feedcache=HttpFeedCache(http, None, None)
        )
        first = await hard_delete_expired_podcasts(runtime, clock)
    [left] = first.leftovers
    assert left.invalidation_state == "retrying" and left.invalidation_effect_id is not None
    assert await outbox.drop(db, left.invalidation_effect_id, NOW) is not None
    async with httpx.AsyncClient() as http:
        runtime = await make_runtime(
            db, clock, fresh_db_url, queues=down, feedcache=HttpFeedCache(http, None, None)
        )
        second = await hard_delete_expired_podcasts(runtime, clock)
    assert second.leftovers == []
    assert second.retried[0].invalidated_via == "given up (effect dropped)"
    assert second.retried[0].podcast_id == podcast


async def test_each_kinds_payload_is_stored_with_the_members_it_always_had(db: Database) -> None:
    """A payload is its kind's record, written as the snake_case members the drain (and every
    earlier build's drain) reads: no member added, none left null."""
    deleted = feed_outbox.PodcastInvalidation(
        type="podcast.deleted", podcast_id="p1", podcast_slug="s"
    )
    payloads: list[tuple[outbox.EffectPayload, dict[str, Any]]] = [
        (
            outbox.MailPayload(to="a@example.test", subject="s", text="t", html="h"),
            {"to": "a@example.test", "subject": "s", "text": "t", "html": "h"},
        ),
        (
            outbox.QueuePayload(
                queue="rss-invalidation", body=deleted.to_json(), fallback_invalidate="p1"
            ),
            {
                "queue": "rss-invalidation",
                "body": {"type": "podcast.deleted", "podcast_id": "p1", "podcast_slug": "s"},
                "fallback_invalidate": "p1",
            },
        ),
        (
            outbox.QueuePayload(queue=PUBLIC_API_INVALIDATION, body={"type": "podcast.restored"}),
            {"queue": PUBLIC_API_INVALIDATION, "body": {"type": "podcast.restored"}},
        ),
        (
            billing_resume.BillingResumePayload(podcast_id="p1", account_id="a1"),
            {"podcast_id": "p1", "account_id": "a1"},
        ),
        (
            feed_outbox.FeedInvalidatePayload(podcast_id="p1", outbox_id="o1"),
            {"podcast_id": "p1", "outbox_id": "o1"},
        ),
    ]
    for n, (payload, stored) in enumerate(payloads):
        effect = await outbox.record(db, key=f"payload:{n}", payload=payload, now=NOW)
        assert effect.kind == payload.kind
        row = await db.fetch_one(
            "SELECT payload FROM nightcrew.effects WHERE id = %(id)s", {"id": effect.id}
        )
        assert row is not None and row["payload"] == stored
        assert effect.read(type(payload)) == payload
    with pytest.raises(TypeError, match="not a mail one"):
        effect.read(outbox.MailPayload)
    # a revived intent's payload carries what only the row's reader needs: still read
    revived = {**stored, "revived": 1, "last_death": {"dead_reason": "expired"}}
    await db.execute(
        "UPDATE nightcrew.effects SET payload = %(p)s::jsonb WHERE id = %(id)s",
        {"p": json.dumps(revived), "id": effect.id},
    )
    again = await outbox.get(db, effect.id)
    assert again is not None and again.read(feed_outbox.FeedInvalidatePayload) == payload
