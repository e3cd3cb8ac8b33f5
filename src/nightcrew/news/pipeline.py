"""The pipeline engine on RabbitMQ (NEWS_PIPELINE=rabbitmq): the outbox, the pass, releasing
held candidates; its stage consumers are ``stages.py`` (run by ``worker.py``), calling the same
steps as the inline run (``inline.py``): ``admission``, ``items``, ``hydrate``, ``review``,
``write``, ``snapshot``.

PostgreSQL holds every candidate's stage and state (``news.candidates``); a broker message only
says "work on this now". Whatever owes a message writes it to ``news.outbox`` in the same
transaction as the state change that owes it; after the commit it is published (confirmed) and
deleted, and the relay publishes what a crash or an absent broker left behind — so nothing is
lost between the database and the broker, and a message sent twice finds its work done.

**Admission** (spec 001's backpressure, owned by the backend; ``admission.py``): before a
candidate enters an expensive stage (enrich, review, write), the stage's load — candidates
queued for it, whether still in the outbox, waiting in the queue or being worked on — is
compared with INGESTION_BACKPRESSURE_QUEUE_LIMIT, and the article table with
INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT. Over a limit, the candidate is ``held`` with the
reason; nothing expensive runs for it until a later **pass** releases it into a stage with room.

**The pass** (``news run`` in pipeline mode, and serve's news schedule) holds no lock while the
pipeline works: it enqueues the shard's due sources to ``fetch``, releases held candidates into
stages with room, relays the outbox, and saves a report of what it did and the pressure seen.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.broker import STAGES, Outgoing, PipelineBroker
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.errors import ConfigError, NightcrewError, QueueError
from nightcrew.log import describe_error, event, warning
from nightcrew.news import candidates as held_candidates
from nightcrew.news.admission import admit, count_articles
from nightcrew.news.report import PassReport, save_report
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

EXPENSIVE = ("enrich", "review", "write")
RELAY_GRACE = timedelta(seconds=10)  # the publisher's own fast path gets this long first
RELAY_BATCH = 500


def broker_of(runtime: Runtime) -> PipelineBroker:
    broker = runtime.news_adapters().pipeline
    if broker is None:
        raise ConfigError("the news pipeline needs NEWS_PIPELINE=rabbitmq and QUEUE_URL=amqp://…")
    return broker


# --- the outbox ---------------------------------------------------------------------------------
def outgoing(rows: list[dict[str, Any]]) -> list[Outgoing]:
    return [
        Outgoing(message_id=str(r["message_id"]), stage=r["stage"], body=dict(r["body"]))
        for r in rows
    ]


async def send_owed(broker: PipelineBroker, db: Database, rows: list[dict[str, Any]]) -> int:
    """Publish outbox rows just committed, then delete them. A broker that refuses leaves them
    for the relay: nothing is lost, the caller goes on."""
    if not rows:
        return 0
    try:
        await broker.publish(outgoing(rows))
    except QueueError as exc:
        warning("news.outbox.publish_deferred", messages=len(rows), error=describe_error(exc))
        return 0
    await db.execute(SQL["delete_sent"], {"ids": [r["id"] for r in rows]})
    return len(rows)


async def relay(broker: PipelineBroker, db: Database, now: datetime) -> int:
    """Publish whatever the outbox still holds from before ``now - RELAY_GRACE`` (a crash
    between commit and publish, a broker that was away). Rows are locked while published, so
    relays on many workers share the work."""
    sent = 0
    while True:
        async with db.transaction() as tx:
            rows = await tx.fetch(
                SQL["unsent"], {"before": now - RELAY_GRACE, "limit": RELAY_BATCH}
            )
            if not rows:
                return sent
            await broker.publish(outgoing(rows))
            await tx.execute(SQL["delete_sent"], {"ids": [r["id"] for r in rows]})
        sent += len(rows)
        event("news.outbox.relayed", messages=len(rows))
        if len(rows) < RELAY_BATCH:
            return sent


# --- release ------------------------------------------------------------------------------------
async def release_held(
    db: Database, settings: Settings, now: datetime, *, shard: str | None = None
) -> tuple[int, list[str], list[dict[str, Any]]]:
    """Held candidates (of ``shard``, or of every shard) into the stages that have room now:
    (how many, why the rest stay held, the outbox rows to send). A pass does it for its shard;
    every worker's housekeeping for all, so a drained stage refills within seconds."""
    released, reasons, owed = 0, [], []
    for stage in EXPENSIVE:
        async with db.transaction() as tx:
            waiting = await tx.fetch_one(
                SQL["held_in_stage"],
                {"shard": shard, "stage": stage, "now": now},
            )
            n = int(waiting["n"]) if waiting else 0
            if n == 0:
                continue
            admission = await admit(tx, settings, stage, n)
            if admission.reason is not None:
                reasons.append(admission.reason)
            if admission.room:
                rows = await tx.fetch(
                    SQL["release_held"],
                    {
                        "shard": shard,
                        "stage": stage,
                        "room": admission.room,
                        "now": now,
                    },
                )
                released += len(rows)
                owed += rows
    return released, reasons, owed


# --- the pass ---------------------------------------------------------------------------------
async def enqueue_shard(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: str = "manual"
) -> PassReport:
    """One pass over ``shard``: release held candidates into stages with room, enqueue the due
    sources, resend what must have been lost, relay the outbox; report."""
    started = time.perf_counter()
    db, settings, broker = runtime.db, runtime.settings, broker_of(runtime)
    now = clock.now()
    articles = await count_articles(db)
    released, reasons, owed = await release_held(db, settings, now, shard=shard)
    resent = await db.fetch(
        SQL["resend_stale"],
        {"shard": shard, "now": now, "resend_after": settings.news_resend_after_seconds},
    )
    sources = await db.fetch(
        SQL["enqueue_due_sources"],
        {"shard": shard, "now": now, "resend_after": settings.news_resend_after_seconds},
    )
    await send_owed(broker, db, owed + resent + sources)
    try:
        relayed = await relay(broker, db, now)
    except QueueError as exc:
        relayed = 0
        warning("news.outbox.relay_failed", error=describe_error(exc))
    by_source = await held_candidates.held_by_source(db, shard, states=("held", "queued"))
    stages: dict[str, dict[str, int]] = {s: {} for s in STAGES if s != "fetch"}
    for row in await db.fetch(SQL["shard_stages"], {"shard": shard}):
        stages[row["stage"]][row["state"]] = int(row["n"])
    previous = await db.fetch_one(SQL["previous_report"], {"shard": shard, "now": now})
    since = previous["at"] if previous is not None else None
    results = await db.fetch_one(
        SQL["shard_results_since"],
        {"shard": shard, "since": since or datetime.min.replace(tzinfo=now.tzinfo), "now": now},
    )
    waits = await db.fetch_one(SQL["shard_review_waits"], {"shard": shard})
    assert results is not None and waits is not None  # aggregates: always one row
    report = PassReport(
        shard=shard,
        trigger=trigger,
        queued_count=sum(by_source.values()),
        queued_by_source=by_source,
        deferred_count=sum(s.get("held", 0) for s in stages.values()),
        deferred_reasons=reasons,
        retried_count=int(waits["retried"]),
        enqueued_sources=len(sources),
        released_count=released,
        resent_count=len(resent),
        relayed_count=relayed,
        stages=stages,
        results_since=since,
        written_count=int(results["written"]),
        ai_reviewed_count=int(results["reviewed"]),
        accepted_count=int(results["accepted"]),
        rejected_count=int(results["rejected"]),
        redis_ai_review_lock_skipped_count=int(waits["lock_skipped"]),
        redis_enabled=runtime.news_adapters().redis_configured,
        backpressure_queue_limit=settings.ingestion_backpressure_queue_limit,
        backpressure_db_article_limit=settings.ingestion_backpressure_db_article_limit,
        backpressure_db_article_count=articles.n,
        backpressure_db_article_count_error=articles.error,
        duration_ms=round((time.perf_counter() - started) * 1000, 1),
    )
    await save_report(db, shard=shard, trigger=trigger, started_at=now, report=report.to_json())
    event(
        "news.pass_completed",
        shard=shard,
        enqueued_sources=len(sources),
        released=released,
        deferred=report.deferred_count,
    )
    return report


# --- observability ------------------------------------------------------------------------------
async def collect_metrics(runtime: Runtime, clock: Clock) -> None:
    """Per stage: queued, held, in flight, ready, dead letters, oldest age and the workers'
    totals — from PostgreSQL, and from the broker when it answers within its timeout."""
    metrics, now = runtime.metrics, clock.now()
    rows = {r["stage"]: r for r in await runtime.db.fetch(SQL["stage_metrics"])}
    totals = {r["stage"]: r for r in await runtime.db.fetch(SQL["stage_counters"])}
    broker = runtime.news_adapters().pipeline
    for stage in STAGES:
        row = rows.get(stage) or {"queued": 0, "held": 0, "oldest": None}
        queued = int(row["queued"])
        metrics.set("nightcrew_news_stage_queued", queued, stage=stage)
        metrics.set("nightcrew_news_stage_held", int(row["held"]), stage=stage)
        oldest = row["oldest"]
        age = (now - oldest).total_seconds() if oldest is not None else 0.0
        metrics.set("nightcrew_news_stage_oldest_age_seconds", max(0.0, age), stage=stage)
        total = totals.get(stage) or {"processed": 0, "failed": 0, "dead_lettered": 0}
        metrics.set_total("nightcrew_news_stage_processed_total", total["processed"], stage=stage)
        metrics.set_total("nightcrew_news_stage_failed_total", total["failed"], stage=stage)
        metrics.set_total(
            "nightcrew_news_stage_dead_lettered_total", total["dead_lettered"], stage=stage
        )
        if broker is None:
            continue
        try:
            async with asyncio.timeout(2):
                ready = await broker.ready(stage)
                dead = await broker.ready(stage, dlq=True)
        except (TimeoutError, NightcrewError) as exc:
            warning("news.metrics_broker_unavailable", error=describe_error(exc))
            broker = None
            continue
        metrics.set("nightcrew_news_stage_ready", ready, stage=stage)
        metrics.set("nightcrew_news_stage_in_flight", max(0, queued - ready), stage=stage)
        metrics.set("nightcrew_news_stage_dead_letters", dead, stage=stage)
