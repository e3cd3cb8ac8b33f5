"""The pipeline's four stages, one message at a time: fetch → enrich → review → write.

Each stage takes its candidate under a new fence (``take``), does its one expensive thing, and
saves the result with the next stage's admission and outgoing message in one transaction —
only under the fence it drew. So a message delivered twice (a consumer that died or lost its
channel, a relay that republished) finds the work done and is acknowledged as ``skipped``;
a second consumer of the same candidate while the first still works on it is kept out by the
stage lease (the review lease is the inline run's review lock), and an older holder's result is
refused by the fence. Writes are idempotent on the normalised URL.

This is the pipeline engine's half that consumes messages: each stage calls spec 001's steps —
the same modules the inline run (``inline.py``) calls: ``fetch``, ``items``, ``admission``,
``hydrate``, ``review``, ``write``, ``snapshot``, ``leases`` — and keeps only the candidate's
state machine (take, hand on, park, dead) and its messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Lease, Leases
from nightcrew.clock import Clock
from nightcrew.db.database import QueryError, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.log import describe_error, warning
from nightcrew.news import admission, hydrate, items, leases, pipeline, snapshot
from nightcrew.news import sources as news_sources
from nightcrew.news.candidates import Candidate, refused_for_its_data, verdict_to_json
from nightcrew.news.fetch import FetchResult, feed_rules, fetch_source, next_check
from nightcrew.news.leases import Superseded

# (by name: the stages ``review`` and ``write`` below are this module's own)
from nightcrew.news.review import (
    MAX_REVIEW_ATTEMPTS,
    Reviewed,
    is_written,
    review_item,
    review_lock_name,
)
from nightcrew.news.write import write_candidate
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

RETRY_BASE_SECONDS = 30  # a review the model failed goes again after 30 s, 60 s, 120 s, …


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

    @property
    def leases(self) -> Leases:
        return self.runtime.news_adapters().leases


Stage = Callable[[StageContext, dict[str, Any]], Awaitable[Outcome]]
T = TypeVar("T")


async def patiently(ctx: StageContext, step: Callable[[], Awaitable[T]], *, what: str) -> T:
    """``step``, again and again while the database is unavailable (backing off to 10 s),
    until it succeeds or the worker stops. A stage saves its result this way once its
    expensive step is done, so an outage never costs a second model call."""
    pause = 0.5
    while True:
        try:
            return await step()
        except DatabaseUnavailableError as exc:
            if ctx.stopping.is_set():
                raise
            warning("news.database_unavailable", step=what, error=describe_error(exc))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 10.0)


# --- leases ---------------------------------------------------------------------------------------
async def _acquire(ctx: StageContext, name: str, ttl: float) -> tuple[Leases, Lease | None]:
    """The stage lease from the configured backend; PostgreSQL's when Redis fails (spec 001)."""
    return await leases.acquire(
        ctx.leases,
        ctx.runtime.news_adapters().fallback_leases,
        name,
        ttl,
        lambda exc: warning("worker.redis.unavailable", error=str(exc)),
    )


# --- fetch ----------------------------------------------------------------------------------------
async def fetch(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    db, settings, now = ctx.runtime.db, ctx.runtime.settings, ctx.clock.now()
    source_id = int(body["source_id"])
    source = await db.fetch_one(SQL["source_for_fetch"], {"id": source_id})
    if source is None or source["fetch_queued_at"] is None:
        return Outcome("skipped", {"source_id": source_id, "why": "fetched already"})
    if not source["enabled"] or source["parked_at"] is not None:
        await db.execute(SQL["unqueue_source"], {"id": source_id})
        return Outcome("skipped", {"source_id": source_id, "why": "disabled or parked"})
    ttl = settings.news_stage_lease_seconds
    held_by, lease = await _acquire(ctx, f"news:fetch:{source_id}", ttl)
    if lease is None:
        await db.execute(
            SQL["refetch_later"],
            {
                "id": source_id,
                "now": now,
                "resend_after": settings.news_resend_after_seconds,
                "ttl": ttl,
            },
        )
        return Outcome("skipped", {"source_id": source_id, "why": "another worker fetches it"})
    try:
        return await _fetch_source(ctx, source, now)
    finally:
        await leases.release_quietly(held_by, lease)


async def _fetch_source(ctx: StageContext, source: dict[str, Any], now: datetime) -> Outcome:
    db, settings = ctx.runtime.db, ctx.runtime.settings
    adapters = ctx.runtime.news_adapters()
    # a feed never kills its worker: whatever goes wrong is that source's failed fetch
    result = await fetch_source(adapters.http, feed_rules(settings, adapters.policy), source, now)
    ids = {"source_id": source["id"]}
    if result.outcome in ("failed", "retry_later"):
        await news_sources.record_fetch(db, source, result, now)
        await db.execute(SQL["unqueue_source"], {"id": source["id"]})
        return Outcome("fetch_failed", {**ids, "error": result.error, "status": result.status})
    new = items.past_watermark(result.items, source["watermark_at"], source["watermark_urls"], now)
    mark_at, mark_urls = items.new_watermark(
        result.items, source["watermark_at"], source["watermark_urls"], now
    )
    firsts = ["review" if i.image_url else "enrich" for i in new]
    async with db.transaction() as tx:
        claimed = await tx.fetch_one(
            SQL["fetched"],
            {"id": source["id"], "watermark_at": mark_at, "watermark_urls": mark_urls},
        )
        if claimed is None:
            return Outcome("skipped", {**ids, "why": "a duplicate message fetched it first"})
        await tx.execute(
            news_sources.SQL["record_successes"],
            {
                "now": now,
                "ids": [source["id"]],
                "etags": [result.etag],
                "last_modified": [result.last_modified],
                "hashes": [result.body_hash],
                "next_check_at": [next_check(now, result, news_sources.CHECK_INTERVAL)],
            },
        )
        admitted = await admission.admit_each(tx, ctx.runtime.settings, firsts)
        owed = await items.hold_staged(
            tx,
            shard=source["shard"],
            source_id=source["id"],
            items=new,
            stages=firsts,
            states=admitted.states,
            reasons=admitted.reasons,
            now=now,
        )
    await pipeline.send_owed(ctx.broker, db, owed)
    return Outcome(
        "fetched",
        {
            **ids,
            "items": len(result.items),
            "new": len(new),
            "queued": len(owed),
            "held": admitted.states.count("held"),
        },
    )


# --- the candidate stages ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Fenced:
    """A candidate a stage worker took, and the fence its result must be saved under."""

    candidate: Candidate
    fence: int
    shard: str


async def _taken(ctx: StageContext, url: str, stage: str) -> _Fenced | None:
    row = await ctx.runtime.db.fetch_one(
        SQL["take"], {"url": url, "stage": stage, "now": ctx.clock.now()}
    )
    if row is None:
        return None
    candidate = Candidate.from_row({**row, "source_name": "", "source_shard": row["shard"]})
    return _Fenced(candidate, int(row["fence"]), row["shard"])


async def _hand_on(
    ctx: StageContext,
    taken: _Fenced,
    stage: str,
    next_stage: str,
    *,
    image_url: str | None = None,
    verdict: dict[str, Any] | None = None,
    translation: str | None = None,
) -> str:
    """Save this stage's result under the fence and admit the candidate to ``next_stage``
    (queued with its message, or held with the reason). Returns the new state."""
    db, now = ctx.runtime.db, ctx.clock.now()
    async with db.transaction() as tx:
        admitted = await admission.admit(tx, ctx.runtime.settings, next_stage, 1)
        state = "queued" if admitted.room else "held"
        saved = await tx.fetch_one(
            SQL["advance"],
            {
                "url": taken.candidate.url,
                "stage": stage,
                "fence": taken.fence,
                "next": next_stage,
                "state": state,
                "reason": admitted.reason or f"{stage}ed",
                "image_url": image_url,
                "verdict": json_param(verdict) if verdict is not None else None,
                "translation": translation,
                "attempted": 0,
                "error": None,
                "retry_base": RETRY_BASE_SECONDS,
                "now": now,
            },
        )
        if saved is None:
            raise Superseded(f"{taken.candidate.url}: taken over while in {stage}")
        owed = (
            await tx.fetch(
                pipeline.SQL["enqueue"],
                {"stage": next_stage, "url": taken.candidate.url, "shard": taken.shard, "now": now},
            )
            if state == "queued"
            else []
        )
    await pipeline.send_owed(ctx.broker, db, owed)
    return state


async def _under_lease(
    ctx: StageContext,
    stage: str,
    url: str,
    lease_name: str,
    ttl: float,
    work: Callable[[_Fenced], Awaitable[Outcome]],
) -> Outcome:
    held_by, lease = await _acquire(ctx, lease_name, ttl)
    if lease is None:
        await ctx.runtime.db.execute(
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
    try:
        taken = await _taken(ctx, url, stage)
        if taken is None:
            return Outcome("skipped", {"url": url, "why": f"not waiting for {stage}"})
        try:
            return await work(taken)
        except Superseded:
            return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
    finally:
        await leases.release_quietly(held_by, lease)


async def enrich(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])

    async def work(taken: _Fenced) -> Outcome:
        image = taken.candidate.item.image_url
        if image is None:
            image = await hydrate.hydrate_one(ctx.runtime.news_adapters(), url)
        state = await patiently(
            ctx,
            lambda: _hand_on(ctx, taken, "enrich", "review", image_url=image),
            what="enrich",
        )
        return Outcome("enriched", {"url": url, "image": image is not None, "next": state})

    return await _under_lease(
        ctx,
        "enrich",
        url,
        leases.stage_lease_name("enrich", url),
        ctx.runtime.settings.news_stage_lease_seconds,
        work,
    )


async def review(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])
    db = ctx.runtime.db

    async def work(taken: _Fenced) -> Outcome:
        if await is_written(db, url):
            await db.execute(SQL["drop"], {"url": url})
            return Outcome("skipped", {"url": url, "why": "written already"})
        reviewer = ctx.runtime.news_adapters().reviewer
        verdict, translation, transient = await review_item(reviewer, taken.candidate.item)
        if transient and taken.candidate.attempts + 1 < MAX_REVIEW_ATTEMPTS:
            retry_later = {
                "url": url,
                "stage": "review",
                "fence": taken.fence,
                "next": "review",
                "state": "held",
                "reason": "the model failed for now; sent again after a backoff",
                "image_url": None,
                "verdict": None,
                "translation": None,
                "attempted": 1,
                "error": "the model failed for now",
                "retry_base": RETRY_BASE_SECONDS,
                "now": ctx.clock.now(),
            }
            saved = await patiently(
                ctx, lambda: db.fetch_one(SQL["advance"], retry_later), what="review"
            )
            return Outcome("deferred" if saved else "skipped", {"url": url, "why": "model"})
        state = await patiently(
            ctx,
            lambda: _hand_on(
                ctx,
                taken,
                "review",
                "write",
                verdict=verdict_to_json(verdict) or {},
                translation=translation,
            ),
            what="review",
        )
        status = "unreviewed" if verdict is None else "accepted" if verdict.accepted else "rejected"
        return Outcome("reviewed", {"url": url, "verdict": status, "next": state})

    return await _under_lease(
        ctx,
        "review",
        url,
        review_lock_name(url),
        ctx.runtime.settings.ai_review_lock_ttl_seconds,
        work,
    )


async def write(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    """No lease: a write is cheap and idempotent (the URL is unique, the candidate goes under
    its fence), so two writers of one candidate leave one article and one review."""
    url = str(body["url"])
    db, now = ctx.runtime.db, ctx.clock.now()
    taken = await _taken(ctx, url, "write")
    if taken is None:
        return Outcome("skipped", {"url": url, "why": "not waiting for write"})
    candidate = taken.candidate
    reviewed = Reviewed(candidate, candidate.verdict, candidate.translation)
    try:
        ids = await write_candidate(
            db,
            taken.shard,
            taken.fence,
            reviewed,
            now,
            processed=ctx.runtime.news_adapters().processed,
        )
    except Superseded:
        return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
    except QueryError as exc:
        if not refused_for_its_data(exc):
            raise  # not this article's fault: the message is retried
        await db.execute(SQL["reject"], {"url": url, "reason": describe_error(exc), "now": now})
        return Outcome("rejected", {"url": url, "error": describe_error(exc)})
    return Outcome("written" if ids else "skipped", {"url": url, "status": reviewed.status})


STAGES: dict[str, Stage] = {"fetch": fetch, "enrich": enrich, "review": review, "write": write}


async def on_dead(ctx: StageContext, stage: str, body: dict[str, Any], error: str) -> None:
    """A message given up on: its candidate waits as ``dead`` (for `news dlq replay`); a fetch
    counts as its source's failure (enough of them park it)."""
    db, now = ctx.runtime.db, ctx.clock.now()
    if stage == "fetch" and "source_id" in body:
        source = await db.fetch_one(SQL["source_for_fetch"], {"id": int(body["source_id"])})
        if source is not None:
            await news_sources.record_fetch(
                db, source, FetchResult(outcome="failed", error=error), now
            )
            await db.execute(SQL["unqueue_source"], {"id": source["id"]})
    elif "url" in body:
        await db.execute(
            SQL["mark_dead"], {"url": str(body["url"]), "stage": stage, "error": error, "now": now}
        )


async def refresh_snapshots(ctx: StageContext, *, force: bool = False) -> int:
    """Publish every stale shard snapshot not published within NEWS_SNAPSHOT_DEBOUNCE_SECONDS
    (the write stage marks them stale): many writes, one snapshot per interval. ``force``: a
    stopping worker publishes what it made stale without waiting out the interval."""
    debounce = 0.0 if force else ctx.runtime.settings.news_snapshot_debounce_seconds
    return await snapshot.refresh_stale(
        ctx.runtime.db, ctx.runtime.store, ctx.clock.now(), debounce_seconds=debounce
    )
