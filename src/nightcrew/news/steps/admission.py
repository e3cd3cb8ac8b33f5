"""Admission: spec 001's backpressure — the queue limit (INGESTION_BACKPRESSURE_QUEUE_LIMIT)
and the article limit (INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT, counted by
``news.article_count()``) — checked before any expensive step, by both engines through one
rule (``decide``), once per run or pass, after its fetches:

* the article table at or above its limit: nothing goes on (room 0, "database limit: …"), and
  no snapshot is published either (``allows_expensive``);
* else ``room`` = the queue limit less what is already in flight (``load``), and the oldest
  ``min(waiting, room)`` go on. Over the limit the rest wait, behind the backlog, and the
  reason says "backlog over the queue limit: processing N of M".

So a backlog over the limit drains in bounded batches (at most the limit per run or pass,
oldest first) rather than being deferred for ever — spec 001's letter defers *everything* over
the limit, which deadlocks a shard whose first fetch alone is over it.

``waiting`` is the shard's queue after the fetches (its waiting candidates and the new items).
``load`` is what an earlier pass admitted that the pipeline's stage workers still have in
flight (``candidates.admission_load``); an inline run finishes what it admits, so for it none.
Once admitted, a candidate goes through every stage without being admitted again.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightcrew.config import Settings
from nightcrew.db.database import Database, QueryError
from nightcrew.db.queries import load_queries
from nightcrew.log import describe_error, warning
from nightcrew.news.report import ReportDraft

SQL = load_queries(__file__)


@dataclass(frozen=True, slots=True)
class ArticleCount:
    n: int | None
    error: str | None


async def count_articles(db: Database) -> ArticleCount:
    """The article table's size for the DB limit (both engines). A count that fails for its
    own reasons is reported, not raised (spec 001: "reports the telemetry error, and
    continues"): the DB limit is then not applied and the queue limit still is. An outage
    (DatabaseUnavailableError) is still raised: nothing can go on without the database."""
    try:
        row = await db.fetch_one(SQL["article_count"])
    except QueryError as exc:
        warning("worker.backpressure.db_count_failed", error=describe_error(exc))
        return ArticleCount(None, describe_error(exc))
    try:
        return ArticleCount(int(row["n"]), None)  # type: ignore[index]
    except (TypeError, ValueError, KeyError):
        warning("worker.backpressure.db_count_parse_failed", row=repr(row))
        return ArticleCount(None, f"not a count: {row!r}")


def over_article_limit(settings: Settings, articles: ArticleCount) -> str | None:
    """Why nothing expensive may run: the article table at or above
    INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT (None: below it, or its count not read)."""
    limit = settings.ingestion_backpressure_db_article_limit
    if articles.n is None or articles.n < limit:
        return None
    return (
        f"database limit: {articles.n} articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT {limit}"
    )


@dataclass(frozen=True, slots=True)
class Admission:
    room: int  # how many of the waiting may go on now, oldest first
    reason: str | None  # why the rest wait (None: all may go on)
    articles: int | None = None  # the article count the DB limit saw (None: not read)
    articles_error: str | None = None  # why it could not be read


def limits(settings: Settings) -> tuple[int, int]:
    """(the queue limit, the article limit), as the reports show them."""
    return (
        settings.ingestion_backpressure_queue_limit,
        settings.ingestion_backpressure_db_article_limit,
    )


async def allows_expensive(db: Database, settings: Settings) -> bool:
    """Whether expensive work may run at all now (the article table below its limit, or its
    count not read): the pipeline's snapshot refresh asks, as the inline run's admission does
    before its snapshot."""
    return over_article_limit(settings, await count_articles(db)) is None


def decide(
    settings: Settings,
    *,
    waiting: int,
    load: int,
    articles: ArticleCount,
    shard: str | None = None,
) -> Admission:
    """Spec 001's backpressure, one rule for both engines: how many of ``waiting`` candidates
    may go on while ``load`` are in flight (``shard`` only names it in the reason).

    The article limit stops everything at or above it (spec: "at or above"); the queue limit
    bounds the batch — the queue is over it above it (spec: "exceeded") and then the oldest
    ``limit - load`` go on and the rest wait."""
    full = over_article_limit(settings, articles)
    if full is not None:
        return Admission(0, full, articles.n, articles.error)
    limit = settings.ingestion_backpressure_queue_limit
    room = min(waiting, max(0, limit - load))
    if room >= waiting:
        return Admission(waiting, None, articles.n, articles.error)
    in_flight = f"{load} admitted earlier still in flight in shard {shard}, " if load else ""
    return Admission(
        room,
        f"backlog over the queue limit: processing {room} of {waiting} "
        f"({in_flight}INGESTION_BACKPRESSURE_QUEUE_LIMIT {limit})",
        articles.n,
        articles.error,
    )


def decide_and_say(
    draft: ReportDraft,
    settings: Settings,
    *,
    waiting: int,
    load: int,
    articles: ArticleCount,
    shard: str,
) -> Admission:
    """``decide``, for a run or a pass: why the rest waits, if any, said in its report and
    logged (``worker.backpressure.deferred``)."""
    admitted = decide(settings, waiting=waiting, load=load, articles=articles, shard=shard)
    if admitted.reason is not None:
        draft.defer(admitted.reason)
        warning(
            "worker.backpressure.deferred",
            shard=shard,
            reasons=draft.report.deferred_reasons,
            processing=admitted.room,
            queued=waiting,
        )
    return admitted
