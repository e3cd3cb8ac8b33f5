"""One news run of one shard, in spec 001's order.

lock → fetch RSS candidates → processed-URL lookup (Redis set + database, in bulk) → hold
the new candidates (with each source's fetch state, in one transaction) → queued counts by
source and shard → article count → backpressure check → extend the lease → image hydration →
per-article AI review locks → review + translation → writes (fenced) → snapshot → report.
When the queue or the database is over its limit the run stops before the first expensive
step and saves a lightweight report that says why. Whatever a run does not write stays held in
``news.candidates`` (``news/candidates.py``) and goes first next time: deferred means later.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from nightcrew.adapters.addresses import AddressPolicy
from nightcrew.adapters.locks import Lease, LeaseBackendDown, Leases, with_fallback
from nightcrew.adapters.news import NewsAdapters
from nightcrew.adapters.processed import ProcessedUrls, ProcessedUrlsDown
from nightcrew.adapters.reviewer import (
    Article,
    OfflineReviewer,
    Reviewer,
    ReviewError,
    Verdict,
)
from nightcrew.adapters.storage import ObjectStore
from nightcrew.clock import Clock
from nightcrew.db.database import Database, QueryError, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, event, warning
from nightcrew.news import candidates as held_candidates
from nightcrew.news import sources as news_sources
from nightcrew.news.candidates import Candidate
from nightcrew.news.candidates import refused_for_its_data as refused_for_its_data
from nightcrew.news.fetch import (
    FeedItem,
    FeedRules,
    FetchResult,
    ItemLimits,
    fetch_feed,
)
from nightcrew.news.images import hydrate_image
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

FETCH_CONCURRENCY = 16
HYDRATE_CONCURRENCY = 8
NO_THUMBNAIL_RETRY_AGE_SECONDS = 6 * 3600
NO_THUMBNAIL_RETRY_MAX = 20
SNAPSHOT_SIZE = 50
MAX_REVIEW_ATTEMPTS = 5
TRANSLATION_LANGUAGE = "English"

Trigger = Literal["manual", "scheduled"]


class StaleLease(NightcrewError):
    """A newer holder of the shard has written: this run's writes are refused."""


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
    # who gave the verdicts counted in aiReviewedCount: "model" or "offline rules" (no AI)
    reviewer: str = "model"
    skipped: bool = False
    fetch_errors: list[dict[str, Any]] = field(default_factory=list)
    # items a feed listed but that cannot be kept (a link too long, not http(s), none):
    # {"source", "reason", "count"} — not fetch errors: they never park a source
    dropped_items: list[dict[str, Any]] = field(default_factory=list)
    write_errors: list[dict[str, Any]] = field(default_factory=list)
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
            "reviewer": self.reviewer,
            "fetchErrors": self.fetch_errors,
            "writeErrors": self.write_errors,
            "droppedItems": self.dropped_items,
            "durationMs": self.duration_ms,
        }


def _hold_error(exc: QueryError) -> str:
    return f"could not hold its items: {describe_error(exc)}"


def shard_lock_name(shard: str) -> str:
    return f"news:shard:{shard}"


def review_lock_name(url: str) -> str:
    """One article's review lock: the inline run's and the pipeline's review stage's alike, so
    the two never review the same article at once (while an operator switches modes)."""
    return "news:review:" + hashlib.sha256(url.encode()).hexdigest()[:32]


async def run_shard(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: Trigger = "manual"
) -> NewsReport:
    started = time.perf_counter()
    settings = runtime.settings
    deps = runtime.news_adapters()
    report = NewsReport(
        shard=shard,
        trigger=trigger,
        redis_enabled=deps.redis_configured,
        reviewer="offline rules" if isinstance(deps.reviewer, OfflineReviewer) else "model",
        backpressure_queue_limit=settings.ingestion_backpressure_queue_limit,
        backpressure_db_article_limit=settings.ingestion_backpressure_db_article_limit,
    )
    name, ttl = shard_lock_name(shard), settings.worker_lock_ttl_seconds
    leases, lease = await with_fallback(
        deps.leases,
        deps.fallback_leases,
        lambda backend: backend.acquire(name, ttl),
        lambda exc: _redis_failed(report, exc),
    )
    if lease is None:
        report.skipped, report.locked_count = True, 1
        report.deferred_count = await held_candidates.count_held(runtime.db, shard)
        report.deferred_reasons.append("another run holds this shard's lock")
        (event if trigger == "manual" else warning)(
            "worker.shard_locked", shard=shard, trigger=trigger
        )
        report = _finish(report, started)
        await _save(runtime.db, report, clock)
        return report
    # The fence comes from the shard's own counter, whichever backend granted the lease: every
    # new holder draws a higher one, so an older holder (of either backend) is fenced out.
    row = await runtime.db.fetch_one(SQL["draw_fence"], {"shard": shard})
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always yields the row
    lease = replace(lease, fence=int(row["fence"]))
    work = _Run(
        runtime=runtime,
        clock=clock,
        deps=deps,
        leases=leases,
        lease=lease,
        report=report,
        processed=deps.processed if report.redis_enabled else deps.fallback_processed,
    )
    try:
        await work.run()
    finally:
        await leases.release(lease)
    report = _finish(report, started)
    await _save(runtime.db, report, clock)
    event(
        "worker.run_completed",
        **{k: v for k, v in report.to_json().items() if isinstance(v, int | bool | str)},
    )
    return report


def _redis_failed(report: NewsReport, exc: LeaseBackendDown | ProcessedUrlsDown) -> None:
    """Redis failed a call: this run says so (``redisEnabled: false``) and goes on with the
    PostgreSQL leases and processed set its adapters provide (spec 001)."""
    warning("worker.redis.unavailable", error=str(exc))
    report.redis_enabled = False


async def _save(db: Database, report: NewsReport, clock: Clock) -> None:
    await db.execute(
        SQL["save_report"],
        {
            "shard": report.shard,
            "trigger": report.trigger,
            "now": clock.now(),
            "report": json_param(report.to_json()),
        },
    )


def _finish(report: NewsReport, started: float) -> NewsReport:
    report.duration_ms = round((time.perf_counter() - started) * 1000, 1)
    return report


@dataclass(frozen=True, slots=True)
class Reviewed:
    """A candidate after review: its verdict (None: the model failed for good — written as
    unreviewed) and, for an accepted one, the translation of its summary."""

    candidate: Candidate
    verdict: Verdict | None
    translation: str | None

    @property
    def url(self) -> str:
        return self.candidate.url

    @property
    def status(self) -> str:
        if self.verdict is None:
            return "unreviewed"
        return "accepted" if self.verdict.accepted else "rejected"


Verdicts = list[Reviewed]


@dataclass(kw_only=True)
class _Run:
    """One run of one shard, holding ``lease`` (from ``leases``: Redis, or PostgreSQL when
    Redis failed)."""

    runtime: Runtime
    clock: Clock
    deps: NewsAdapters
    leases: Leases
    lease: Lease
    report: NewsReport
    processed: ProcessedUrls  # Redis's set while it answers this run, then PostgreSQL's

    async def run(self) -> None:
        """Spec 001's order, one named step each."""
        now = self.clock.now()
        await held_candidates.adopt_queued(self.runtime.db, self.report.shard, now)
        await self._fetch_and_hold(now)
        await self._count_articles()
        retries = await self._thumbnail_retries(now)
        if await self._stopped_before_expensive_work():
            return
        await self._process(retries, now)
        if self.deps.reviewer.translation_enabled:
            await self._translate_backlog()
        await self._publish_snapshot(now)

    async def _extend(self) -> bool:
        """The shard lease extended (holder-only, the TTL replaced); False when it is lost —
        and when Redis cannot be reached to say, which this run then reports."""
        try:
            return await self.leases.renew(
                self.lease, self.runtime.settings.worker_lock_ttl_seconds
            )
        except LeaseBackendDown as exc:
            _redis_failed(self.report, exc)
            return False

    async def _seen(self, urls: list[str]) -> set[str]:
        try:
            return await self.processed.seen(urls)
        except ProcessedUrlsDown as exc:  # Redis went away mid-run: the database still knows
            _redis_failed(self.report, exc)
            self.processed = self.deps.fallback_processed
            return await self.processed.seen(urls)

    async def _translate_backlog(self) -> None:
        """Summaries whose translation failed, under the same lease, extended first."""
        db, report = self.runtime.db, self.report
        backlog = await db.fetch(
            SQL["translation_backlog"],
            {"shard": report.shard, "limit": self.runtime.settings.max_ai_reviews},
        )
        if not backlog:
            return
        if not await self._extend():
            warning("worker.redis.translation_lock_extend_failed", shard=report.shard)
            return
        for row in backlog:
            try:
                text = await self.deps.reviewer.translate(row["summary"], TRANSLATION_LANGUAGE)
            except ReviewError as exc:
                warning("worker.translation_failed", article_id=row["article_id"], error=str(exc))
                continue
            if text:
                await db.execute(
                    SQL["set_translation"], {"article_id": row["article_id"], "translation": text}
                )
                report.translated_count += 1

    async def _fetch_and_hold(self, now: datetime) -> None:
        """Fetch every due source; look the URLs up in the Redis processed set (the database
        looks as they are held); hold what is new with each source's fetch state; count the
        shard's queue by source."""
        db, deps, report = self.runtime.db, self.deps, self.report
        due = await db.fetch(news_sources.SQL["due_sources"], {"shard": report.shard, "now": now})
        fetched = await _fetch_all(deps, feed_rules(self.runtime.settings, deps.policy), due, now)
        seen = await self._seen([i.url for _, r in fetched for i in r.items])
        await self._hold(
            [(src, r, [i for i in r.items if i.url not in seen]) for src, r in fetched], now
        )
        report.queued_by_source = await held_candidates.held_by_source(db, report.shard)
        report.queued_count = sum(report.queued_by_source.values())

    async def _thumbnail_retries(self, now: datetime) -> list[dict[str, Any]]:
        """Accepted articles still without a thumbnail, due another try — counted before the
        backpressure stop (``retriedCount``), tried only if the run goes on."""
        retries = await self.runtime.db.fetch(
            SQL["retry_candidates"],
            {
                "shard": self.report.shard,
                "now": now,
                "retry_age_seconds": NO_THUMBNAIL_RETRY_AGE_SECONDS,
                "limit": NO_THUMBNAIL_RETRY_MAX,
            },
        )
        self.report.retried_count = len(retries)
        return retries

    async def _stopped_before_expensive_work(self) -> bool:
        """Backpressure, then the lease extended (holder-only; the TTL replaced): either
        failing stops the run here, every candidate held with the reason."""
        report = self.report
        if self._pressure():
            report.deferred_count = report.queued_count
            await self._defer_all_but([], "; ".join(report.deferred_reasons))
            warning(
                "worker.backpressure.deferred", shard=report.shard, reasons=report.deferred_reasons
            )
            return True
        if not await self._extend():
            warning("worker.redis.worker_lock_extend_failed", shard=report.shard)
            report.deferred_count = report.queued_count
            report.deferred_reasons.append("the shard lease was lost before the expensive steps")
            await self._defer_all_but([], report.deferred_reasons[-1])
            return True
        return False

    async def _process(self, retries: list[dict[str, Any]], now: datetime) -> list[str]:
        """The held candidates, oldest first up to MAX_AI_REVIEWS (what earlier runs deferred
        goes before the new): image hydration, the no-thumbnail retries, review locks, review
        and translation, fenced writes. The URLs written."""
        db, report, settings = self.runtime.db, self.report, self.runtime.settings
        to_process = await held_candidates.held(db, report.shard, settings.max_ai_reviews)
        if report.queued_count > len(to_process):
            report.deferred_reasons.append(f"MAX_AI_REVIEWS {settings.max_ai_reviews} reached")
            await self._defer_all_but([c.url for c in to_process], report.deferred_reasons[-1])
        images = await _hydrate(self.deps, [c.url for c in to_process if not c.item.image_url])
        await _retry_thumbnails(db, self.deps, retries, now)
        written = await self._review_and_write(to_process, images)
        report.deferred_count = await held_candidates.count_held(db, report.shard)
        if written:
            try:
                await self.processed.add(written)
            except ProcessedUrlsDown as exc:  # the articles are written: that is the record
                _redis_failed(report, exc)
                self.processed = self.deps.fallback_processed
        return written

    async def _publish_snapshot(self, now: datetime) -> None:
        """The public snapshot — only while this holder's fence is still the newest."""
        db, report = self.runtime.db, self.report
        fence = {"shard": report.shard, "fence": self.lease.fence}
        if await db.fetch_one(SQL["claim_fence"], fence) is None:
            raise StaleLease(f"shard {report.shard}: a newer lease holder has written")
        await publish_snapshot(db, self.runtime.store, report.shard, now)

    async def _hold(
        self, fetched: list[tuple[dict[str, Any], FetchResult, list[FeedItem]]], now: datetime
    ) -> None:
        """Failures recorded one by one (each may park its source); successes and their new
        items in one transaction — or, if the database refuses that, source by source and
        then item by item, so only an item the database cannot store is lost (reported in
        ``writeErrors``)."""
        report, db = self.report, self.runtime.db
        for source, result, _ in fetched:
            if result.outcome in ("failed", "retry_later"):
                report.fetch_errors.append({"source": source["name"], "error": result.error})
                await news_sources.record_fetch(db, source, result, now)
            for reason, count in result.dropped.items():
                report.dropped_items.append(
                    {"source": source["name"], "reason": reason, "count": count}
                )
        try:
            await held_candidates.record_and_hold(db, report.shard, fetched, now)
            return
        except QueryError as exc:
            warning("worker.hold_batch_failed", shard=report.shard, error=describe_error(exc))
        for source, result, items in fetched:
            try:
                await held_candidates.record_and_hold(
                    db, report.shard, [(source, result, items)], now
                )
            except QueryError as exc:
                warning("worker.hold_source_failed", source=source["name"], error=str(exc))
                await self._hold_one_by_one(source, result, items, now)

    async def _hold_one_by_one(
        self, source: dict[str, Any], result: FetchResult, items: list[FeedItem], now: datetime
    ) -> None:
        """Each item in its own statement; the fetch state last, and only when every item is
        held or refused for its own data — a failure that is nobody's item (a timeout, a full
        disk) leaves the state unsaved, so the next run fetches the items again."""
        report, db = self.report, self.runtime.db
        for item in items:
            try:
                await held_candidates.hold(db, report.shard, [(source["id"], item)], now)
            except QueryError as exc:
                if not refused_for_its_data(exc):
                    self._hold_failed(source, exc)
                    await news_sources.record_fetch(
                        db, source, FetchResult(outcome="failed", error=_hold_error(exc)), now
                    )
                    return
                report.write_errors.append({"url": item.url, "error": describe_error(exc)})
                warning("worker.hold_rejected", url=item.url, error=describe_error(exc))
        try:
            await held_candidates.record(db, [(source, result, items)], now)
        except QueryError as exc:  # its items are held; only the 304 is lost: fetched again
            self._hold_failed(source, exc)

    def _hold_failed(self, source: dict[str, Any], exc: QueryError) -> None:
        self.report.fetch_errors.append({"source": source["name"], "error": _hold_error(exc)})

    async def _count_articles(self) -> None:
        report = self.report
        try:
            row = await self.runtime.db.fetch_one(SQL["article_count"])
        except QueryError as exc:
            report.backpressure_db_article_count_error = describe_error(exc)
            warning("worker.backpressure.db_count_failed", error=describe_error(exc))
            return
        try:
            report.backpressure_db_article_count = int(row["n"])  # type: ignore[index]
        except (TypeError, ValueError) as exc:
            report.backpressure_db_article_count_error = f"not a count: {row!r}"
            warning("worker.backpressure.db_count_parse_failed", error=describe_error(exc))

    def _pressure(self) -> bool:
        report, settings = self.report, self.runtime.settings
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
        return bool(report.deferred_reasons)

    async def _defer_all_but(self, taken: list[str], reason: str) -> None:
        await held_candidates.defer_all_but(
            self.runtime.db, self.report.shard, taken, reason, self.clock.now()
        )

    async def _defer(self, queue: list[Candidate], reason: str, *, attempted: bool = False) -> None:
        await held_candidates.defer(
            self.runtime.db, [c.url for c in queue], reason, self.clock.now(), attempted=attempted
        )

    async def _review_locks(self, names: list[str], ttl: float) -> tuple[Leases, dict[str, Lease]]:
        return await with_fallback(
            self.leases,
            self.deps.fallback_leases,
            lambda backend: backend.acquire_many(names, ttl),
            lambda exc: _redis_failed(self.report, exc),
        )

    async def _review_and_write(
        self, to_process: list[Candidate], images: dict[str, str]
    ) -> list[str]:
        db, deps, report, settings = self.runtime.db, self.deps, self.report, self.runtime.settings
        names = {c.url: review_lock_name(c.url) for c in to_process}
        lock_leases, locks = await self._review_locks(
            list(names.values()), settings.ai_review_lock_ttl_seconds
        )
        try:
            held = [c for c in to_process if names[c.url] in locks]
            report.redis_ai_review_lock_skipped_count += len(to_process) - len(held)
            await self._defer(
                [c for c in to_process if names[c.url] not in locks],
                "another run is reviewing it",
            )
            # Processed since our look-up (another shard, a run whose lease ran out)? Drop it:
            # the review lock only says nobody is reviewing it *now*.
            done = (
                {
                    r["url"]
                    for r in await db.fetch(SQL["processed_urls"], {"urls": [c.url for c in held]})
                }
                if held
                else set()
            )
            await held_candidates.drop(db, sorted(done))
            verdicts: Verdicts = []
            transient: list[Candidate] = []
            last_extend = time.monotonic()
            pending = [c for c in held if c.url not in done]
            for index, candidate in enumerate(pending):
                if candidate.reviewed:  # the pipeline's review stage judged it already
                    verdicts.append(Reviewed(candidate, candidate.verdict, candidate.translation))
                    continue
                if time.monotonic() - last_extend > settings.worker_lock_ttl_seconds / 3:
                    # a long review batch keeps its shard lease alive
                    if not await self._extend():
                        warning("worker.redis.worker_lock_extend_failed", shard=report.shard)
                        report.deferred_reasons.append("the shard lease was lost during review")
                        await self._defer(pending[index:], report.deferred_reasons[-1])
                        break
                    last_extend = time.monotonic()
                verdict, translation, failed_for_now = await _review(
                    deps.reviewer, candidate.item, report
                )
                if failed_for_now and candidate.attempts + 1 < MAX_REVIEW_ATTEMPTS:
                    transient.append(candidate)  # held: the next run reviews it again
                    continue
                # (a model that failed for it MAX_REVIEW_ATTEMPTS runs in a row: written as
                # unreviewed, so one article cannot take a review slot of every run forever)
                verdicts.append(Reviewed(candidate, verdict, translation))
            if transient:
                report.deferred_reasons.append(
                    f"{len(transient)} reviews failed for now; retried next run"
                )
                await self._defer(transient, "the model failed for now", attempted=True)

            # 10. writes, fenced
            written = await _write(db, self.lease, report, verdicts, images, self.clock.now())
        finally:
            await lock_leases.release_many(list(locks.values()))
        report.processed_count = len(written)
        return written


async def publish_snapshot(db: Database, store: ObjectStore, shard: str, now: datetime) -> None:
    """The shard's public snapshot: its newest accepted articles."""
    latest = await db.fetch(SQL["snapshot"], {"shard": shard, "limit": SNAPSHOT_SIZE})
    document = {"shard": shard, "generatedAt": now.isoformat(), "articles": latest}
    await store.put(f"news/snapshots/{shard}.json", json.dumps(document, default=str).encode())


def feed_rules(settings: Any, policy: AddressPolicy) -> FeedRules:
    return FeedRules(
        policy=policy,
        budget_seconds=settings.news_fetch_budget_seconds,
        limits=ItemLimits(
            title_chars=settings.news_max_title_chars,
            summary_chars=settings.news_max_summary_chars,
        ),
    )


async def _write(
    db: Database,
    lease: Lease,
    report: NewsReport,
    verdicts: Verdicts,
    images: dict[str, str],
    now: datetime,
) -> list[str]:
    """Fenced writes, in one transaction when they all go in; when the batch is refused, one
    transaction per article, so only the article the database cannot store is rejected (and
    reported with the reason). A holder whose lease expired (and whose shard a newer holder
    has since written) gets StaleLease and writes nothing."""
    if not verdicts:
        return []
    try:
        return await _write_batch(db, lease, report.shard, verdicts, images, now)
    except QueryError as exc:
        warning("worker.write_batch_failed", shard=report.shard, error=describe_error(exc))
    written: list[str] = []
    for verdict in verdicts:
        try:
            written += await _write_batch(db, lease, report.shard, [verdict], images, now)
        except QueryError as exc:
            url = verdict.url
            if not refused_for_its_data(exc):
                # a timeout, a deadlock, a full disk: not this article's fault — held, retried
                warning("worker.write_deferred", url=url, error=describe_error(exc))
                await held_candidates.defer(
                    db, [url], f"write failed for now: {describe_error(exc)}", now, attempted=True
                )
                continue
            report.write_errors.append({"url": url, "error": describe_error(exc)})
            warning("worker.write_rejected", url=url, error=describe_error(exc))
            await held_candidates.reject(db, url, describe_error(exc), now)
    return written


async def _write_batch(
    db: Database,
    lease: Lease,
    shard: str,
    verdicts: Verdicts,
    images: dict[str, str],
    now: datetime,
) -> list[str]:
    async with db.transaction() as tx:
        fenced = await tx.fetch_one(SQL["claim_fence"], {"shard": shard, "fence": lease.fence})
        if fenced is None:
            raise StaleLease(f"shard {shard}: a newer lease holder has written")
        ids = await insert_articles(tx, shard, lease.fence, verdicts, images, now)
        # written now, or already (ON CONFLICT): either way no longer a candidate
        await held_candidates.drop(tx, [r.url for r in verdicts])
    return [r.url for r in verdicts if r.url in ids]


async def insert_articles(
    tx: Tx, shard: str, fence: int, verdicts: Verdicts, images: dict[str, str], now: datetime
) -> dict[str, int]:
    """The articles (a URL already written is left as it is) and, for those written now, their
    reviews; {url: article id} of the articles written now."""
    items = [r.candidate.item for r in verdicts]
    rows = await tx.fetch(
        SQL["insert_articles"],
        {
            "shard": shard,
            "fence": fence,
            "now": now,
            "urls": [i.url for i in items],
            "source_ids": [r.candidate.source_id for r in verdicts],
            "titles": [i.title or i.url for i in items],
            "summaries": [i.summary for i in items],
            "images": [i.image_url or images.get(i.url) for i in items],
            "published": [i.published for i in items],
            "statuses": [r.status for r in verdicts],
        },
    )
    ids = {r["url"]: int(r["id"]) for r in rows}
    reviewed = [
        (ids[r.url], r.verdict, r.translation)
        for r in verdicts
        if r.verdict is not None and r.url in ids
    ]
    if reviewed:
        await tx.execute(
            SQL["insert_reviews"],
            {
                "now": now,
                "article_ids": [a for a, _, _ in reviewed],
                "reviewers": [v.reviewer for _, v, _ in reviewed],
                "accepted": [v.accepted for _, v, _ in reviewed],
                "reasons": json_param([v.reasons for _, v, _ in reviewed]),
                "summaries": [v.summary for _, v, _ in reviewed],
                "translations": [t for _, _, t in reviewed],
            },
        )
    return ids


async def _fetch_all(
    deps: NewsAdapters, rules: FeedRules, due: list[dict[str, Any]], now: datetime
) -> list[tuple[dict[str, Any], FetchResult]]:
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(source: dict[str, Any]) -> tuple[dict[str, Any], FetchResult]:
        async with gate:
            try:
                return source, await fetch_feed(
                    deps.http,
                    source["feed_url"],
                    now,
                    rules,
                    etag=source["etag"],
                    last_modified=source["last_modified"],
                    body_hash=source["body_hash"],
                )
            except Exception as exc:  # one source never takes the others' results with it
                return source, FetchResult(outcome="failed", error=describe_error(exc))

    return list(await asyncio.gather(*(one(s) for s in due)))


async def _hydrate(deps: NewsAdapters, urls: list[str]) -> dict[str, str]:
    gate = asyncio.Semaphore(HYDRATE_CONCURRENCY)

    async def one(url: str) -> tuple[str, str | None]:
        async with gate:
            image, _ = await hydrate_image(deps.http, url, deps.policy)
            return url, image

    return {u: i for u, i in await asyncio.gather(*(one(u) for u in urls)) if i}


async def _retry_thumbnails(
    db: Database, deps: NewsAdapters, rows: list[dict[str, Any]], now: datetime
) -> None:
    if not rows:
        return
    await db.execute(SQL["mark_thumbnail_attempts"], {"now": now, "ids": [r["id"] for r in rows]})
    found = await _hydrate(deps, [r["url"] for r in rows])
    for row in rows:
        if row["url"] in found:
            await db.execute(SQL["set_image"], {"id": row["id"], "image_url": found[row["url"]]})


async def review_item(
    reviewer: Reviewer, item: FeedItem
) -> tuple[Verdict | None, str | None, bool]:
    """(verdict, translation of an accepted one's summary, transient failure). A permanent
    failure means the article is written unreviewed; a transient one (429, 5xx, network)
    means try again later."""
    try:
        verdict = await reviewer.review(
            Article(url=item.url, title=item.title, summary=item.summary)
        )
    except ReviewError as exc:
        warning("worker.ai_review_failed", url=item.url, error=str(exc), transient=exc.transient)
        return None, None, exc.transient
    translation = None
    if verdict.accepted and reviewer.translation_enabled and verdict.summary:
        try:
            translation = await reviewer.translate(verdict.summary, TRANSLATION_LANGUAGE)
        except ReviewError as exc:
            warning("worker.translation_failed", url=item.url, error=str(exc))
    return verdict, translation, False


async def _review(
    reviewer: Reviewer, item: FeedItem, report: NewsReport
) -> tuple[Verdict | None, str | None, bool]:
    verdict, translation, transient = await review_item(reviewer, item)
    if verdict is not None:
        report.ai_reviewed_count += 1
        if verdict.accepted:
            report.accepted_count += 1
        else:
            report.rejected_count += 1
    return verdict, translation, transient


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
