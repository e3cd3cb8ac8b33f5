"""Spec 001's run report: one frozen ``NewsReport`` for both engines — what one inline run, or
one pipeline pass, saw and did — its JSON (the spec's field names), and where it is kept
(``news.worker_reports``, the newest per shard on ``GET /news/reports`` and the dashboard).

Each engine builds its report once, at the end: the inline run from ``RunTally``, the figures
its steps gathered as they went; the pipeline's pass from what it did and what the stage
workers recorded in PostgreSQL since the shard's previous report (``pass_report``). The spec's
fields mean the same thing in both:

* ``processedCount``: articles written (inline: by this run; pipeline: by the workers, for the
  shard, since its previous report — also ``writtenCount``);
* ``aiReviewedCount``, ``acceptedCount``, ``rejectedCount``: verdicts given (by the model, or
  the offline rules: ``reviewer`` says which) — inline: by this run; pipeline: the reviews
  written since the previous report. A review that failed is not counted;
* ``translatedCount``: summaries the model translated — with their review, or later from the
  translation backlog (inline: this run; pipeline: reviews written since the previous report
  that were translated with their review, plus the backlog this pass worked through and any
  backlog translations a worker noted since);
* ``queuedCount``/``queuedBySource``: candidates waiting to be written (held, or queued in a
  stage), by "source (shard)", when the run counted them (inline: after fetching; pipeline: at
  the end of the pass);
* ``deferredCount``/``deferredReasons``: of those, the ones left waiting (``held``) — by a
  limit, MAX_AI_REVIEWS, a lease, a model that failed for now — and why;
* ``retriedCount``: accepted articles without a thumbnail due another try (the no-thumbnail
  retry; at most NO_THUMBNAIL_RETRY_MAX) — tried by the run or pass unless a limit stopped it;
* ``lockedCount``: work skipped because another holder had its lock — inline: 1 when another
  run held the shard's lock, so this run did nothing (``status: skipped``); pipeline (a pass
  takes no shard lock): the fetches and enrichments of the shard's sources and articles put
  off because another worker held their lease, since the previous report;
* ``redisAiReviewLockSkippedCount``: articles left because another holder had their review
  lock (inline: this run; pipeline: parked for it since the previous report);
* ``redisEnabled``: Redis configured and never failing during the run — false once a Redis
  call failed (pipeline: in this process since the previous report, in a worker that noted
  it since, or the pass's own lookup);
* ``backpressureDbArticleCount`` (or ``…Error``): the article count the DB limit saw, or why it
  could not be read (the run goes on without the DB limit);
* ``fetchErrors`` (``source``, ``error``): feeds whose fetch failed (pipeline: since the
  previous report); ``droppedItems`` (``source``, ``reason``, ``count``): items a feed listed
  that cannot be kept; ``writeErrors`` (``url``, ``error``): articles rejected for their own
  data (pipeline: also a dead letter purged with its error).

``status`` says how it ended: ``completed``; ``skipped`` (the shard's lock was held); or
``superseded`` — a newer holder of the shard's lease wrote first, so this run stopped, wrote
nothing more, and left the rest to it (not a failure: exit 0).

The pipeline's pass adds its own fields (``PassFigures``): ``enqueuedSources``,
``releasedCount``, ``resentCount``, ``relayedCount``, ``stages``, ``resultsSince``,
``writtenCount`` and ``reviewRetryCount``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from nightcrew.adapters.processed import ProcessedUrlsDown
from nightcrew.db.database import Database, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.log import warning

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nightcrew.adapters.news import NewsAdapters
    from nightcrew.config import Settings

SQL = load_queries(__file__)

Trigger = Literal["manual", "scheduled"]
Engine = Literal["inline", "rabbitmq"]
Status = Literal["completed", "skipped", "superseded"]

# What a pass looks up in the processed-URL set to learn whether Redis answers (never an URL).
REDIS_PROBE = "nightcrew:redis-probe"
SUPERSEDED_REASON = (
    "superseded: a newer holder of the shard's lease has written; what this run did not "
    "write waits for it"
)
LOCKED_REASON = "another run holds this shard's lock"


@dataclass(frozen=True, kw_only=True, slots=True)
class PassFigures:
    """What only a pipeline pass reports, beside spec 001's fields."""

    enqueued_sources: int  # due sources sent to the fetch queue
    released_count: int  # held candidates admitted into a stage with room
    resent_count: int  # queued so long their message must be lost: sent again
    relayed_count: int  # outbox rows an earlier crash or absent broker left, published now
    stages: dict[str, dict[str, int]]  # the shard's candidates, by stage and state
    results_since: datetime | None  # the window of the workers' results (None: the start)
    review_retry_count: int  # candidates waiting for another review attempt (model failed)

    def to_json(self) -> dict[str, Any]:
        return {
            "enqueuedSources": self.enqueued_sources,
            "releasedCount": self.released_count,
            "resentCount": self.resent_count,
            "relayedCount": self.relayed_count,
            "stages": self.stages,
            "resultsSince": (
                self.results_since.isoformat() if self.results_since is not None else None
            ),
            "reviewRetryCount": self.review_retry_count,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class NewsReport:
    """One run's (inline) or one pass's (pipeline) report; see the module's docstring for what
    each field means — the same in both engines."""

    shard: str
    trigger: str
    status: Status = "completed"
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
    fetch_errors: list[dict[str, Any]] = field(default_factory=list)
    # items a feed listed but that cannot be kept (a link too long, not http(s), none):
    # {"source", "reason", "count"} — not fetch errors: they never park a source
    dropped_items: list[dict[str, Any]] = field(default_factory=list)
    write_errors: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: float = 0.0
    pipeline: PassFigures | None = None  # a pipeline pass's own figures; None: an inline run

    @property
    def engine(self) -> Engine:
        return "inline" if self.pipeline is None else "rabbitmq"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    @property
    def written_count(self) -> int:
        return self.processed_count

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "shard": self.shard,
            "trigger": self.trigger,
            "pipeline": self.engine,
            "status": self.status,
            "skipped": self.skipped,
            "queuedCount": self.queued_count,
            "queuedBySource": dict(self.queued_by_source),
            "deferredCount": self.deferred_count,
            "deferredReasons": list(self.deferred_reasons),
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
            "fetchErrors": list(self.fetch_errors),
            "writeErrors": list(self.write_errors),
            "droppedItems": list(self.dropped_items),
            "durationMs": self.duration_ms,
        }
        if self.pipeline is not None:
            body |= self.pipeline.to_json() | {"writtenCount": self.written_count}
        return body


# The fields every report carries, whichever engine made it (the parity suite checks both).
SPEC_FIELDS = tuple(NewsReport(shard="", trigger="manual").to_json())


def reviewer_label(adapters: NewsAdapters) -> str:
    from nightcrew.adapters.reviewer import OfflineReviewer

    return "offline rules" if isinstance(adapters.reviewer, OfflineReviewer) else "model"


# --- Redis: used throughout, or not -------------------------------------------------------------
class RedisUse:
    """Whether Redis served a run (or pass) throughout: false once a call failed — told by a
    fallback (``failed``), or seen by the process's Redis circuit breaker since the start (the
    adapters' ``redis_breaker``; None without Redis)."""

    def __init__(self, adapters: NewsAdapters) -> None:
        self.configured = adapters.redis_configured
        self._breaker = adapters.redis_breaker
        self._started = self._breaker.now() if self._breaker is not None else 0.0
        self.failures: list[str] = []

    def failed(self, exc: BaseException) -> None:
        """A Redis call failed and its PostgreSQL fallback answered (spec 001: the run goes on
        and says ``redisEnabled: false``)."""
        warning("worker.redis.unavailable", error=str(exc))
        self.failures.append(str(exc))

    def enabled(self, *, looking_back_seconds: float = 0.0) -> bool:
        """Redis configured and no failure since the start (and ``looking_back_seconds``
        before it: a pass asks about the window since the shard's previous report)."""
        if not self.configured or self.failures:
            return False
        if self._breaker is None:
            return True
        since = self._started - looking_back_seconds
        return not self._breaker.failed_since(since)


# --- the inline engine's accumulator -------------------------------------------------------------
@dataclass(kw_only=True)
class RunTally:
    """The inline run's figures as its steps gather them (mutable, this run's only); the
    frozen NewsReport is built from it once, when the run ends (``report``)."""

    shard: str
    trigger: str
    reviewer: str
    redis_enabled: bool
    backpressure_queue_limit: int
    backpressure_db_article_limit: int
    queued_count: int = 0
    queued_by_source: dict[str, int] = field(default_factory=dict)
    deferred_count: int = 0
    deferred_reasons: list[str] = field(default_factory=list)
    retried_count: int = 0
    processed_count: int = 0
    ai_reviewed_count: int = 0
    accepted_count: int = 0
    rejected_count: int = 0
    backpressure_db_article_count: int | None = None
    backpressure_db_article_count_error: str | None = None
    locked_count: int = 0
    redis_ai_review_lock_skipped_count: int = 0
    translated_count: int = 0
    skipped: bool = False
    fetch_errors: list[dict[str, Any]] = field(default_factory=list)
    dropped_items: list[dict[str, Any]] = field(default_factory=list)
    write_errors: list[dict[str, Any]] = field(default_factory=list)

    def report(self, *, status: Status, duration_ms: float, redis_enabled: bool) -> NewsReport:
        return NewsReport(
            shard=self.shard,
            trigger=self.trigger,
            status=status,
            queued_count=self.queued_count,
            queued_by_source=dict(self.queued_by_source),
            deferred_count=self.deferred_count,
            deferred_reasons=list(self.deferred_reasons),
            retried_count=self.retried_count,
            processed_count=self.processed_count,
            ai_reviewed_count=self.ai_reviewed_count,
            accepted_count=self.accepted_count,
            rejected_count=self.rejected_count,
            backpressure_queue_limit=self.backpressure_queue_limit,
            backpressure_db_article_limit=self.backpressure_db_article_limit,
            backpressure_db_article_count=self.backpressure_db_article_count,
            backpressure_db_article_count_error=self.backpressure_db_article_count_error,
            locked_count=self.locked_count,
            redis_ai_review_lock_skipped_count=self.redis_ai_review_lock_skipped_count,
            redis_enabled=self.redis_enabled and redis_enabled,
            translated_count=self.translated_count,
            reviewer=self.reviewer,
            fetch_errors=list(self.fetch_errors),
            dropped_items=list(self.dropped_items),
            write_errors=list(self.write_errors),
            duration_ms=duration_ms,
        )


# --- the pipeline engine's pass -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PassWork:
    """What a pass did itself, for its report."""

    enqueued_sources: int
    released_count: int
    resent_count: int
    relayed_count: int
    deferred_reasons: list[str]
    article_count: int | None
    article_count_error: str | None
    translated_count: int = 0  # summaries of the translation backlog this pass translated
    # the no-thumbnail retries this pass tried (None: it tried none — another pass of the
    # shard was at it, or the article limit stopped it — and those due are counted instead)
    thumbnail_retries: int | None = None


async def pass_report(
    db: Database,
    settings: Settings,
    adapters: NewsAdapters,
    *,
    shard: str,
    trigger: str,
    now: datetime,
    work: PassWork,
    redis: RedisUse,
    duration_ms: float,
) -> NewsReport:
    """A pass's report: its own work, the shard's candidates now, and the workers' results
    for the shard since its previous report (the window ``(resultsSince, now]``) as the stage
    workers recorded them in PostgreSQL."""
    from nightcrew.news import candidates, hydrate

    by_source = await candidates.held_by_source(db, shard, states=("held", "queued"))
    stages: dict[str, dict[str, int]] = {s: {} for s in ("enrich", "review", "write")}
    for row in await db.fetch(SQL["shard_stages"], {"shard": shard}):
        stages.setdefault(row["stage"], {})[row["state"]] = int(row["n"])
    previous = await db.fetch_one(SQL["previous_report"], {"shard": shard, "now": now})
    since: datetime | None = previous["at"] if previous is not None else None
    window = {
        "shard": shard,
        "since": since or datetime.min.replace(tzinfo=now.tzinfo),
        "now": now,
    }
    results = await db.fetch_one(SQL["pass_results"], window)
    waits = await db.fetch_one(SQL["pass_review_waits"], window)
    assert results is not None and waits is not None  # aggregates: always one row
    fetch_errors = [
        {"source": r["source"], "error": r["error"]}
        for r in await db.fetch(SQL["pass_fetch_errors"], window)
    ]
    write_errors = [
        {"url": r["url"], "error": r["error"]}
        for r in await db.fetch(SQL["pass_write_errors"], window)
    ]
    dropped: list[dict[str, Any]] = []
    noted_translations = noted_locks = 0
    redis_noted = False
    for note in await db.fetch(SQL["pass_notes"], window):
        if note["kind"] == "dropped_items":
            dropped.append({"source": note["source"], "reason": note["reason"], "count": note["n"]})
        elif note["kind"] == "translated":
            noted_translations += int(note["n"])
        elif note["kind"] == "fetch_locked":
            noted_locks += int(note["n"])
        elif note["kind"] == "redis_failed":
            redis_noted = True
    if redis.configured and not redis.failures:
        # the pass itself uses no Redis: one lookup asks whether it answers now
        try:
            await adapters.processed.seen([REDIS_PROBE])
        except ProcessedUrlsDown as exc:
            redis.failed(exc)
    retried = work.thumbnail_retries
    if retried is None:  # due, not tried by this pass (as an inline run stopped by a limit)
        retried = len(await hydrate.thumbnail_retries(db, shard, now))
    # Redis failures this process saw since the previous report (a worker in this process, or
    # this pass) count as the workers' own notes do
    looking_back = (now - since).total_seconds() if since is not None else math.inf
    return NewsReport(
        shard=shard,
        trigger=trigger,
        status="completed",
        queued_count=sum(by_source.values()),
        queued_by_source=by_source,
        deferred_count=sum(s.get("held", 0) for s in stages.values()),
        deferred_reasons=list(work.deferred_reasons),
        retried_count=retried,
        processed_count=int(results["written"]),
        ai_reviewed_count=int(results["reviewed"]),
        accepted_count=int(results["accepted"]),
        rejected_count=int(results["rejected"]),
        backpressure_queue_limit=settings.ingestion_backpressure_queue_limit,
        backpressure_db_article_limit=settings.ingestion_backpressure_db_article_limit,
        backpressure_db_article_count=work.article_count,
        backpressure_db_article_count_error=work.article_count_error,
        locked_count=int(waits["enrich_lock_skipped"]) + noted_locks,
        redis_ai_review_lock_skipped_count=int(waits["lock_skipped"]),
        redis_enabled=(
            not redis_noted and redis.enabled(looking_back_seconds=max(0.0, looking_back))
        ),
        translated_count=int(results["translated"]) + noted_translations + work.translated_count,
        reviewer=reviewer_label(adapters),
        fetch_errors=fetch_errors,
        dropped_items=dropped,
        write_errors=write_errors,
        duration_ms=duration_ms,
        pipeline=PassFigures(
            enqueued_sources=work.enqueued_sources,
            released_count=work.released_count,
            resent_count=work.resent_count,
            relayed_count=work.relayed_count,
            stages=stages,
            results_since=since,
            review_retry_count=int(waits["review_retries"]),
        ),
    )


async def locked_report(
    db: Database,
    settings: Settings,
    adapters: NewsAdapters,
    *,
    shard: str,
    trigger: str,
    redis_enabled: bool,
    duration_ms: float,
) -> NewsReport:
    """Another holder had the shard's lock: the inline run did nothing; what waits counted."""
    from nightcrew.news import candidates

    return NewsReport(
        shard=shard,
        trigger=trigger,
        status="skipped",
        locked_count=1,
        deferred_count=await candidates.count_held(db, shard),
        deferred_reasons=[LOCKED_REASON],
        backpressure_queue_limit=settings.ingestion_backpressure_queue_limit,
        backpressure_db_article_limit=settings.ingestion_backpressure_db_article_limit,
        redis_enabled=redis_enabled,
        reviewer=reviewer_label(adapters),
        duration_ms=duration_ms,
    )


# --- what the stage workers note for the passes' reports ---------------------------------------
async def note_dropped(
    db: Database | Tx, *, shard: str, source: str, dropped: Mapping[str, int], now: datetime
) -> None:
    """Items a fetch dropped (``FetchResult.dropped``: {reason: count}) of ``source`` (its
    name), for the next pass's ``droppedItems``. The pipeline's fetch stage calls it."""
    if not dropped:
        return
    reasons = sorted(dropped)
    await db.execute(
        SQL["note_many"],
        {
            "shard": shard,
            "kind": "dropped_items",
            "source": source,
            "reasons": reasons,
            "counts": [int(dropped[r]) for r in reasons],
            "now": now,
        },
    )


async def note_translated(db: Database | Tx, *, shard: str, count: int, now: datetime) -> None:
    """Summaries of ``shard`` the pipeline translated from the translation backlog, for the
    next pass's ``translatedCount`` (translations made with a review are counted from the
    reviews themselves)."""
    if count > 0:
        await db.execute(
            SQL["note"],
            {
                "shard": shard,
                "kind": "translated",
                "source": None,
                "reason": None,
                "n": count,
                "now": now,
            },
        )


async def note_fetch_locked(db: Database | Tx, *, shard: str, now: datetime) -> None:
    """A fetch of ``shard``'s source skipped because another worker holds its fetch lease,
    for the next pass's ``lockedCount``. The pipeline's fetch stage calls it."""
    await db.execute(
        SQL["note"],
        {
            "shard": shard,
            "kind": "fetch_locked",
            "source": None,
            "reason": None,
            "n": 1,
            "now": now,
        },
    )


async def note_redis_failure(db: Database | Tx, *, error: str | None, now: datetime) -> None:
    """Redis failed in a pipeline worker: every shard's next pass says ``redisEnabled:
    false`` (a worker serves every shard)."""
    await db.execute(
        SQL["note"],
        {
            "shard": None,
            "kind": "redis_failed",
            "source": None,
            "reason": error,
            "n": 1,
            "now": now,
        },
    )


async def note_redis_trouble(
    db: Database, adapters: NewsAdapters, *, since: float | None, now: datetime
) -> float | None:
    """For a pipeline worker's housekeeping: a Redis failure its circuit breaker saw since
    ``since`` (the breaker's clock; None: the worker's start) noted for the passes. Returns
    the next call's ``since`` (None when no Redis is configured)."""
    breaker = adapters.redis_breaker
    if breaker is None:
        return None
    checked = breaker.now()
    if breaker.failed_since(since if since is not None else -math.inf):
        await note_redis_failure(db, error=breaker.last_error, now=now)
    return checked


# --- keeping them -------------------------------------------------------------------------------
async def save_report(
    db: Database, *, shard: str, trigger: str, started_at: datetime, report: NewsReport
) -> None:
    """One report (either engine's) into ``news.worker_reports``. A pass also forgets the
    notes it has reported (the shard's; the workers' Redis failures, read by every shard's
    pass, after a day)."""
    await db.execute(
        SQL["save_report"],
        {
            "shard": shard,
            "trigger": trigger,
            "now": started_at,
            "report": json_param(report.to_json()),
        },
    )
    if report.pipeline is not None:
        await db.execute(SQL["forget_notes"], {"shard": shard, "now": started_at})


async def latest_reports(db: Database) -> list[dict[str, Any]]:
    """The newest report of each shard, whichever engine saved it."""
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
