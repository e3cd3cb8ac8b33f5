"""The pipeline's four stages, one message at a time: fetch → enrich → review → write.

Each stage takes its candidate under a new fence (``Attempt.take``), does its one expensive
thing, and saves the result with the next stage's outgoing message in one transaction — only
under the fence it drew. So a message delivered twice (a consumer that died or lost its
channel, a relay that republished) finds the work done and is acknowledged as ``skipped``; a
second consumer of the same candidate while the first still works on it is kept out by the
stage lease (``heartbeat``; the review lease is the inline run's review lock), and an older
holder's result is refused by the fence. Writes are idempotent on the normalised URL.

Each stage calls spec 001's steps — the modules the inline run calls (``steps``) — and keeps
only the candidate's state machine (take, hand on, park, dead) and its messages. A candidate
reaches the stages only once a pass has admitted it (``passes``), and goes through every stage
without being admitted again; the fetch stage holds what is new for the pass that sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.reviewer import CallScope, Spend
from nightcrew.clock import Clock
from nightcrew.db.database import QueryError, json_param
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error, warning
from nightcrew.news.engines.pipeline import message_outbox, notes
from nightcrew.news.engines.pipeline.attempts import (
    SAVE_TRIES,
    Attempt,
    Busy,
    Fenced,
    Isolation,
    patiently,
)
from nightcrew.news.engines.pipeline.heartbeat import Heartbeat, LeaseLost, Stopping, guarded
from nightcrew.news.engines.pipeline.messages import FetchSource, WorkOn, named_by, read
from nightcrew.news.report import redis_down
from nightcrew.news.sources import registry as news_sources
from nightcrew.news.sources.registry import DueSource
from nightcrew.news.steps import admission, hydrate, items, leases, snapshot
from nightcrew.news.steps.candidates import refused_for_its_data
from nightcrew.news.steps.fetch import FetchResult, feed_rules, fetch_source
from nightcrew.news.steps.leases import Superseded

# (by name: the stages ``review`` and ``write`` below are this module's own)
from nightcrew.news.steps.review import (
    REVIEW_FAILED_FOR_NOW,
    Reviewed,
    is_written,
    review_again_later,
    review_item,
    review_lock_name,
)
from nightcrew.news.steps.write import write_candidate
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

REFUSED_BY_THE_DATABASE = "refused by the database"


@dataclass(frozen=True, kw_only=True, slots=True)
class _QueuedSource(DueSource):
    """A source a fetch message names, with whether it still waits for that fetch
    (``source_for_fetch``)."""

    enabled: bool
    parked_at: datetime | None
    fetch_queued_at: datetime | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a message came to, for the worker's one event per message."""

    name: str  # fetched, enriched, reviewed, written, skipped, parked, deferred, rejected, …
    detail: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class StageContext:
    runtime: Runtime
    clock: Clock
    broker: PipelineBroker
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # the worker is stopping
    isolation: Isolation = field(default_factory=Isolation)  # suspects run alone
    # leases this worker could not release (the database was gone): released before it takes
    # one of those names again, so its own retry after the outage is not parked behind its own
    # lease (and later counted as a worker that died)
    unreleased: dict[str, Lease] = field(default_factory=dict)

    @property
    def leases(self) -> Leases:
        return self.runtime.news_adapters().leases


# a stage: its message's body as it came (each stage reads its own kind, ``messages.read``)
Stage = Callable[[StageContext, Attempt, JsonObject], Awaitable[Outcome]]


# --- fetch ----------------------------------------------------------------------------------------
async def fetch(ctx: StageContext, attempt: Attempt, body: JsonObject) -> Outcome:
    """A source's fetch: its new items held, waiting for the pass that sent it (no candidate
    is taken: its attempts are the broker's deliveries)."""
    db, settings, now = ctx.runtime.db, ctx.runtime.settings, ctx.clock.now()
    source_id = read(FetchSource, body).source_id
    source = await db.fetch_one_as(_QueuedSource, SQL["source_for_fetch"], {"id": source_id})
    if source is None or source.fetch_queued_at is None:
        return Outcome("skipped", {"source_id": source_id, "why": "fetched already"})
    if not source.enabled or source.parked_at is not None:
        await db.execute(SQL["unqueue_source"], {"id": source_id})
        return Outcome("skipped", {"source_id": source_id, "why": "disabled or parked"})
    ttl = float(settings.news_stage_lease_seconds)
    async with _lease_held(ctx, f"news:fetch:{source_id}", ttl) as beat:
        if beat is None:
            await db.execute(
                SQL["refetch_later"],
                {
                    "id": source_id,
                    "now": now,
                    "resend_after": settings.news_resend_after_seconds,
                    "ttl": ttl,
                },
            )
            await notes.note_fetch_locked(db, shard=source.shard, now=now)
            return Outcome("skipped", {"source_id": source_id, "why": "another worker fetches it"})
        beat.check()
        return await _fetch_source(ctx, source, now)


async def _fetch_source(ctx: StageContext, source: DueSource, now: datetime) -> Outcome:
    db, settings = ctx.runtime.db, ctx.runtime.settings
    adapters = ctx.runtime.news_adapters()
    # a feed never kills its worker: whatever goes wrong is that source's failed fetch
    result = await fetch_source(
        adapters.http, feed_rules(settings, adapters.policy, adapters.parsers), source, now
    )
    ids = {"source_id": source.id}
    if result.outcome in ("failed", "retry_later"):
        await items.record_failures(db, [(source, result, [])], now)
        await db.execute(SQL["unqueue_source"], {"id": source.id})
        return Outcome("fetch_failed", {**ids, "error": result.error, "status": result.status})
    # new by the inline run's rule (the processed-URL set), held with the fetch state, waiting
    # for the pass to admit them
    _, fetched = await items.unseen(
        adapters.processed,
        adapters.fallback_processed,
        [(source, result)],
        redis_down,
    )
    held = await items.hold_fetched(db, source.shard, fetched, now)
    if held.fetch_errors:  # not held for a reason not the items': fetched again later
        await db.execute(SQL["unqueue_source"], {"id": source.id})
        return Outcome("fetch_failed", {**ids, "error": held.fetch_errors[0].error})
    # the pass that sent the fetch reports these as its droppedItems: the items the feed
    # listed that cannot be kept, and those the database refused to hold for their own data
    # (each logged by the hold; an inline run reports those in its writeErrors)
    dropped = dict(result.dropped)
    if held.write_errors:
        dropped[REFUSED_BY_THE_DATABASE] = len(held.write_errors)
    async with db.transaction() as tx:
        await notes.note_dropped(
            tx, shard=source.shard, source=source.name, dropped=dropped, now=now
        )
        await tx.execute(SQL["unqueue_source"], {"id": source.id})
    new = fetched[0][2]
    return Outcome("fetched", {**ids, "items": len(result.items), "new": len(new)})


async def _hand_on(
    ctx: StageContext,
    attempt: Attempt,
    taken: Fenced,
    stage: str,
    next_stage: str,
    *,
    image_url: str | None = None,
    verdict: JsonObject | None = None,
    translation: str | None = None,
    spend: Spend | None = None,
) -> None:
    """Save this stage's result under the fence and queue the candidate, with its message, for
    ``next_stage``. It was admitted by its pass: it is not admitted again. ``spend``: the
    model's tokens for it, noted with it for the next pass's report."""
    db, now = ctx.runtime.db, ctx.clock.now()
    async with db.transaction() as tx:
        saved = await tx.fetch_one(
            SQL["advance"],
            {
                "url": taken.candidate.url,
                "stage": stage,
                "fence": taken.fence,
                "next": next_stage,
                "reason": f"{stage}ed",
                "image_url": image_url,
                "verdict": json_param(verdict) if verdict is not None else None,
                "translation": translation,
                "now": now,
            },
        )
        if saved is None:
            raise Superseded(f"{taken.candidate.url}: taken over while in {stage}")
        if spend is not None:
            await notes.note_tokens(tx, shard=taken.shard, spend=spend, now=now)
        owed = await message_outbox.enqueue(
            tx, stage=next_stage, url=taken.candidate.url, shard=taken.shard, now=now
        )
    attempt.closed()  # ``advance`` says so in the row
    await message_outbox.send_owed(ctx.broker, db, owed)


async def _under_lease(
    ctx: StageContext,
    attempt: Attempt,
    stage: str,
    url: str,
    lease_name: str,
    work: Callable[[Fenced, Heartbeat], Awaitable[Outcome]],
) -> Outcome:
    async with ctx.isolation.work() as isolate:
        return await _leased(ctx, attempt, stage, url, lease_name, work, isolate)


async def _leased(
    ctx: StageContext,
    attempt: Attempt,
    stage: str,
    url: str,
    lease_name: str,
    work: Callable[[Fenced, Heartbeat], Awaitable[Outcome]],
    isolate: Callable[[], Awaitable[None]],
) -> Outcome:
    db, ttl = ctx.runtime.db, float(ctx.runtime.settings.news_stage_lease_seconds)
    async with _lease_held(ctx, lease_name, ttl) as beat:
        if beat is None:
            await db.execute(
                SQL["park"],
                {
                    "url": url,
                    "stage": stage,
                    "reason": f"its {stage} lease is held elsewhere; sent again once it is free",
                    "wait": ttl,  # by then the lease is free, whoever held it
                    "now": ctx.clock.now(),
                },
            )
            return Outcome("parked", {"url": url, "why": "lease held elsewhere"})
        taken = await attempt.take(db, ctx.clock, ctx.runtime.settings, url, stage)
        if taken is None:
            return Outcome("skipped", {"url": url, "why": f"not waiting for {stage}"})
        try:
            if taken.suspect:
                await isolate()
            outcome = await work(taken, beat)
        except Superseded:
            return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
        except LeaseLost:
            reason = f"its {stage} lease is held elsewhere (this worker's was not renewed)"
            await attempt.untake(db, ctx.clock, taken, stage, held_for=ttl, reason=reason)
            return Outcome("parked", {"url": url, "why": "lease lost"})
        except (Stopping, asyncio.CancelledError):
            await attempt.untake(db, ctx.clock, taken, stage)
            raise
        await attempt.finished(db, taken, stage)
        return outcome


@asynccontextmanager
async def _lease_held(ctx: StageContext, name: str, ttl: float) -> AsyncIterator[Heartbeat | None]:
    """The stage's lease ``name``, renewed while the block runs and released after it; None
    when another worker holds it (the block then says when to come back)."""
    lease = await _acquire_own(ctx, name, ttl)
    if lease is None:
        yield None
        return
    try:
        async with Heartbeat(ctx.leases, lease, ttl, ctx.stopping) as beat:
            yield beat
    finally:
        await _release(ctx, name, lease)


async def _acquire_own(ctx: StageContext, name: str, ttl: float) -> Lease | None:
    """The lease ``name``, after releasing this worker's own of that name that a database
    outage kept it from releasing (the outage is over if this gets that far)."""
    stale = ctx.unreleased.pop(name, None)
    if stale is not None:
        await _release(ctx, name, stale)
    return await ctx.leases.acquire(name, ttl)


async def _release(ctx: StageContext, name: str, lease: Lease) -> None:
    """Released, or remembered for ``_acquire_own`` when the database cannot answer now (the
    lease runs out its TTL meanwhile). A stage's lease is on one source or one candidate, and
    its fence in ``nightcrew.leases`` is not read (the candidate's own is): its row goes."""
    if not await leases.release_quietly(ctx.leases, lease, forget=True):
        ctx.unreleased[name] = lease


async def enrich(ctx: StageContext, attempt: Attempt, body: JsonObject) -> Outcome:
    url = read(WorkOn, body).url

    async def work(taken: Fenced, beat: Heartbeat) -> Outcome:
        image = taken.candidate.item.image_url
        if image is None:
            beat.check()
            image = await hydrate.hydrate_one(ctx.runtime.news_adapters(), url)
        await patiently(
            ctx.stopping,
            lambda: _hand_on(ctx, attempt, taken, "enrich", "review", image_url=image),
            what="enrich save",
            transient_tries=SAVE_TRIES,
        )
        return Outcome("enriched", {"url": url, "image": image is not None})

    return await _under_lease(
        ctx,
        attempt,
        "enrich",
        url,
        leases.stage_lease_name("enrich", url),
        work,
    )


async def review(ctx: StageContext, attempt: Attempt, body: JsonObject) -> Outcome:
    url = read(WorkOn, body).url
    db = ctx.runtime.db

    async def work(taken: Fenced, beat: Heartbeat) -> Outcome:
        if await is_written(db, url):
            await db.execute(SQL["drop"], {"url": url})
            return Outcome("skipped", {"url": url, "why": "written already"})
        reviewer = ctx.runtime.news_adapters().reviewer
        # no model call without the lease (nor once the worker is stopping)
        beat.check()
        spend = Spend()
        verdict, translation, transient = await review_item(
            guarded(reviewer, beat), taken.candidate.item, CallScope(spend=spend)
        )
        if review_again_later(taken.candidate, transient):
            # the inline run's rule: a later pass admits it again, within its cost bound
            waits = {"url": url, "fence": taken.fence, "reason": REVIEW_FAILED_FOR_NOW}

            async def wait_for_later() -> bool:
                async with db.transaction() as tx:
                    later = {**waits, "now": ctx.clock.now()}
                    waiting = await tx.fetch_one(SQL["review_later"], later) is not None
                    if waiting:
                        await notes.note_tokens(
                            tx, shard=taken.shard, spend=spend, now=ctx.clock.now()
                        )
                    return waiting

            saved = await patiently(ctx.stopping, wait_for_later, what="review save")
            if not saved:  # taken over meanwhile (its fence moved on): nothing to defer
                return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
            attempt.closed()  # ``review_later`` says so in the row
            return Outcome("deferred", {"url": url, "why": "model"})
        await patiently(
            ctx.stopping,
            lambda: _hand_on(
                ctx,
                attempt,
                taken,
                "review",
                "write",
                verdict=verdict.to_json() if verdict is not None else {},
                translation=translation,
                spend=spend,
            ),
            what="review save",
            transient_tries=SAVE_TRIES,
        )
        status = "unreviewed" if verdict is None else "accepted" if verdict.accepted else "rejected"
        return Outcome("reviewed", {"url": url, "verdict": status})

    return await _under_lease(
        ctx,
        attempt,
        "review",
        url,
        review_lock_name(url),  # the inline run's lock, by name; here short and renewed
        work,
    )


async def write(ctx: StageContext, attempt: Attempt, body: JsonObject) -> Outcome:
    """No lease: a write is cheap and idempotent (the URL is unique, the candidate goes under
    its fence), so two writers of one candidate leave one article and one review."""
    async with ctx.isolation.work() as isolate:
        return await _write(ctx, attempt, body, isolate)


async def _write(
    ctx: StageContext,
    attempt: Attempt,
    body: JsonObject,
    isolate: Callable[[], Awaitable[None]],
) -> Outcome:
    url = read(WorkOn, body).url
    db, now = ctx.runtime.db, ctx.clock.now()
    ttl = float(ctx.runtime.settings.news_stage_lease_seconds)
    try:  # the row is its lease: another take under way for less than a lease's TTL keeps it
        taken = await attempt.take(db, ctx.clock, ctx.runtime.settings, url, "write", busy_for=ttl)
    except Busy as busy:
        wait = (busy.since + timedelta(seconds=ttl) - now).total_seconds()
        await db.execute(
            SQL["park"],
            {
                "url": url,
                "stage": "write",
                "reason": "its write is under way elsewhere; sent again if it does not finish",
                "wait": max(wait, 1.0),
                "now": now,
            },
        )
        return Outcome("parked", {"url": url, "why": "written elsewhere now"})
    if taken is None:
        return Outcome("skipped", {"url": url, "why": "not waiting for write"})
    if taken.suspect:
        await isolate()
    candidate = taken.candidate
    reviewed = Reviewed(candidate, candidate.verdict, candidate.translation)
    try:
        ids = await write_candidate(db, taken.shard, taken.fence, reviewed, now)
    except Superseded:
        return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
    except QueryError as exc:
        if not refused_for_its_data(exc):
            raise  # not this article's fault: tried again (a deadlock) or dead-lettered
        await db.execute(SQL["reject"], {"url": url, "reason": describe_error(exc), "now": now})
        attempt.closed()
        return Outcome("rejected", {"url": url, "error": describe_error(exc)})
    # the processed-URL set, as the inline run records its writes (a Redis that fails there
    # costs nothing: the written article is the record)
    adapters = ctx.runtime.news_adapters()
    await items.mark_processed(
        adapters.processed,
        adapters.fallback_processed,
        list(ids),
        redis_down,
    )
    return Outcome("written" if ids else "skipped", {"url": url, "status": reviewed.status})


HANDLERS: dict[str, Stage] = {"fetch": fetch, "enrich": enrich, "review": review, "write": write}


async def on_dead(ctx: StageContext, stage: str, body: JsonObject, error: str) -> None:
    """A message given up on: its candidate waits as ``dead`` (for `news dlq replay`); a fetch
    counts as its source's failure (enough of them park it)."""
    db, now = ctx.runtime.db, ctx.clock.now()
    fetch = named_by(FetchSource, body) if stage == "fetch" else None
    if fetch is not None:
        source = await db.fetch_one_as(
            _QueuedSource, SQL["source_for_fetch"], {"id": fetch.source_id}
        )
        if source is not None:
            await news_sources.record_fetch(
                db, source, FetchResult(outcome="failed", error=error), now
            )
            await db.execute(SQL["unqueue_source"], {"id": source.id})
    elif (work := named_by(WorkOn, body)) is not None:
        await db.execute(
            SQL["mark_dead"], {"url": work.url, "stage": stage, "error": error, "now": now}
        )


async def refresh_snapshots(ctx: StageContext, *, force: bool = False) -> int:
    """Publish every stale shard snapshot not published within NEWS_SNAPSHOT_DEBOUNCE_SECONDS
    (the write stage marks them stale): many writes, one snapshot per interval. ``force``: a
    stopping worker publishes what it made stale without waiting out the interval."""
    db, now = ctx.runtime.db, ctx.clock.now()
    debounce = 0.0 if force else ctx.runtime.settings.news_snapshot_debounce_seconds
    # every few seconds in every worker: the article count is read only when one is due
    if not await snapshot.any_due(db, now, debounce_seconds=debounce):
        return 0
    if not await admission.allows_expensive(db, ctx.runtime.settings):
        # spec 001 defers snapshot refresh with every expensive step; they stay stale
        warning("worker.backpressure.snapshot_deferred")
        return 0
    return await snapshot.refresh_stale(db, ctx.runtime.store, now, debounce_seconds=debounce)
