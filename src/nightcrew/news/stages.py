"""The pipeline's four stages, one message at a time: fetch → enrich → review → write.

Each stage takes its candidate under a new fence (``take``), does its one expensive thing, and
saves the result with the next stage's admission and outgoing message in one transaction —
only under the fence it drew. So a message delivered twice (a consumer that died or lost its
channel, a relay that republished) finds the work done and is acknowledged as ``skipped``;
a second consumer of the same candidate while the first still works on it is kept out by the
stage lease (the review lease is the inline run's review lock), and an older holder's result is
refused by the fence. Writes are idempotent on the normalised URL.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.locks import Lease, LeaseBackendDown, Leases, with_fallback
from nightcrew.clock import Clock
from nightcrew.db.database import QueryError, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import DatabaseUnavailableError, NightcrewError
from nightcrew.log import describe_error, warning
from nightcrew.news import pipeline
from nightcrew.news import run as inline
from nightcrew.news import sources as news_sources
from nightcrew.news.candidates import Candidate, verdict_to_json
from nightcrew.news.fetch import FeedItem, FetchResult, fetch_feed, next_check
from nightcrew.news.images import hydrate_image
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# A date this far ahead of now is not believed for the watermark (a hostile or broken feed
# dated 2099 must not hide every later entry); such an item is de-duplicated by its URL.
FUTURE_TOLERANCE = timedelta(days=1)
RETRY_BASE_SECONDS = 30  # a review the model failed goes again after 30 s, 60 s, 120 s, …


class Superseded(NightcrewError):
    """A newer holder took the candidate (its fence moved on): this result is not saved."""


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
    return await with_fallback(
        ctx.leases,
        ctx.runtime.news_adapters().fallback_leases,
        lambda backend: backend.acquire(name, ttl),
        lambda exc: warning("worker.redis.unavailable", error=str(exc)),
    )


async def _release(leases: Leases, lease: Lease) -> None:
    """A lease that cannot be released now (its backend is down) simply runs out its TTL."""
    try:
        await leases.release(lease)
    except (NightcrewError, LeaseBackendDown) as exc:
        warning("news.lease_release_failed", lease=lease.name, error=describe_error(exc))


def _hashed(stage: str, key: str) -> str:
    return f"news:{stage}:" + hashlib.sha256(key.encode()).hexdigest()[:32]


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
    leases, lease = await _acquire(ctx, f"news:fetch:{source_id}", ttl)
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
        await _release(leases, lease)


async def _fetch_source(ctx: StageContext, source: dict[str, Any], now: datetime) -> Outcome:
    db, settings = ctx.runtime.db, ctx.runtime.settings
    adapters = ctx.runtime.news_adapters()
    try:
        result = await fetch_feed(
            adapters.http,
            source["feed_url"],
            now,
            inline.feed_rules(settings, adapters.policy),
            etag=source["etag"],
            last_modified=source["last_modified"],
            body_hash=source["body_hash"],
        )
    except Exception as exc:  # a feed never kills its worker: it is that source's failure
        result = FetchResult(outcome="failed", error=describe_error(exc))
    ids = {"source_id": source["id"]}
    if result.outcome in ("failed", "retry_later"):
        await news_sources.record_fetch(db, source, result, now)
        await db.execute(SQL["unqueue_source"], {"id": source["id"]})
        return Outcome("fetch_failed", {**ids, "error": result.error, "status": result.status})
    items = past_watermark(result.items, source["watermark_at"], source["watermark_urls"], now)
    mark_at, mark_urls = new_watermark(
        result.items, source["watermark_at"], source["watermark_urls"], now
    )
    firsts = ["review" if i.image_url else "enrich" for i in items]
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
        states, reasons = await _admit_each(ctx, tx, firsts)
        owed = await tx.fetch(
            pipeline.SQL["hold_staged"],
            {
                "shard": source["shard"],
                "now": now,
                "urls": [i.url for i in items],
                "source_ids": [source["id"]] * len(items),
                "titles": [i.title for i in items],
                "summaries": [i.summary for i in items],
                "images": [i.image_url for i in items],
                "published": [i.published for i in items],
                "stages": firsts,
                "states": states,
                "reasons": reasons,
            },
        )
    await pipeline.send_owed(ctx.broker, db, owed)
    return Outcome(
        "fetched",
        {
            **ids,
            "items": len(result.items),
            "new": len(items),
            "queued": len(owed),
            "held": states.count("held"),
        },
    )


async def _admit_each(ctx: StageContext, tx: Any, stages: list[str]) -> tuple[list[str], list[str]]:
    """Per item, in feed order: ``queued`` while its stage has room, else ``held`` + why."""
    room: dict[str, pipeline.Admission] = {}
    for stage in sorted(set(stages)):
        room[stage] = await pipeline.admit(tx, ctx.runtime.settings, stage, stages.count(stage))
    taken: dict[str, int] = {}
    states, reasons = [], []
    for stage in stages:
        taken[stage] = taken.get(stage, 0) + 1
        admission = room[stage]
        if taken[stage] <= admission.room:
            states.append("queued")
            reasons.append("fetched")
        else:
            states.append("held")
            reasons.append(admission.reason or "held")
    return states, reasons


def _believed(published: datetime | None, now: datetime) -> datetime | None:
    return published if published is not None and published <= now + FUTURE_TOLERANCE else None


def past_watermark(
    items: list[FeedItem], mark_at: datetime | None, mark_urls: list[str], now: datetime
) -> list[FeedItem]:
    """The items newer than what this source already handed on. An undated item (or one dated
    in the future) always passes: the database de-duplicates it by URL."""
    if mark_at is None:
        return items
    seen = set(mark_urls)
    kept = []
    for item in items:
        at = _believed(item.published, now)
        if at is None or at > mark_at or (at == mark_at and item.url not in seen):
            kept.append(item)
    return kept


def new_watermark(
    items: list[FeedItem], mark_at: datetime | None, mark_urls: list[str], now: datetime
) -> tuple[datetime | None, list[str]]:
    """The newest believable date among the items, and the URLs dated exactly then."""
    dated = [(at, i.url) for i in items if (at := _believed(i.published, now)) is not None]
    if not dated:
        return mark_at, mark_urls
    newest = max(at for at, _ in dated)
    if mark_at is not None and newest < mark_at:
        return mark_at, mark_urls
    urls = {url for at, url in dated if at == newest}
    if mark_at == newest:
        urls |= set(mark_urls)
    return newest, sorted(urls)


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
        admission = await pipeline.admit(tx, ctx.runtime.settings, next_stage, 1)
        state = "queued" if admission.room else "held"
        saved = await tx.fetch_one(
            SQL["advance"],
            {
                "url": taken.candidate.url,
                "stage": stage,
                "fence": taken.fence,
                "next": next_stage,
                "state": state,
                "reason": admission.reason or f"{stage}ed",
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
    leases, lease = await _acquire(ctx, lease_name, ttl)
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
        await _release(leases, lease)


async def enrich(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])

    async def work(taken: _Fenced) -> Outcome:
        image = taken.candidate.item.image_url
        if image is None:
            adapters = ctx.runtime.news_adapters()
            image, _ = await hydrate_image(adapters.http, url, adapters.policy)
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
        _hashed("enrich", url),
        ctx.runtime.settings.news_stage_lease_seconds,
        work,
    )


async def review(ctx: StageContext, body: dict[str, Any]) -> Outcome:
    url = str(body["url"])
    db = ctx.runtime.db

    async def work(taken: _Fenced) -> Outcome:
        if await db.fetch_one(SQL["is_written"], {"url": url}) is not None:
            await db.execute(SQL["drop"], {"url": url})
            return Outcome("skipped", {"url": url, "why": "written already"})
        reviewer = ctx.runtime.news_adapters().reviewer
        verdict, translation, transient = await inline.review_item(reviewer, taken.candidate.item)
        if transient and taken.candidate.attempts + 1 < inline.MAX_REVIEW_ATTEMPTS:
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
        inline.review_lock_name(url),
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
    reviewed = inline.Reviewed(candidate, candidate.verdict, candidate.translation)
    try:
        async with db.transaction() as tx:
            ids = await inline.insert_articles(tx, taken.shard, taken.fence, [reviewed], {}, now)
            if await tx.fetch_one(SQL["written"], {"url": url, "fence": taken.fence}) is None:
                raise Superseded(f"{url}: taken over while being written")
            await tx.execute(SQL["stale_snapshot"], {"shard": taken.shard, "now": now})
    except Superseded:
        return Outcome("skipped", {"url": url, "why": "taken over meanwhile"})
    except QueryError as exc:
        if not inline.refused_for_its_data(exc):
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
    db, now = ctx.runtime.db, ctx.clock.now()
    debounce = 0.0 if force else ctx.runtime.settings.news_snapshot_debounce_seconds
    shards = await db.fetch(SQL["claim_snapshots"], {"now": now, "debounce": debounce})
    for row in shards:
        try:
            await inline.publish_snapshot(db, ctx.runtime.store, row["shard"], now)
        except Exception:
            await db.execute(SQL["restale_snapshot"], {"shard": row["shard"], "now": now})
            raise
    return len(shards)
