"""SIGKILL between a state change's commit and its effect's first send.

The daily lane runs in a process of its own (``tests/faults/_commit_then_crash.py``) that kills
itself with SIGKILL the moment the first effect is about to be claimed: the reactivation or the
deletion has committed, with the effect it owes, and nothing has been claimed or sent. The
test checks the kill landed exactly there, then that the next minute run — a minute later, not
after a claim's lease — delivers the effect once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nightcrew.adapters.billing import StripeBilling
from nightcrew.adapters.queues import RSS_INVALIDATION
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import run_lane
from nightcrew.lifecycle.pauses import billing_resume_key
from tests import factories as f
from tests.conftest import NOW, make_runtime
from tests.faults._commit_then_crash import MARKER
from tests.integration.lifecycle.test_pauses import _paused_podcast
from tests.support.servers import RecordingServer, stripe_responder

REPO = Path(__file__).resolve().parents[2]
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)
BOUND = 120  # seconds a helper process may take on a loaded machine


async def _crash_the_daily_lane(url: str, stripe: RecordingServer) -> list[int]:
    """Run the helper; returns the ids it was about to claim when it killed itself."""
    crash = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.faults._commit_then_crash", url, stripe.url),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(crash.communicate(), BOUND)
    finally:
        if crash.returncode is None:
            crash.kill()
            await crash.wait()
    text = out.decode(errors="replace")
    assert crash.returncode == -signal.SIGKILL, text
    [line] = [ln for ln in text.splitlines() if ln.startswith(MARKER)]
    ids: list[int] = json.loads(line[len(MARKER) :])
    return ids


async def _effects(db: Database) -> list[dict[str, Any]]:
    return await db.fetch("SELECT * FROM nightcrew.effects ORDER BY id")


async def _next_minute_run(db: Database, url: str, stripe: RecordingServer) -> dict[str, Any]:
    clock = FrozenClock(NOW + MINUTE)
    billing = StripeBilling("sk_test_123", api_base=stripe.url, max_network_retries=0)
    try:
        report = await run_lane(
            await make_runtime(db, clock, url, billing=billing), clock, "minute"
        )
    finally:
        await billing.close()
    assert report is not None
    drained: dict[str, Any] = report.to_json()["jobs"]["deliverEffects"]
    return drained


@pytest.mark.parametrize("owed", ["billing_resume", "rss_invalidation"])
async def test_sigkill_between_the_commit_and_the_first_send_is_delivered_by_the_next_minute(
    db: Database, fresh_db_url: str, stripe_server: RecordingServer, owed: str
) -> None:
    if owed == "billing_resume":
        podcast, _ = await _paused_podcast(db, expires=NOW - MINUTE)
    else:
        podcast = await f.podcast(db, status="pending_deletion", deletion_scheduled_at=NOW - DAY)
    stripe_server.responder = stripe_responder({})

    ids = await _crash_the_daily_lane(fresh_db_url, stripe_server)

    # The kill landed in the window: the state change and its effect committed; the effect was
    # never claimed, never attempted; nothing reached Stripe or the queue.
    [effect] = await _effects(db)
    assert ids == [effect["id"]]
    assert effect["attempts"] == 0
    assert effect["last_attempt_at"] is None and effect["claimed_until"] is None
    assert effect["delivered_at"] is None and effect["dead_at"] is None
    assert stripe_server.requests == []
    assert await f.queue_messages(db, RSS_INVALIDATION) == []
    if owed == "billing_resume":
        assert effect["kind"] == "billing_resume"
        assert effect["key"] == billing_resume_key(podcast, NOW)
        row = await db.fetch_one(
            "SELECT status FROM public.podcasts WHERE id = %(p)s", {"p": podcast}
        )
        assert row == {"status": "active"}
    else:
        assert effect["kind"] == "queue" and effect["payload"]["queue"] == RSS_INVALIDATION
        gone = await db.fetch_one(
            "SELECT 1 AS n FROM public.podcasts WHERE id = %(p)s", {"p": podcast}
        )
        assert gone is None
        record = await db.fetch_one(
            "SELECT invalidation_effect_id FROM nightcrew.podcast_deletions"
            " WHERE podcast_id = %(p)s",
            {"p": podcast},
        )
        assert record == {"invalidation_effect_id": effect["id"]}

    # The next minute run, one minute on: due at once, no claim's lease to wait out.
    drained = await _next_minute_run(db, fresh_db_url, stripe_server)
    assert drained["effects_delivered"] == 1
    [effect] = await _effects(db)
    assert effect["attempts"] == 1 and effect["delivered_at"] == NOW + MINUTE
    if owed == "billing_resume":
        posts = [r for r in stripe_server.requests if r.method == "POST"]
        assert [(r.path, r.headers.get("Idempotency-Key")) for r in posts] == [
            ("/v1/subscriptions/sub_1", billing_resume_key(podcast, NOW))
        ]
    else:
        [message] = await f.queue_messages(db, RSS_INVALIDATION)
        assert message["body"] == {
            "type": "podcast.deleted",
            "podcast_id": podcast,
            "podcast_slug": message["body"]["podcast_slug"],
            "effect_id": effect["id"],
        }

    sent = len(stripe_server.requests)
    assert (await _next_minute_run(db, fresh_db_url, stripe_server))["effects_delivered"] == 0
    assert len(stripe_server.requests) == sent
    assert len(await f.queue_messages(db, RSS_INVALIDATION)) == (owed == "rss_invalidation")
