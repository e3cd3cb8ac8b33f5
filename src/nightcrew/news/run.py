"""One news run of one shard, in spec 001's order.

lock → fetch RSS candidates → processed-URL lookup (Redis set + database, in bulk) → queued
counts by source and shard → article count → backpressure check → extend the lease → image
hydration → per-article AI review locks → review + translation → writes (fenced) → snapshot
→ report. When the queue or the database is over its limit the run stops before the first
expensive step and saves a lightweight report that says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

from nightcrew import runs
from nightcrew.adapters.locks import Lease, Leases, PostgresLeases, RedisLeases
from nightcrew.clock import Clock
from nightcrew.db.database import Database, QueryError, json_param
from nightcrew.db.queries import load_queries
from nightcrew.log import describe_error, event, warning
from nightcrew.news import sources as news_sources
from nightcrew.news.fetch import FeedItem, FetchResult, fetch_feed, new_client
from nightcrew.news.images import hydrate_image
from nightcrew.news.review import Article, Reviewer, ReviewError, Verdict, make_reviewer
from nightcrew.runtime import Runtime
from nightcrew.scheduler import Schedule

SQL = load_queries(__file__)

FETCH_CONCURRENCY = 8
HYDRATE_CONCURRENCY = 8
NO_THUMBNAIL_RETRY_AGE_SECONDS = 6 * 3600
NO_THUMBNAIL_RETRY_MAX = 20
SNAPSHOT_SIZE = 50
PROCESSED_SET = "news:processed"
TRANSLATION_LANGUAGE = "English"

Trigger = Literal["manual", "scheduled"]


class StaleLease(Exception):
    """A newer holder of the shard has written: this run's writes are refused."""


@dataclass(kw_only=True)
class NewsDeps:
    """What a run needs beyond the Runtime: the lease backend, Redis (if any), HTTP, a reviewer."""

    leases: Leases
    http: httpx.AsyncClient
    reviewer: Reviewer
    redis: Any = None  # redis.asyncio client, or None
    allowed_image_hosts: frozenset[str] = frozenset()


@dataclass(kw_only=True)
class NewsReport:
    shard: str
    trigger: Trigger
    queued_count: int = 0
    queued_by_source: dict[str, int] = field(default_factory=dict)
    deferred_count: int = 0
    deferred_reasons: list[str] = field(default_factory=list)
    retried_count: int = 0
    processed_count: int = 0
    ai_reviewed_count: int = 0
    accepted_count: int = 0
    rejected_count: int = 0
    backpressure_queue_limit: int = 0
    backpressure_db_article_limit: int = 0
    backpressure_db_article_count: int | None = None
    backpressure_db_article_count_error: str | None = None
    locked_count: int = 0
    redis_ai_review_lock_skipped_count: int = 0
    redis_enabled: bool = False
    translated_count: int = 0
    skipped: bool = False
    fetch_errors: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "trigger": self.trigger,
            "skipped": self.skipped,
            "queuedCount": self.queued_count,
            "queuedBySource": self.queued_by_source,
            "deferredCount": self.deferred_count,
            "deferredReasons": self.deferred_reasons,
            "retriedCount": self.retried_count,
            "processedCount": self.processed_count,
            "aiReviewedCount": self.ai_reviewed_count,
            "acceptedCount": self.accepted_count,
            "rejectedCount": self.rejected_count,
            "backpressureQueueLimit": self.backpressure_queue_limit,
            "backpressureDbArticleLimit": self.backpressure_db_article_limit,
            "backpressureDbArticleCount": self.backpressure_db_article_count,
            "backpressureDbArticleCountError": self.backpressure_db_article_count_error,
            "lockedCount": self.locked_count,
            "redisAiReviewLockSkippedCount": self.redis_ai_review_lock_skipped_count,
            "redisEnabled": self.redis_enabled,
            "translatedCount": self.translated_count,
            "fetchErrors": self.fetch_errors,
            "durationMs": self.duration_ms,
        }


def shard_lock_name(shard: str) -> str:
    return f"news:shard:{shard}"


async def run_shard(
    runtime: Runtime, clock: Clock, deps: NewsDeps, shard: str, *, trigger: Trigger = "manual"
) -> NewsReport:
    started = time.perf_counter()
    settings = runtime.settings
    report = NewsReport(
        shard=shard,
        trigger=trigger,
        redis_enabled=deps.redis is not None,
        backpressure_queue_limit=settings.ingestion_backpressure_queue_limit,
        backpressure_db_article_limit=settings.ingestion_backpressure_db_article_limit,
    )
    lease = await deps.leases.acquire(shard_lock_name(shard), settings.worker_lock_ttl_seconds)
    if lease is None:
        report.skipped, report.locked_count = True, 1
        report.deferred_reasons.append("another run holds this shard's lock")
        (event if trigger == "manual" else warning)(
            "worker.shard_locked", shard=shard, trigger=trigger
        )
        return _finish(report, started)
    try:
        await _run(runtime, clock, deps, lease, report)
    finally:
        await deps.leases.release(lease)
    report = _finish(report, started)
    await runtime.db.execute(
        SQL["save_report"],
        {
            "shard": shard,
            "trigger": trigger,
            "now": clock.now(),
            "report": json_param(report.to_json()),
        },
    )
    event(
        "worker.run_completed",
        **{k: v for k, v in report.to_json().items() if isinstance(v, int | bool | str)},
    )
    return report


def _finish(report: NewsReport, started: float) -> NewsReport:
    report.duration_ms = round((time.perf_counter() - started) * 1000, 1)
    return report


async def _run(
    runtime: Runtime, clock: Clock, deps: NewsDeps, lease: Lease, report: NewsReport
) -> None:
    db, settings, now = runtime.db, runtime.settings, clock.now()

    # 1. RSS candidates from every due source of the shard
    due = await db.fetch(news_sources.SQL["due_sources"], {"shard": report.shard, "now": now})
    candidates = await _fetch_all(db, deps, due, now, report)

    # 2. processed-URL lookup, in bulk: the Redis set first, then the database
    urls = list(candidates)
    seen: set[str] = set()
    redis = deps.redis  # per run: one run's Redis trouble does not switch it off for the next
    if redis is not None and urls:
        try:
            flags = await redis.smismember(PROCESSED_SET, urls)
            seen.update(u for u, hit in zip(urls, flags, strict=True) if hit)
        except Exception as exc:  # Redis went away mid-run: the database still knows
            warning("worker.redis.unavailable", error=describe_error(exc))
            redis, report.redis_enabled = None, False
    rest = [u for u in urls if u not in seen]
    if rest:
        seen.update(r["url"] for r in await db.fetch(SQL["processed_urls"], {"urls": rest}))
    queued = {u: candidates[u] for u in urls if u not in seen}

    # 3. queue visibility
    report.queued_count = len(queued)
    by_source = Counter(f"{src['name']} ({src['shard']})" for src, _ in queued.values())
    report.queued_by_source = dict(by_source)

    # 4. the article count (telemetry: a failure is reported and the run goes on)
    try:
        row = await db.fetch_one(SQL["article_count"])
    except QueryError as exc:
        report.backpressure_db_article_count_error = describe_error(exc)
        warning("worker.backpressure.db_count_failed", error=describe_error(exc))
    else:
        try:
            report.backpressure_db_article_count = int(row["n"])  # type: ignore[index]
        except (TypeError, ValueError) as exc:
            report.backpressure_db_article_count_error = f"not a count: {row!r}"
            warning("worker.backpressure.db_count_parse_failed", error=describe_error(exc))

    # 5. backpressure, before anything expensive
    if report.queued_count > settings.ingestion_backpressure_queue_limit:
        report.deferred_reasons.append(
            f"queue limit: {report.queued_count} queued > "
            f"INGESTION_BACKPRESSURE_QUEUE_LIMIT {settings.ingestion_backpressure_queue_limit}"
        )
    count = report.backpressure_db_article_count
    if count is not None and count >= settings.ingestion_backpressure_db_article_limit:
        report.deferred_reasons.append(
            f"database limit: {count} articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT "
            f"{settings.ingestion_backpressure_db_article_limit}"
        )
    if report.deferred_reasons:
        report.deferred_count = report.queued_count
        warning("worker.backpressure.deferred", shard=report.shard, reasons=report.deferred_reasons)
        return

    # 6. extend the lease before the expensive work (holder-only; replaces the TTL)
    if not await deps.leases.extend(lease, settings.worker_lock_ttl_seconds):
        warning("worker.redis.worker_lock_extend_failed", shard=report.shard)
        report.deferred_count = report.queued_count
        report.deferred_reasons.append("the shard lease was lost before the expensive steps")
        return

    # 7. image hydration (items without a feed image), and the no-thumbnail retries
    to_process = list(queued.items())[: settings.max_ai_reviews]
    report.deferred_count = max(0, len(queued) - len(to_process))
    if report.deferred_count:
        report.deferred_reasons.append(f"MAX_AI_REVIEWS {settings.max_ai_reviews} reached")
    images = await _hydrate(deps, [u for u, (_, item) in to_process if not item.image_url])
    report.retried_count = await _retry_thumbnails(db, deps, report.shard, now)

    # 8-9. per-article review locks (claimed in bulk), review and translation
    names = {
        url: "news:review:" + hashlib.sha256(url.encode()).hexdigest()[:32] for url, _ in to_process
    }
    locks = await deps.leases.acquire_many(
        list(names.values()), settings.ai_review_lock_ttl_seconds
    )
    try:
        held = [(u, pair) for u, pair in to_process if names[u] in locks]
        report.redis_ai_review_lock_skipped_count += len(to_process) - len(held)
        # Processed since our look-up (another shard, a run whose lease ran out)? Skip it: the
        # review lock only says nobody is reviewing it *now*.
        done = (
            {
                r["url"]
                for r in await db.fetch(SQL["processed_urls"], {"urls": [u for u, _ in held]})
            }
            if held
            else set()
        )
        verdicts: list[tuple[str, dict[str, Any], FeedItem, Verdict | None, str | None]] = []
        last_extend = time.monotonic()
        for url, (source, item) in held:
            if url in done:
                continue
            if time.monotonic() - last_extend > settings.worker_lock_ttl_seconds / 3:
                # a long review batch keeps its shard lease alive
                if not await deps.leases.extend(lease, settings.worker_lock_ttl_seconds):
                    warning("worker.redis.worker_lock_extend_failed", shard=report.shard)
                    break
                last_extend = time.monotonic()
            verdict, translation, transient = await _review(deps.reviewer, item, report)
            if transient:
                continue  # not written, so not "processed": the next run reviews it again
            verdicts.append((url, source, item, verdict, translation))

        # 10. writes, fenced
        written = await _write(db, lease, report.shard, verdicts, images, now)
    finally:
        await deps.leases.release_many(list(locks.values()))
    report.processed_count = len(written)
    if redis is not None and written:
        try:
            await redis.sadd(PROCESSED_SET, *written)
        except Exception as exc:
            warning("worker.redis.unavailable", error=describe_error(exc))
            report.redis_enabled = False

    # 10b. the translation backlog (earlier summaries whose translation failed), under the same
    # lease, extended first
    if deps.reviewer.translation_enabled:
        await _translate_backlog(
            db, deps, lease, report, settings.max_ai_reviews, settings.worker_lock_ttl_seconds
        )

    # 11. the public snapshot — only while this holder's fence is still the newest
    if (
        await db.fetch_one(SQL["claim_fence"], {"shard": report.shard, "fence": lease.fence})
        is None
    ):
        raise StaleLease(f"shard {report.shard}: a newer lease holder has written")
    latest = await db.fetch(SQL["snapshot"], {"shard": report.shard, "limit": SNAPSHOT_SIZE})
    document = {"shard": report.shard, "generatedAt": now.isoformat(), "articles": latest}
    await runtime.store.put(
        f"news/snapshots/{report.shard}.json", json.dumps(document, default=str).encode()
    )


async def _write(
    db: Database,
    lease: Lease,
    shard: str,
    verdicts: list[tuple[str, dict[str, Any], FeedItem, Verdict | None, str | None]],
    images: dict[str, str],
    now: datetime,
) -> list[str]:
    """One transaction, fenced, two bulk statements: a holder whose lease expired (and whose
    shard a newer holder has since written) gets StaleLease and writes nothing."""
    if not verdicts:
        return []
    async with db.transaction() as tx:
        fenced = await tx.fetch_one(SQL["claim_fence"], {"shard": shard, "fence": lease.fence})
        if fenced is None:
            raise StaleLease(f"shard {shard}: a newer lease holder has written")
        rows = await tx.fetch(
            SQL["insert_articles"],
            {
                "shard": shard,
                "fence": lease.fence,
                "now": now,
                "urls": [v[0] for v in verdicts],
                "source_ids": [v[1]["id"] for v in verdicts],
                "titles": [v[2].title or v[0] for v in verdicts],
                "summaries": [v[2].summary for v in verdicts],
                "images": [v[2].image_url or images.get(v[0]) for v in verdicts],
                "published": [v[2].published for v in verdicts],
                "statuses": [
                    "unreviewed" if v[3] is None else ("accepted" if v[3].accepted else "rejected")
                    for v in verdicts
                ],
            },
        )
        ids = {r["url"]: r["id"] for r in rows}
        reviewed = [v for v in verdicts if v[3] is not None and v[0] in ids]
        if reviewed:
            await tx.execute(
                SQL["insert_reviews"],
                {
                    "now": now,
                    "article_ids": [ids[v[0]] for v in reviewed],
                    "reviewers": [v[3].reviewer for v in reviewed if v[3] is not None],
                    "accepted": [v[3].accepted for v in reviewed if v[3] is not None],
                    "reasons": [json_param(v[3].reasons) for v in reviewed if v[3] is not None],
                    "summaries": [v[3].summary for v in reviewed if v[3] is not None],
                    "translations": [v[4] for v in reviewed],
                },
            )
    return [v[0] for v in verdicts if v[0] in ids]


async def _translate_backlog(
    db: Database, deps: NewsDeps, lease: Lease, report: NewsReport, limit: int, ttl: int
) -> None:
    backlog = await db.fetch(SQL["translation_backlog"], {"shard": report.shard, "limit": limit})
    if not backlog:
        return
    if not await deps.leases.extend(lease, ttl):
        warning("worker.redis.translation_lock_extend_failed", shard=report.shard)
        return
    for row in backlog:
        try:
            text = await deps.reviewer.translate(row["summary"], TRANSLATION_LANGUAGE)
        except ReviewError as exc:
            warning("worker.translation_failed", article_id=row["article_id"], error=str(exc))
            continue
        if text:
            await db.execute(
                SQL["set_translation"], {"article_id": row["article_id"], "translation": text}
            )
            report.translated_count += 1


async def _fetch_all(
    db: Database, deps: NewsDeps, due: list[dict[str, Any]], now: datetime, report: NewsReport
) -> dict[str, tuple[dict[str, Any], FeedItem]]:
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(source: dict[str, Any]) -> tuple[dict[str, Any], FetchResult]:
        async with gate:
            try:
                return source, await fetch_feed(
                    deps.http,
                    source["feed_url"],
                    now,
                    etag=source["etag"],
                    last_modified=source["last_modified"],
                )
            except Exception as exc:  # one source never takes the others' results with it
                return source, FetchResult(outcome="failed", error=describe_error(exc))

    candidates: dict[str, tuple[dict[str, Any], FeedItem]] = {}
    for source, result in await asyncio.gather(*(one(s) for s in due)):
        try:
            await news_sources.record_fetch(db, source, result, now)
        except Exception as exc:
            report.fetch_errors.append({"source": source["name"], "error": describe_error(exc)})
            continue
        if result.outcome in ("failed", "retry_later"):
            report.fetch_errors.append({"source": source["name"], "error": result.error})
        for item in result.items:
            candidates.setdefault(item.url, (source, item))
    return candidates


async def _hydrate(deps: NewsDeps, urls: list[str]) -> dict[str, str]:
    gate = asyncio.Semaphore(HYDRATE_CONCURRENCY)

    async def one(url: str) -> tuple[str, str | None]:
        async with gate:
            image, _ = await hydrate_image(deps.http, url, allowed_hosts=deps.allowed_image_hosts)
            return url, image

    return {u: i for u, i in await asyncio.gather(*(one(u) for u in urls)) if i}


async def _retry_thumbnails(db: Database, deps: NewsDeps, shard: str, now: datetime) -> int:
    rows = await db.fetch(
        SQL["retry_candidates"],
        {
            "shard": shard,
            "now": now,
            "retry_age_seconds": NO_THUMBNAIL_RETRY_AGE_SECONDS,
            "limit": NO_THUMBNAIL_RETRY_MAX,
        },
    )
    if rows:
        await db.execute(
            SQL["mark_thumbnail_attempts"], {"now": now, "ids": [r["id"] for r in rows]}
        )
    found = await _hydrate(deps, [r["url"] for r in rows])
    for row in rows:
        if row["url"] in found:
            await db.execute(SQL["set_image"], {"id": row["id"], "image_url": found[row["url"]]})
    return len(rows)


async def _review(
    reviewer: Reviewer, item: FeedItem, report: NewsReport
) -> tuple[Verdict | None, str | None, bool]:
    """(verdict, translation, transient failure). A permanent failure writes the article as
    unreviewed; a transient one (429, 5xx, network) leaves it for the next run."""
    try:
        verdict = await reviewer.review(
            Article(url=item.url, title=item.title, summary=item.summary)
        )
    except ReviewError as exc:
        warning("worker.ai_review_failed", url=item.url, error=str(exc), transient=exc.transient)
        return None, None, exc.transient
    report.ai_reviewed_count += 1
    if verdict.accepted:
        report.accepted_count += 1
    else:
        report.rejected_count += 1
    translation = None
    if verdict.accepted and reviewer.translation_enabled and verdict.summary:
        try:
            translation = await reviewer.translate(verdict.summary, TRANSLATION_LANGUAGE)
        except ReviewError as exc:
            warning("worker.translation_failed", url=item.url, error=str(exc))
    return verdict, translation, False


@asynccontextmanager
async def open_news_deps(runtime: Runtime, clock: Clock) -> AsyncIterator[NewsDeps]:
    """Redis when REDIS_URL is set and answers (else PostgreSQL leases, ``redisEnabled:
    false``), one HTTP client, and the reviewer the configuration names."""
    settings = runtime.settings
    redis: Any = None
    if settings.redis_url:
        import redis.asyncio as aioredis

        client = aioredis.from_url(  # type: ignore[no-untyped-call]
            settings.redis_url, socket_connect_timeout=2, socket_timeout=5
        )
        try:
            await client.ping()
            redis = client
        except Exception as exc:
            warning("worker.redis.unavailable", error=describe_error(exc))
            await client.aclose()
    leases: Leases = RedisLeases(redis) if redis is not None else PostgresLeases(runtime.db, clock)
    try:
        async with new_client() as http:
            yield NewsDeps(
                leases=leases, http=http, reviewer=make_reviewer(settings, http), redis=redis
            )
    finally:
        if redis is not None:
            await redis.aclose()


def news_schedules(runtime: Runtime, clock: Clock, deps: NewsDeps) -> tuple[Schedule, ...]:
    """One schedule per NEWS_SHARDS entry, every NEWS_RUN_INTERVAL_MINUTES; each slot is
    claimed in the run history (one replica runs it) and the shard lease guards the rest."""
    minutes = runtime.settings.news_run_interval_minutes
    cron = "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"

    def runner_for(shard: str) -> Callable[[datetime], Awaitable[bool]]:
        lane = f"news:{shard}"

        async def run(slot: datetime) -> bool:
            run_id = await runs.claim_slot(runtime.db, lane=lane, slot=slot, now=clock.now())
            if run_id is None:
                return False
            try:
                report = await run_shard(runtime, clock, deps, shard, trigger="scheduled")
            except Exception as exc:
                await runs.finish(
                    runtime.db,
                    run_id,
                    status="failed",
                    now=clock.now(),
                    report={"error": describe_error(exc)},
                )
                raise
            await runs.finish(
                runtime.db, run_id, status="completed", now=clock.now(), report=report.to_json()
            )
            return True

        return run

    return tuple(
        Schedule(lane=f"news:{shard}", cron=cron, runner=runner_for(shard))
        for shard in runtime.settings.news_shard_list
    )


async def latest_reports(db: Database) -> list[dict[str, Any]]:
    rows = await db.fetch(SQL["latest_reports"])
    return [
        {
            "shard": r["shard"],
            "trigger": r["trigger"],
            "startedAt": r["started_at"].isoformat(),
            "report": r["report"],
        }
        for r in rows
    ]
