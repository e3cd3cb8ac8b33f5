"""An apply run's drain of the feed-invalidation outbox, over the confirmable ``?wait=1``
lane."""

from __future__ import annotations

from datetime import datetime

from nightcrew.clock import Clock
from nightcrew.effects import outbox as effects_outbox
from nightcrew.effects.deliver import drain
from nightcrew.lifecycle import feed_outbox
from nightcrew.lifecycle.reconcile.records import OutboxDrain
from nightcrew.log import event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

# An apply run makes every undelivered feed_invalidation_outbox intent due (the oldest first),
# this many to a statement: an effect created for those without one, the effect revived for
# those whose effect died or waits out a backoff. One ?wait=1 call per podcast covers all of
# its intents. The drain then attempts them for up to OUTBOX_DRAIN_BUDGET_SECONDS (a daily run
# can wait longer than the minute lane's 40 s); what a longer outage leaves is due now, so the
# next minute's drain goes on with it.
OUTBOX_ADOPT_MAX = 5000
OUTBOX_DRAIN_BUDGET_SECONDS = 600.0
LOGGED_IDS_MAX = 20


async def drain_feed_outbox(runtime: Runtime, clock: Clock, now: datetime) -> OutboxDrain:
    """Attempt every undelivered intent, whatever became of an earlier effect: spec 000's drain
    "runs on every apply run" and leaves a failed row pending to be retried, so an effect that
    died (a 4xx, its maximum age) is revived here, not left as the intent's end
    (lifecycle/feed_outbox.sql, adopt_feed_outbox). The minute lane drains what is due every
    minute but never revives the dead. This run's own intents (size backfill, quarantine) go out
    before its orphan sweeps."""
    revived = 0
    sample: list[effects_outbox.Effect] = []  # the first few, for the log line
    # A page made due is no longer selected (its effects are live and due now), so paging ends
    # when a page comes back empty; the page count is bounded all the same, in case a concurrent
    # minute-lane drain keeps failing intents back into a backoff while this loop runs.
    pages = await feed_outbox.count_pending(runtime.db) // OUTBOX_ADOPT_MAX + 1
    for _ in range(pages):
        driven = await feed_outbox.revive_feed_outbox(runtime.db, now, limit=OUTBOX_ADOPT_MAX)
        if not driven.created and not driven.revived:
            break
        revived += len(driven.revived)
        sample.extend(driven.revived[: LOGGED_IDS_MAX - len(sample)])
    if revived:
        event(
            "reconcile_outbox_revived",
            count=revived,
            # a sample, as r2_cleanup_failed's keys: a backlog of 5,000 is no log line
            effect_ids=[e.id for e in sample],
            outbox_ids=[str(e.payload.get("outbox_id")) for e in sample],
        )
    drained = await drain(
        runtime, clock, kinds=["feed_invalidate"], budget_seconds=OUTBOX_DRAIN_BUDGET_SECONDS
    )
    failures: list[Failure] = []
    for failure in drained.errors:
        detail = {k: v for k, v in failure.items() if k != "event"}
        warning("reconcile_outbox_delivery_failed", **detail)
        failures.append({"event": "reconcile_outbox_delivery_failed", **detail})
    return OutboxDrain(
        # after the drain: what is still owed, this run's failures and any backlog past the bound
        pending=await feed_outbox.count_pending(runtime.db),
        delivered=drained.delivered,
        failed=drained.retried + drained.dead,
        dead=drained.dead,
        revived=revived,
        failures=tuple(failures),
    )
