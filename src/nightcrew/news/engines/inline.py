"""The inline engine: one news run of one shard, in one process, under the shard lease, calling
spec 001's steps in the spec's order.

lock → fetch RSS candidates → processed-URL lookup (Redis set + database, in bulk) → the new
candidates kept in memory → queued counts by source and shard → article count → backpressure
check → extend the lease → image hydration → per-article AI review locks → review +
translation (concurrently, within NEWS_AI_CONCURRENCY, the lease renewed meanwhile) → writes
(fenced) → each source's fetch state saved, with any of its candidates
not yet a row → snapshot → report.
When the database is over its article limit the run stops before the first expensive step and
saves a lightweight report that says why; over the queue limit it works through a bounded batch
of the backlog — at most the limit, oldest first (``admission.decide``) — and, with a model, at
most MAX_AI_REVIEWS model reviews of it (``review.within_budget``). Whatever a run does not
write stays held in ``news.candidates`` (``steps/candidates.py``) and goes first next time:
deferred means later. What it writes never becomes a row there: a new item is a row only once
the run knows it will not write it (deferred, failed for now, refused). The fetch state that
lets the next fetch skip an unchanged feed (ETag, Last-Modified, body hash) is saved only after
that, so a run that dies mid-way has saved none, and the next run fetches those feeds again.

The steps are their own modules (``fetch``, ``items``, ``admission``, ``hydrate``, ``review``,
``write``, ``snapshot``, ``leases``, ``report``), shared with the pipeline engine
(``engines/pipeline``); this module holds only the order, the shard lease, and the
report it fills as it goes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from nightcrew.adapters.locks import Lease, Leases
from nightcrew.adapters.news import NewsAdapters
from nightcrew.adapters.processed import ProcessedUrls, ProcessedUrlsDown
from nightcrew.adapters.reviewer import Spend, Verdict
from nightcrew.clock import Clock
from nightcrew.db.deadlines import statement_deadline
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, event, warning
from nightcrew.news.report import (
    SUPERSEDED_REASON,
    NewsReport,
    RedisUse,
    ReportDraft,
    Status,
    Trigger,
    count_spend,
    locked_report,
    save_report,
)
from nightcrew.news.sources import registry as news_sources
from nightcrew.news.steps import admission, hydrate, items, leases, review, snapshot, write
from nightcrew.news.steps import candidates as held_candidates
from nightcrew.news.steps.admission import Admission, ArticleCount
from nightcrew.news.steps.candidates import Candidate, Fetched
from nightcrew.news.steps.fetch import feed_rules, fetch_sources
from nightcrew.news.steps.review import REVIEW_FAILED_FOR_NOW, Reviewed, Verdicts
from nightcrew.runtime import Runtime

# a stopped run's bound on keeping the answers it already paid for (``_keep_on_stop``)
KEEP_ON_STOP_SECONDS = 5.0


async def run_shard(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: Trigger = "manual"
) -> NewsReport:
    started, began = time.perf_counter(), clock.now()
    deps = runtime.news_adapters()
    redis = RedisUse(deps)  # the process's Redis breaker, watched from now on
    draft = ReportDraft(runtime.settings, deps, shard=shard, trigger=trigger)
    lease = await leases.acquire_shard(deps.leases, runtime.settings, shard)
    if lease is None:
        report = await locked_report(
            runtime.db, draft, redis_enabled=redis.enabled(), duration_ms=_ms_since(started)
        )
        await save_report(runtime.db, started_at=began, report=report)
        return report
    # The fence comes from the shard's own counter (nightcrew's lease table keeps one per lease
    # name; the shard's counts every holder that ever wrote): a newer holder fences this out.
    lease = replace(lease, fence=await leases.draw_fence(runtime.db, shard))
    work = _Run(
        runtime=runtime,
        clock=clock,
        deps=deps,
        leases=deps.leases,
        lease=lease,
        draft=draft,
        redis=redis,
        processed=deps.processed if redis.configured else deps.fallback_processed,
    )
    status: Status = "completed"
    try:
        await work.run()
    except leases.StaleLease as exc:
        # fenced out: a newer holder of the shard's lease has written, and now owns the rest
        # of the shard's work. Not a failure: reported (and saved) as superseded.
        status = "superseded"
        warning("worker.run_superseded", shard=shard, error=str(exc))
        draft.defer(SUPERSEDED_REASON)
        draft.set(deferred_count=await held_candidates.count_held(runtime.db, shard))
    finally:
        await deps.leases.release(lease)
    draft.set(
        ai_prompt_tokens=work.spend.prompt_tokens,
        ai_completion_tokens=work.spend.completion_tokens,
    )
    report = draft.build(
        status=status, duration_ms=_ms_since(started), redis_enabled=redis.enabled()
    )
    await save_report(runtime.db, started_at=began, report=report)
    count_spend(runtime.metrics, report)
    event(
        "worker.run_completed",
        **{k: v for k, v in report.to_json().items() if isinstance(v, int | bool | str)},
    )
    return report


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


@dataclass(kw_only=True)
class _Run:
    """One run of one shard, holding ``lease`` (decided by PostgreSQL, ``leases``)."""

    runtime: Runtime
    clock: Clock
    deps: NewsAdapters
    leases: Leases
    lease: Lease
    draft: ReportDraft  # the run's report, filled as it goes and built once at the end
    redis: RedisUse  # whether Redis served the whole run
    processed: ProcessedUrls  # Redis's set while it answers this run, then PostgreSQL's
    # The new items this run fetched, held in memory until each is written, dropped (written
    # meanwhile) or stored as a row (``_store``: deferred, failed for now): a row is a promise
    # to process later, and most items are processed by the run that fetched them. The fetch
    # state of their sources (``fetched``) is saved by ``_settle``, after the writes, in one
    # transaction with whatever is still here; a run that dies first saved none, and the next
    # run fetches those feeds again.
    unstored: dict[str, Candidate] = field(default_factory=dict)
    fetched: list[Fetched] = field(default_factory=list)
    # when the run started: every row it stores is held as of then, as one hold would have
    # held them all (the shard's queue is oldest first, then in the order stored)
    started: datetime | None = None
    spend: Spend = field(default_factory=Spend)  # the model's tokens, this run's calls

    async def run(self) -> None:
        """Spec 001's order, one named step each."""
        now = self.started = self.clock.now()
        await held_candidates.adopt_queued(self.runtime.db, self.shard, now)
        await self._fetch(now)
        articles = await self._count_articles()
        retries = await self._thumbnail_retries(now)
        try:
            admitted = await self._admit(articles)
            if admitted is None:
                await self._settle(now)
                return
            await self._process(admitted, retries, now)
        except leases.StaleLease:
            await self._store_left()  # for the shard's new holder; the feeds are fetched again
            raise
        if self.deps.reviewer.translation_enabled:
            await self._translate_backlog()
        await self._publish_snapshot(now)

    @property
    def shard(self) -> str:
        return self.draft.report.shard

    def _redis_failed(self, exc: ProcessedUrlsDown) -> None:
        """Redis failed a call: this run says so (``redisEnabled: false``) and goes on with the
        PostgreSQL leases and processed set its adapters provide (spec 001)."""
        self.redis.failed(exc)

    async def _extend(self) -> bool:
        return await leases.extend_shard(self.leases, self.runtime.settings, self.lease)

    async def _translate_backlog(self) -> None:
        """Summaries whose translation failed, the shard lease extended before each."""
        db = self.runtime.db
        backlog = await review.translation_backlog(db, self.shard, self.runtime.settings)
        translated = await review.translate_backlog(
            db, self.deps.reviewer, backlog, still_held=self._extend, spend=self.spend
        )
        self.draft.add(translated_count=translated)

    async def _fetch(self, now: datetime) -> None:
        """Fetch every due source; look the URLs up in the Redis processed set and the
        database; keep what is new in memory (``unstored``); record the failed fetches; count
        the shard's queue by source — its held rows and this run's new items."""
        db, deps = self.runtime.db, self.deps
        due = await news_sources.due_sources(db, self.shard, now)
        rules = feed_rules(self.runtime.settings, deps.policy, deps.parsers)
        fetched = await fetch_sources(deps.http, rules, due, now)
        self.processed, fresh = await items.unseen(
            self.processed, deps.fallback_processed, fetched, self._redis_failed
        )
        failed = await items.record_failures(db, fresh, now)
        self.draft.extend(fetch_errors=failed.fetch_errors, dropped_items=failed.dropped_items)
        self.fetched = [f for f in fresh if f[1].outcome in ("ok", "not_modified")]
        known = await held_candidates.known(db, [i.url for _, _, new in self.fetched for i in new])
        self.unstored = {c.url: c for c in held_candidates.fetched_now(self.fetched, known)}
        queued = await held_candidates.held_by_source(db, self.shard)
        for candidate in self.unstored.values():
            queued[candidate.source_label] = queued.get(candidate.source_label, 0) + 1
        self.draft.set(queued_by_source=queued, queued_count=sum(queued.values()))

    async def _store(self, candidates: list[Candidate]) -> None:
        """In-memory candidates (taken out of ``unstored`` or the write's share of it) made
        rows, for a deferral, a rejection, a kept verdict: one the database refuses for its own
        data is lost and reported, as a hold loses it; one it cannot store for now goes back to
        memory, for ``_settle``."""
        if not candidates:
            return
        at = self.started or self.clock.now()
        stored = await items.store(self.runtime.db, self.shard, candidates, at)
        # (one the write was refused for is reported by the write already)
        reported = {e.url for e in self.draft.report.write_errors}
        self.draft.extend(write_errors=[e for e in stored.refused if e.url not in reported])
        for candidate in stored.not_stored:
            self.unstored[candidate.url] = candidate

    async def _store_urls(self, urls: list[str]) -> None:
        await self._store([self.unstored.pop(u) for u in urls if u in self.unstored])

    async def _store_left(self) -> None:
        """What is still in memory stored (best effort: the fetch state is not saved, so a
        failure here only means the feeds are read again)."""
        left, self.unstored = list(self.unstored.values()), {}
        try:
            await self._store(left)
        except NightcrewError as exc:
            warning("worker.store_failed", shard=self.shard, error=describe_error(exc))

    async def _settle(self, now: datetime) -> None:
        """Each successful fetch's state saved, with whatever of its new items is still in
        memory, in one transaction (``items.hold_fetched``): from now on a 304 or an
        unchanged body may hide them, so nothing may be left only in memory."""
        left = [
            (source, result, [i for i in new if i.url in self.unstored])
            for source, result, new in self.fetched
        ]
        self.unstored, self.fetched = {}, []
        held = await items.hold_fetched(self.runtime.db, self.shard, left, now)
        self.draft.extend(fetch_errors=held.fetch_errors, write_errors=held.write_errors)

    async def _count_articles(self) -> ArticleCount:
        count = await admission.count_articles(self.runtime.db)
        self.draft.set(
            backpressure_db_article_count=count.n, backpressure_db_article_count_error=count.error
        )
        return count

    async def _thumbnail_retries(self, now: datetime) -> list[hydrate.NoThumbnail]:
        """Accepted articles still without a thumbnail, due another try — counted before the
        backpressure stop (``retriedCount``), tried only if the run goes on."""
        retries = await hydrate.thumbnail_retries(self.runtime.db, self.shard, now)
        self.draft.set(retried_count=len(retries))
        return retries

    async def _admit(self, articles: ArticleCount) -> Admission | None:
        """Backpressure (``admission.decide``, the pipeline's rule with nothing in flight),
        then the lease extended (holder-only; the TTL replaced). The database over its limit,
        or the lease lost, stops the run here, every candidate held with the reason (None).
        The queue over its limit does not: the run takes a bounded batch of the backlog, the
        limit's worth, oldest first, and the rest wait behind it."""
        draft, queued = self.draft, self.draft.report.queued_count
        admitted = admission.decide_and_say(
            draft,
            self.runtime.settings,
            waiting=queued,
            load=0,
            articles=articles,
            shard=self.shard,
        )
        if admitted.reason is not None and admitted.room == 0:
            draft.set(deferred_count=queued)
            await self._defer_all_but([], admitted.reason)
            return None
        if not await self._extend():
            warning("worker.redis.worker_lock_extend_failed", shard=self.shard)
            lost = "the shard lease was lost before the expensive steps"
            draft.set(deferred_count=queued)
            draft.defer(lost)
            await self._defer_all_but([], lost)
            return None
        return admitted

    async def _process(
        self, admitted: Admission, retries: list[hydrate.NoThumbnail], now: datetime
    ) -> list[str]:
        """The admitted batch — the shard's held candidates, oldest first, then this run's new
        ones (what earlier runs deferred goes before the new) — within MAX_AI_REVIEWS model
        reviews: image hydration, the no-thumbnail retries, review locks, review and
        translation, fenced writes; then the fetch state saved (``_settle``). The URLs
        written."""
        db, settings = self.runtime.db, self.runtime.settings
        batch = await held_candidates.held(db, self.shard, admitted.room)
        # a new item that became a row since it was looked up (a holder whose lease ran out
        # deferred it) is that row: in the batch once
        for candidate in batch:
            self.unstored.pop(candidate.url, None)
        batch += list(self.unstored.values())[: admitted.room - len(batch)]
        if admitted.reason is not None:  # the backlog beyond the batch waits, with why
            await self._defer_all_but([c.url for c in batch], admitted.reason)
        # MAX_AI_REVIEWS counts model reviews only: the offline rules' verdicts cost nothing
        # and spend none (review.py says why), so without a model the batch is the bound.
        to_process, over_budget = review.within_budget(batch, self.deps.reviewer, settings)
        if over_budget:
            self.draft.defer(review.over_budget_reason(settings))
            await self._defer(over_budget, review.over_budget_reason(settings))
        images = await hydrate.hydrate_images(
            self.deps, [c.url for c in to_process if not c.item.image_url]
        )
        await hydrate.retry_thumbnails(db, self.deps, retries, now)
        written = await self._review_and_write(to_process, images)
        await self._settle(now)
        self.draft.set(deferred_count=await held_candidates.count_held(db, self.shard))
        self.processed = await items.mark_processed(
            self.processed, self.deps.fallback_processed, written, self._redis_failed
        )
        return written

    async def _publish_snapshot(self, now: datetime) -> None:
        """The public snapshot — only while this holder's fence is still the newest."""
        db = self.runtime.db
        if not await leases.holds_fence(db, self.shard, self.lease.fence):
            raise leases.StaleLease(f"shard {self.shard}: a newer lease holder has written")
        await snapshot.publish_snapshot(db, self.runtime.store, self.shard, now)

    async def _defer_all_but(self, taken: list[str], reason: str) -> None:
        keep = set(taken)
        await self._store_urls([u for u in self.unstored if u not in keep])
        await held_candidates.defer_all_but(
            self.runtime.db, self.shard, taken, reason, self.clock.now()
        )

    async def _defer(self, queue: list[Candidate], reason: str, *, attempted: bool = False) -> None:
        await self._store_urls([c.url for c in queue])
        await held_candidates.defer(
            self.runtime.db, [c.url for c in queue], reason, self.clock.now(), attempted=attempted
        )

    async def _keep_on_stop(self, arrived: list[review.ItemReview]) -> None:
        """Stopped (SIGTERM) mid-batch: the answers that arrived are paid for, so they stay on
        the held candidates and the next run writes them without asking the model again —
        within KEEP_ON_STOP_SECONDS, the stop's own bound (past it they are reviewed again)."""
        paid = [Reviewed(r.candidate, r.verdict, r.translation) for r in arrived]
        try:
            # both bounds: a statement a silent database holds is severed at the deadline, not
            # cancelled (which would wait on the server for its own reply)
            with statement_deadline(KEEP_ON_STOP_SECONDS):
                async with asyncio.timeout(KEEP_ON_STOP_SECONDS + 1):
                    await write.keep_paid_reviews(
                        self.runtime.db,
                        self.shard,
                        paid,
                        self.clock.now(),
                        store_first=self._store_urls,
                    )
        except TimeoutError:
            warning(
                "worker.verdicts_not_kept",
                shard=self.shard,
                error=f"not kept within {KEEP_ON_STOP_SECONDS:g} s of the stop",
            )

    async def _review_and_write(
        self, to_process: list[Candidate], images: dict[str, str]
    ) -> list[str]:
        db, deps, draft, settings = self.runtime.db, self.deps, self.draft, self.runtime.settings
        locks = await review.acquire_review_locks(
            self.leases, settings, [c.url for c in to_process]
        )
        try:
            held = [c for c in to_process if c.url in locks]
            draft.add(redis_ai_review_lock_skipped_count=len(to_process) - len(held))
            await self._defer(
                [c for c in to_process if c.url not in locks], "another run is reviewing it"
            )
            # Processed since our look-up (another shard, a run whose lease ran out)? Drop it:
            # the review lock only says nobody is reviewing it *now*.
            done = await review.written_among(db, [c.url for c in held])
            await held_candidates.drop(db, sorted(done))
            for url in done:
                self.unstored.pop(url, None)
            pending = [c for c in held if c.url not in done]
            # the pipeline's review stage judged some already; the rest go to the model, as
            # many at once as NEWS_AI_CONCURRENCY lets, the shard lease renewed meanwhile
            verdicts: Verdicts = [
                Reviewed(c, c.verdict, c.translation) for c in pending if c.reviewed
            ]
            arrived: dict[int, review.ItemReview] = {}
            try:
                batch = await review.review_batch(
                    deps.reviewer,
                    [c for c in pending if not c.reviewed],
                    spend=self.spend,
                    keep_alive=self._extend,
                    renew_every=leases.shard_renewal_seconds(settings),
                    arrived=arrived,
                )
            except asyncio.CancelledError:
                await self._keep_on_stop(list(arrived.values()))
                raise
            if batch.cut_off:
                lost = "the shard lease was lost during review"
                warning("worker.redis.worker_lock_extend_failed", shard=self.shard)
                draft.defer(lost)
                await self._defer(batch.cut_off, lost)
            # the verdicts this run's reviews gave (a failed one: none)
            given: list[Verdict] = [r.verdict for r in batch.done if r.verdict is not None]
            transient: list[Candidate] = []
            for r in batch.done:
                if review.review_again_later(r.candidate, r.failed_for_now):
                    transient.append(r.candidate)
                else:
                    verdicts.append(Reviewed(r.candidate, r.verdict, r.translation))
            accepted = sum(1 for v in given if v.accepted)
            draft.add(
                ai_reviewed_count=len(given),
                accepted_count=accepted,
                rejected_count=len(given) - accepted,
            )
            if transient:
                draft.defer(f"{len(transient)} reviews failed for now; retried next run")
                await self._defer(transient, REVIEW_FAILED_FOR_NOW, attempted=True)

            # 10. writes, fenced. The write takes the candidates in memory: it writes them, or
            # finds them written, or stores them (store_first) to defer, reject or keep one.
            writing = {r.url: self.unstored.pop(r.url) for r in verdicts if r.url in self.unstored}

            async def store_first(urls: list[str]) -> None:
                await self._store([writing.pop(u) for u in urls if u in writing])

            try:
                written = await write.write_reviewed(
                    db,
                    self.shard,
                    self.lease.fence,
                    verdicts,
                    images,
                    self.clock.now(),
                    store_first=store_first,
                )
            except leases.StaleLease:
                self.unstored |= writing  # not written: stored for the new holder (run())
                raise
            draft.extend(write_errors=written.write_errors)
        finally:
            # one per article, their fences unread: the rows go (``Leases.release``)
            await self.leases.release_many(list(locks.values()), forget=True)
        # translated by this run's model calls (not a verdict the pipeline's review stage gave)
        written_now = set(written.urls)
        draft.add(
            processed_count=len(written.urls),
            translated_count=sum(
                1
                for r in verdicts
                if r.translation and r.url in written_now and not r.candidate.reviewed
            ),
        )
        return written.urls
