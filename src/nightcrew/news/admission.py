"""Admission: spec 001's backpressure — the queue limit (INGESTION_BACKPRESSURE_QUEUE_LIMIT)
and the article limit (INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT, counted by
``news.article_count()``) — checked before any expensive step, by both engines through one
rule (``decide``):

* the article table at or above its limit: nothing goes on (room 0, "database limit: …");
* else ``room`` = the queue limit less what is already in flight (``load``), and the oldest
  ``min(waiting, room)`` go on. Over the limit the rest wait, behind the backlog, and the
  reason says "backlog over the queue limit: processing N of M".

So a backlog over the limit drains in bounded batches (at most the limit per run, oldest
first) rather than being deferred for ever — spec 001's letter defers *everything* over the
limit, which deadlocks a shard whose first fetch alone is over it (issue 23; the README's
"Backpressure drains" says why).

The engines differ only in what they count:

* the inline run (``inline.py``): ``waiting`` = the shard's held candidates after its fetch,
  ``load`` = 0 (a run finishes what it takes);
* the pipeline: per stage (enrich, review, write) **and per shard** (spec 001's
  ``queuedBySource`` is by source and shard): ``load`` = the shard's candidates queued for the
  stage — in the outbox, waiting in the queue, or in a worker's hands — so a busy shard never
  holds another's work. ``admit`` serialises one (stage, shard)'s admissions with an advisory
  lock, so concurrent workers cannot overfill it.
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


async def count_articles(db: Database | Tx, *, in_transaction: bool = False) -> ArticleCount:
    """The article table's size for the DB limit (both engines). A count that fails for its
    own reasons is reported, not raised (spec 001: "reports the telemetry error, and
    continues"): the DB limit is then not applied and the queue limit still is. Inside a
    transaction the count runs under a savepoint, so its failure does not abort the caller's
    transaction. An outage (DatabaseUnavailableError) is still raised: nothing can go on
    without the database."""
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


def decide(
    settings: Settings,
    *,
    waiting: int,
    load: int,
    articles: ArticleCount,
    stage: str | None = None,
    shard: str | None = None,
) -> Admission:
    """Spec 001's backpressure, one rule for both engines: how many of ``waiting`` candidates
    may go on while ``load`` are in flight (``stage``/``shard`` only name it in the reason).

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
    where = f"{stage} " if stage else ""
    in_flight = f"{load} queued or in flight in shard {shard}, " if stage else ""
    return Admission(
        room,
        f"{where}backlog over the queue limit: processing {room} of {waiting} "
        f"({in_flight}INGESTION_BACKPRESSURE_QUEUE_LIMIT {limit})",
        articles.n,
        articles.error,
    )


# --- the pipeline's admissions into a stage -------------------------------------------------------
async def admit(tx: Tx, settings: Settings, stage: str, wanted: int, *, shard: str) -> Admission:
    """How many of ``wanted`` candidates of ``shard`` may enter ``stage`` now. Serialised per
    (stage, shard) — an advisory lock held to the end of ``tx`` — so concurrent workers cannot
    overfill it; other shards' admissions do not wait for it."""
    if wanted == 0:
        return Admission(0, None)
    await tx.execute(SQL["admission_lock"], {"stage": stage, "shard": shard})
    articles = await count_articles(tx, in_transaction=True)
    row = await tx.fetch_one(SQL["stage_load"], {"stage": stage, "shard": shard})
    load = int(row["n"]) if row else 0
    return decide(settings, waiting=wanted, load=load, articles=articles, stage=stage, shard=shard)


@dataclass(frozen=True, kw_only=True, slots=True)
class Admitted:
    """Per item, in feed order: its state (``queued`` or ``held``) and the reason saved."""

    states: list[str]
    reasons: list[str]


async def admit_each(tx: Tx, settings: Settings, stages: list[str], *, shard: str) -> Admitted:
    """Items of ``shard`` entering their first stages (``stages``, one per item, in feed
    order): ``queued`` while its stage has room in the shard, else ``held`` with why."""
    room: dict[str, Admission] = {}
    for stage in sorted(set(stages)):
        room[stage] = await admit(tx, settings, stage, stages.count(stage), shard=shard)
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
