"""The pipeline engine's pass (NEWS_PIPELINE=rabbitmq); its stage consumers are ``stages.py``
(run by ``worker.py``), calling the same steps as the inline run (``engines/inline.py``).

**The pass** (``news run`` in pipeline mode, and serve's news schedule) is spec 001's run with
the expensive steps handed to the stage workers. Under the shard lock (a second run or pass of
the shard meanwhile is skipped and says so, as inline), it sends the shard's due sources to the
fetch stage and waits for those fetches — at most the fetch budget and a grace — then counts
the shard's queue, reads the article count, and admits at most the queue limit less what
earlier passes admitted that is still in flight, oldest first, within MAX_AI_REVIEWS
(``admission.decide``, ``review.within_budget``: the inline run's rules). What it admits is
queued at its stage with its message; the rest waits, with the reason, for a later pass. Then
the no-thumbnail retries and the translation backlog, and the report of what the pass found
and decided — the workers' results since the shard's previous report under ``workers``.

"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from nightcrew.adapters.locks import Lease
from nightcrew.adapters.processed import ProcessedUrlsDown
from nightcrew.adapters.reviewer import Spend
from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.errors import QueueError
from nightcrew.log import describe_error, event, warning
from nightcrew.news.engines.pipeline.message_outbox import (
    Owed,
    broker_of,
    relay,
    resend_due,
    send_owed,
)
from nightcrew.news.engines.pipeline.messages import FetchSource, read
from nightcrew.news.engines.pipeline.notes import read_for_pass
from nightcrew.news.report import (
    NewsReport,
    PassFigures,
    RedisUse,
    ReportDraft,
    Trigger,
    WorkerResults,
    count_spend,
    locked_report,
    save_report,
)
from nightcrew.news.steps import admission, hydrate, leases, review
from nightcrew.news.steps import candidates as held_candidates
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# A pass waits for the fetches it sent at most the fetch budget and this long (a worker's
# queueing and its commit); what is not fetched by then goes to a later pass.
FETCH_WAIT_GRACE_SECONDS = 15.0
FETCH_POLL_SECONDS = 0.1
# a skipped pass's own figures: it did nothing (its workers' results wait for the next pass)
NOTHING_DONE = PassFigures(
    enqueued_sources=0,
    unfetched_sources=0,
    admitted_count=0,
    resent_count=0,
    relayed_count=0,
    stages={},
    workers=WorkerResults(since=None),
)


async def run_pass(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: Trigger = "manual"
) -> NewsReport:
    """One pass over ``shard`` under its shard lock; its report, saved."""
    started, began = time.perf_counter(), clock.now()
    deps = runtime.news_adapters()
    redis = RedisUse(deps)  # this process's Redis breaker, watched from now
    draft = ReportDraft(runtime.settings, deps, shard=shard, trigger=trigger)
    lease = await leases.acquire_shard(deps.leases, runtime.settings, shard)
    if lease is None:
        report = await locked_report(
            runtime.db,
            draft,
            redis_enabled=redis.enabled(),
            duration_ms=_ms_since(started),
            pipeline=NOTHING_DONE,
        )
    else:
        try:
            figures = await _Pass(runtime, clock, draft, lease, began).run()
        finally:
            await deps.leases.release(lease)
        if redis.configured and not redis.failures:
            await _probe_redis(runtime, redis)
        report = draft.build(
            status="completed",
            duration_ms=_ms_since(started),
            redis_enabled=redis.enabled(),
            pipeline=figures,
        )
    await save_report(runtime.db, started_at=began, report=report)
    count_spend(runtime.metrics, report)
    event(
        "news.pass_completed",
        shard=shard,
        status=report.status,
        queued=report.queued_count,
        admitted=report.pipeline.admitted_count if report.pipeline else 0,
        deferred=report.deferred_count,
    )
    return report


# What a pass looks up in the processed-URL set to learn whether Redis answers (never an URL).
REDIS_PROBE = "nightcrew:redis-probe"


async def _probe_redis(runtime: Runtime, redis: RedisUse) -> None:
    """The pass itself reads no processed URL: one lookup asks whether Redis answers now."""
    try:
        await runtime.news_adapters().processed.seen([REDIS_PROBE])
    except ProcessedUrlsDown as exc:
        redis.failed(exc)


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


class _Pass:
    """One pass of one shard, holding its shard lock."""

    def __init__(
        self, runtime: Runtime, clock: Clock, draft: ReportDraft, lease: Lease, began: datetime
    ) -> None:
        self.runtime, self.clock, self.draft, self.lease = runtime, clock, draft, lease
        self.began, self.shard = began, draft.report.shard
        self.broker = broker_of(runtime)

    async def run(self) -> PassFigures:
        """Spec 001's order: fetch, count, admit, the upkeep; then what the workers noted."""
        db, now = self.runtime.db, self.began
        resent = await db.fetch_as(
            Owed,
            SQL["resend_stale"],
            {
                "shard": self.shard,
                "now": now,
                "resend_after": self.runtime.settings.news_resend_after_seconds,
            },
        )
        sources = await db.fetch_as(
            Owed,
            SQL["enqueue_due_sources"],
            {
                "shard": self.shard,
                "now": now,
                "resend_after": self.runtime.settings.news_resend_after_seconds,
            },
        )
        resent += await resend_due(db, now, shard=self.shard)
        sent = await send_owed(self.broker, db, resent + sources)
        try:
            relayed = await relay(self.broker, db, now)
        except QueueError as exc:  # older messages wait for the next relay; ours were sent
            relayed = 0
            warning("news.outbox.relay_failed", error=describe_error(exc))
        unfetched = await self._await_fetches(
            [read(FetchSource, owed.body).source_id for owed in sources],
            broker_took_them=sent >= 0,
        )
        admitted = await self._admit()
        await self._upkeep(stopped=admitted is None)
        noted = await read_for_pass(db, shard=self.shard, began=self.began, now=self.clock.now())
        self.draft.extend(fetch_errors=noted.fetch_errors, dropped_items=noted.dropped_items)
        self.draft.set(deferred_count=await held_candidates.count_held(db, self.shard))
        return PassFigures(
            enqueued_sources=len(sources),
            unfetched_sources=unfetched,
            admitted_count=admitted or 0,
            resent_count=len(resent),
            relayed_count=relayed,
            stages=noted.stages,
            workers=noted.workers,
        )

    async def _await_fetches(self, source_ids: list[int], *, broker_took_them: bool) -> int:
        """Wait for the fetches this pass sent to be done, at most the fetch budget and a grace
        (the shard lock extended as the wait goes on); how many are not. An earlier pass's
        fetch that is still out is not waited for: what it finds waits for the pass after it.
        A broker that refused them is not waited for: nothing fetches them before the relay
        sends them."""
        db, settings = self.runtime.db, self.runtime.settings
        deps = self.runtime.news_adapters()
        within = settings.news_fetch_budget_seconds + FETCH_WAIT_GRACE_SECONDS
        started = time.monotonic()
        extended = started
        while source_ids:
            left = await db.fetch_count(SQL["unfetched"], {"ids": source_ids})
            if not left:
                return 0
            now = time.monotonic()
            if not broker_took_them or now - started > within:
                why = (
                    "the broker is unreachable"
                    if not broker_took_them
                    else f"not within {within:g} s"
                )
                self.draft.defer(
                    f"{left} sources not fetched ({why}; is a fetch worker running?): their"
                    " items wait for a later pass"
                )
                return left
            if now - extended > leases.shard_renewal_seconds(settings):
                await leases.extend_shard(deps.leases, settings, self.lease)
                extended = now
            await asyncio.sleep(FETCH_POLL_SECONDS)
        return 0

    async def _admit(self) -> int | None:
        """The inline run's admission (``admission.decide``), with what earlier passes admitted
        and the workers still have in flight as its load; the shard lock extended first. How
        many were admitted (None: the article limit, or a lost lock, stopped everything)."""
        db, settings, draft = self.runtime.db, self.runtime.settings, self.draft
        deps = self.runtime.news_adapters()
        queued = await held_candidates.held_by_source(db, self.shard, states=("held", "queued"))
        draft.set(queued_by_source=queued, queued_count=sum(queued.values()))
        draft.set(retried_count=len(await hydrate.thumbnail_retries(db, self.shard, self.began)))
        articles = await admission.count_articles(db)
        draft.set(
            backpressure_db_article_count=articles.n,
            backpressure_db_article_count_error=articles.error,
        )
        waiting = await held_candidates.count_held(db, self.shard)
        load = await held_candidates.admission_load(db, self.shard)
        decided = admission.decide_and_say(
            draft, settings, waiting=waiting, load=load, articles=articles, shard=self.shard
        )
        if decided.room == 0:  # nothing waits, or the article limit, or no room in the queue
            if decided.reason is not None:
                await held_candidates.defer_all_but(db, self.shard, [], decided.reason, self.began)
            return None if admission.over_article_limit(settings, articles) else 0
        if not await leases.extend_shard(deps.leases, settings, self.lease):
            warning("worker.redis.worker_lock_extend_failed", shard=self.shard)
            draft.defer("the shard lease was lost before the expensive steps")
            return None
        batch = await held_candidates.held(db, self.shard, decided.room)
        if decided.reason is not None:  # the backlog beyond the batch waits, with why
            await held_candidates.defer_all_but(
                db, self.shard, [c.url for c in batch], decided.reason, self.began
            )
        taken, over_budget = review.within_budget(batch, deps.reviewer, settings)
        if over_budget:
            draft.defer(review.over_budget_reason(settings))
            await held_candidates.defer(
                db, [c.url for c in over_budget], review.over_budget_reason(settings), self.began
            )
        owed = await held_candidates.admit(db, [c.url for c in taken], self.clock.now())
        await send_owed(self.broker, db, owed)
        return len(owed)

    async def _upkeep(self, *, stopped: bool) -> None:
        """What the inline run does after its batch: accepted articles still without a
        thumbnail tried again, then — with a model — the translation backlog, the shard lock
        extended before each translation. ``stopped``: nothing expensive runs."""
        if stopped:
            return
        db, settings, deps = self.runtime.db, self.runtime.settings, self.runtime.news_adapters()
        retries = await hydrate.thumbnail_retries(db, self.shard, self.began)
        await hydrate.retry_thumbnails(db, deps, retries, self.began)
        if not deps.reviewer.translation_enabled:
            return
        backlog = await review.translation_backlog(db, self.shard, settings)
        spend = Spend()
        translated = await review.translate_backlog(
            db,
            deps.reviewer,
            backlog,
            still_held=lambda: leases.extend_shard(deps.leases, settings, self.lease),
            spend=spend,
        )
        self.draft.add(
            translated_count=translated,
            ai_prompt_tokens=spend.prompt_tokens,
            ai_completion_tokens=spend.completion_tokens,
        )
