"""Admission: spec 001's backpressure — the queue limit (INGESTION_BACKPRESSURE_QUEUE_LIMIT)
and the article limit (INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT, counted by
``news.article_count()``) — checked before any expensive step.

Each engine has its own version today, side by side here; issue 23 unifies them:

* the inline run counts the articles once (``count_articles_inline``) and, over a limit,
  stops the whole run before its first expensive step (``over_limits_inline``);
* the pipeline admits candidates into a stage one transaction at a time, up to the room the
  stage has left (``admit``, ``admit_each``), counting the articles under a savepoint so a
  failed count never aborts the admission's transaction (``count_articles``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nightcrew.config import Settings
from nightcrew.db.database import Database, QueryError, Tx
from nightcrew.db.queries import load_queries
from nightcrew.log import describe_error, warning

SQL = load_queries(__file__)


@dataclass(frozen=True, slots=True)
class ArticleCount:
    n: int | None
    error: str | None


# --- the inline run's ----------------------------------------------------------------------------
async def count_articles_inline(db: Database) -> ArticleCount:
    """The article table's size (inline run). A count that fails is reported, not raised
    (spec 001: "reports the telemetry error, and continues"): the DB limit is then not
    applied and the queue limit still is."""
    try:
        row = await db.fetch_one(SQL["article_count"])
    except QueryError as exc:
        warning("worker.backpressure.db_count_failed", error=describe_error(exc))
        return ArticleCount(None, describe_error(exc))
    try:
        return ArticleCount(int(row["n"]), None)  # type: ignore[index]
    except (TypeError, ValueError) as exc:
        warning("worker.backpressure.db_count_parse_failed", error=describe_error(exc))
        return ArticleCount(None, f"not a count: {row!r}")


def over_limits_inline(settings: Settings, queued: int, articles: int | None) -> list[str]:
    """Why the inline run must stop before its expensive steps: one reason per limit it is
    over (none: it goes on). The queue limit is exceeded above it, the article limit at it."""
    reasons = []
    if queued > settings.ingestion_backpressure_queue_limit:
        reasons.append(
            f"queue limit: {queued} queued > "
            f"INGESTION_BACKPRESSURE_QUEUE_LIMIT {settings.ingestion_backpressure_queue_limit}"
        )
    if articles is not None and articles >= settings.ingestion_backpressure_db_article_limit:
        reasons.append(
            f"database limit: {articles} articles >= INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT "
            f"{settings.ingestion_backpressure_db_article_limit}"
        )
    return reasons


# --- the pipeline's ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Admission:
    room: int  # how many may enter now
    reason: str | None  # why the rest are held (None: all may enter)
    articles: int | None = None  # the article count the DB limit saw (None: not read)
    articles_error: str | None = None  # why it could not be read


async def count_articles(db: Database | Tx, *, in_transaction: bool = False) -> ArticleCount:
    """The article table's size for the DB limit (pipeline). A count that fails for its own
    reasons is reported, not raised (spec 001: "reports the telemetry error, and continues"):
    the DB limit is then not applied and the queue limit still is. Inside a transaction the
    count runs under a savepoint, so its failure does not abort the caller's transaction. An
    outage (DatabaseUnavailableError) is still raised: nothing can go on without the database."""
    if in_transaction:
        await db.execute(SQL["savepoint_article_count"])
    try:
        row = await db.fetch_one(SQL["article_count"])
    except QueryError as exc:
        if in_transaction:
            await db.execute(SQL["rollback_article_count"])
        warning("worker.backpressure.db_count_failed", error=describe_error(exc))
        return ArticleCount(None, describe_error(exc))
    try:
        return ArticleCount(int(row["n"]), None)  # type: ignore[index]
    except (TypeError, ValueError, KeyError):
        warning("worker.backpressure.db_count_parse_failed", row=repr(row))
        return ArticleCount(None, f"not a count: {row!r}")


async def admit(tx: Tx, settings: Settings, stage: str, wanted: int) -> Admission:
    """How many of ``wanted`` candidates may enter ``stage`` now. Serialised per stage (an
    advisory lock held to the end of ``tx``), so concurrent workers cannot overfill it."""
    if wanted == 0:
        return Admission(0, None)
    await tx.execute(SQL["admission_lock"], {"stage": stage})
    articles = await count_articles(tx, in_transaction=True)
    article_limit = settings.ingestion_backpressure_db_article_limit
    if articles.n is not None and articles.n >= article_limit:
        return Admission(
            0,
            f"database limit: {articles.n} articles >= "
            f"INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT {article_limit}",
            articles.n,
        )
    row = await tx.fetch_one(SQL["stage_load"], {"stage": stage})
    load, limit = (int(row["n"]) if row else 0), settings.ingestion_backpressure_queue_limit
    room = max(0, limit - load)
    if room >= wanted:
        return Admission(wanted, None, articles.n, articles.error)
    return Admission(
        room,
        f"{stage} queue limit: {load} queued or in flight, "
        f"INGESTION_BACKPRESSURE_QUEUE_LIMIT {limit}",
        articles.n,
        articles.error,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Admitted:
    """Per item, in feed order: its state (``queued`` or ``held``) and the reason saved."""

    states: list[str]
    reasons: list[str]


async def admit_each(tx: Tx, settings: Settings, stages: list[str]) -> Admitted:
    """Items entering their first stages (``stages``, one per item, in feed order): ``queued``
    while its stage has room, else ``held`` with why."""
    room: dict[str, Admission] = {}
    for stage in sorted(set(stages)):
        room[stage] = await admit(tx, settings, stage, stages.count(stage))
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
    return Admitted(states=states, reasons=reasons)
