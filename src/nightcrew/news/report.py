"""Spec 001's run report: what one run (inline) or one pass (pipeline) did, its JSON — the
spec's field names — and where it is kept (``news.worker_reports``, the newest per shard on
``GET /news/reports`` and the dashboard).

Today each engine has its own report: ``NewsReport`` is the inline run's, ``PassReport`` the
pipeline pass's. They sit side by side here so that the fields meaning the same thing can be
read together; issue 23 makes them one frozen report filled by both engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from nightcrew.db.database import Database, json_param
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)

Trigger = Literal["manual", "scheduled"]


# The inline engine's report. Not frozen (yet): the inline run fills it in as its steps go and
# saves it when it ends; it becomes frozen when both engines build one report from their steps'
# frozen results (issue 23).
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


# The pipeline engine's report (to be unified with NewsReport, issue 23).
@dataclass(frozen=True, kw_only=True)
class PassReport:
    """Spec 001's report fields, computed for this pass, plus what the pass enqueued.

    A pass holds no lock and does no stage work, so each field says what the pass itself
    knows, with the spec's meaning:

    * ``processedCount``: articles this pass put into the pipeline — held candidates it
      admitted into a stage (``releasedCount``) plus those it sent again (``resentCount``);
      the due sources it enqueued are ``enqueuedSources``;
    * ``queuedCount``/``queuedBySource``/``deferredCount``/``deferredReasons``: the shard's
      held and queued candidates now, the held ones, and the limits this pass ran into;
    * the stage workers' results — ``aiReviewedCount``, ``acceptedCount``, ``rejectedCount``,
      and ``writtenCount`` (not in spec 001) — are counted from ``news.reviews`` and
      ``news.articles`` for the shard since its previous report (``resultsSince``; the
      beginning when there is none): the window between two passes;
    * ``retriedCount``: candidates waiting for another review attempt after the model failed
      for now (the pipeline's retries; it has no no-thumbnail retry);
    * ``redisAiReviewLockSkippedCount``: candidates parked because another worker holds
      their review lease;
    * ``redisEnabled``: whether the workers' leases use Redis (REDIS_URL set);
    * ``backpressureDbArticleCount`` (or ``…Error``): the article count read by this pass;
      a count that fails is reported and the pass goes on without the DB limit;
    * ``lockedCount``: always 0 — no shard lock is taken.
    """

    shard: str
    trigger: str
    queued_count: int
    queued_by_source: dict[str, int]
    deferred_count: int
    deferred_reasons: list[str]
    retried_count: int
    enqueued_sources: int
    released_count: int
    resent_count: int
    relayed_count: int
    stages: dict[str, dict[str, int]]
    results_since: datetime | None
    written_count: int
    ai_reviewed_count: int
    accepted_count: int
    rejected_count: int
    redis_ai_review_lock_skipped_count: int
    redis_enabled: bool
    backpressure_queue_limit: int
    backpressure_db_article_limit: int
    backpressure_db_article_count: int | None
    backpressure_db_article_count_error: str | None
    duration_ms: float

    @property
    def processed_count(self) -> int:
        return self.released_count + self.resent_count

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "trigger": self.trigger,
            "pipeline": "rabbitmq",
            "skipped": False,
            "queuedCount": self.queued_count,
            "queuedBySource": self.queued_by_source,
            "deferredCount": self.deferred_count,
            "deferredReasons": self.deferred_reasons,
            "retriedCount": self.retried_count,
            "processedCount": self.processed_count,
            "enqueuedSources": self.enqueued_sources,
            "releasedCount": self.released_count,
            "resentCount": self.resent_count,
            "relayedCount": self.relayed_count,
            "stages": self.stages,
            "resultsSince": (
                self.results_since.isoformat() if self.results_since is not None else None
            ),
            "writtenCount": self.written_count,
            "aiReviewedCount": self.ai_reviewed_count,
            "acceptedCount": self.accepted_count,
            "rejectedCount": self.rejected_count,
            "backpressureQueueLimit": self.backpressure_queue_limit,
            "backpressureDbArticleLimit": self.backpressure_db_article_limit,
            "backpressureDbArticleCount": self.backpressure_db_article_count,
            "backpressureDbArticleCountError": self.backpressure_db_article_count_error,
            "lockedCount": 0,
            "redisAiReviewLockSkippedCount": self.redis_ai_review_lock_skipped_count,
            "redisEnabled": self.redis_enabled,
            "durationMs": self.duration_ms,
        }


async def save_report(
    db: Database, *, shard: str, trigger: str, started_at: datetime, report: dict[str, Any]
) -> None:
    """One report (either engine's JSON) into ``news.worker_reports``."""
    await db.execute(
        SQL["save_report"],
        {"shard": shard, "trigger": trigger, "now": started_at, "report": json_param(report)},
    )


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
