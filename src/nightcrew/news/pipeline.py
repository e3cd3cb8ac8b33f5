"""The pipeline engine on RabbitMQ (NEWS_PIPELINE=rabbitmq): the outbox, the pass, releasing
held candidates; its stage consumers are ``stages.py`` (run by ``worker.py``), calling the same
steps as the inline run (``inline.py``): ``admission``, ``items``, ``hydrate``, ``review``,
``write``, ``snapshot``.

PostgreSQL holds every candidate's stage and state (``news.candidates``); a broker message only
says "work on this now". Whatever owes a message writes it to ``news.outbox`` in the same
transaction as the state change that owes it; after the commit it is published (confirmed) and
deleted, and the relay publishes what a crash or an absent broker left behind — so nothing is
lost between the database and the broker, and a message sent twice finds its work done.

**Admission** (spec 001's backpressure, owned by the backend; ``admission.py``, the inline
run's rule): before a candidate enters an expensive stage (enrich, review, write), the load of
that stage *for its shard* — the shard's candidates queued for it, whether still in the outbox,
waiting in the queue or being worked on — is compared with INGESTION_BACKPRESSURE_QUEUE_LIMIT,
and the article table with INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT. Over a limit, the candidate
is ``held`` with the reason; nothing expensive runs for it until a pass or a worker's
housekeeping releases it, oldest first, into room its shard's stage has again — so a backlog
drains in batches of at most the limit, and a busy shard never holds another's work.

**The cost bound** (MAX_AI_REVIEWS, ``review.py``): per shard per pass, as per run inline. Each
pass opens its shard's budget window; the review stage spends one unit per model review it
starts (``spend_review``) and holds the candidate for a later pass once it is spent — kept,
never dropped or dead-lettered, and out of housekeeping's reach until the next pass lets it go.
The pass also works the translation backlog and the no-thumbnail retries (``upkeep``) under a
short PostgreSQL lease of its own, so two passes of a shard never both do it.

**The pass** (``news run`` in pipeline mode, and serve's news schedule) holds no lock while the
pipeline works: it enqueues the shard's due sources to ``fetch``, releases held candidates into
stages with room, relays the outbox, and saves a report of what it did and the pressure seen.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.broker import STAGES, Outgoing, PipelineBroker
from nightcrew.clock import Clock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.errors import ConfigError, NightcrewError, QueueError
from nightcrew.log import describe_error, event, warning
from nightcrew.news import hydrate, review
from nightcrew.news.admission import admit, count_articles, over_article_limit
from nightcrew.news.report import NewsReport, PassWork, RedisUse, pass_report, save_report
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
    """Held candidates (of ``shard``, or of every shard) into the stages that have room now,
    each shard's stage by its own room (``admission.admit``), oldest first: (how many, why the
    rest stay held, the outbox rows to send). A pass does it for its shard; every worker's
    housekeeping for all, so a drained stage refills within seconds. What the review budget
    held back is not released here until a pass of its shard lets it go."""
    released, reasons, owed = 0, [], []
    groups = await db.fetch(SQL["held_groups"], {"shard": shard, "now": now})
    order = {stage: n for n, stage in enumerate(EXPENSIVE)}
    for group in sorted(groups, key=lambda g: (g["shard"], order.get(g["stage"], len(order)))):
        async with db.transaction() as tx:
            admission = await admit(
                tx, settings, group["stage"], int(group["n"]), shard=group["shard"]
            )
            if admission.reason is not None and admission.reason not in reasons:
                reasons.append(admission.reason)
            if admission.room:
                rows = await tx.fetch(
                    SQL["release_held"],
                    {
                        "shard": group["shard"],
                        "stage": group["stage"],
                        "room": admission.room,
                        "now": now,
                    },
                )
                released += len(rows)
                owed += rows
    return released, reasons, owed


# --- the cost bound: MAX_AI_REVIEWS per shard per pass -------------------------------------------
def over_budget_reason(budget: int) -> str:
    return f"MAX_AI_REVIEWS {budget} reached for this pass; reviewed in a later pass"


async def open_review_budget(runtime: Runtime, shard: str, now: datetime) -> list[str]:
    """A pass opens its shard's budget window (nothing spent) and lets go of the oldest
    candidates the last window held back — at most the new budget (all when no model spends
    it) — for this pass to release. Why candidates still wait for a later pass, if any."""
    db, budget = runtime.db, runtime.settings.max_ai_reviews
    model = review.calls_a_model(runtime.news_adapters().reviewer)
    await db.execute(SQL["open_review_budget"], {"shard": shard, "now": now})
    await db.fetch(
        SQL["unhold_over_budget"],
        {"shard": shard, "budget": budget if model else None, "now": now},
    )
    row = await db.fetch_one(SQL["over_budget_waiting"], {"shard": shard})
    waiting = int(row["n"]) if row else 0
    if not waiting:
        return []
    return [f"MAX_AI_REVIEWS {budget} per pass: {waiting} waiting for a later pass"]


async def spend_review(runtime: Runtime, shard: str, url: str, fence: int, now: datetime) -> bool:
    """The review stage, at take, before its model call: may this review start? True when
    the reviewer is not a model (the offline rules cost nothing and spend no budget: see
    ``review.py``) or a unit of the shard's budget for this pass was left and is now spent.
    False: the budget is spent, and the candidate (under the fence its worker drew) is held
    for a later pass — kept, not dropped or dead-lettered, and out of reach of housekeeping's
    ``release_held`` until that pass. The bound counts model reviews started, a retry of one
    the model failed included."""
    if not review.calls_a_model(runtime.news_adapters().reviewer):
        return True
    budget = runtime.settings.max_ai_reviews
    spent = await runtime.db.fetch_one(
        SQL["spend_review"], {"shard": shard, "budget": budget, "now": now}
    )
    if spent is not None:
        return True
    await runtime.db.execute(
        SQL["hold_over_budget"],
        {"url": url, "fence": fence, "reason": over_budget_reason(budget), "now": now},
    )
    return False


# --- upkeep: the translation backlog and the no-thumbnail retry ----------------------------------
UPKEEP_LEASE_SECONDS = 120.0  # renewed before each translation: short, yet enough for a step


def upkeep_lease_name(shard: str) -> str:
    return f"news:upkeep:{shard}"


@dataclass(frozen=True, slots=True)
class Upkeep:
    """What a pass's upkeep did: ``ran`` False when another pass of the shard held its lease
    (or the article limit stopped it); the no-thumbnail retries tried; the backlog's
    translations saved."""

    ran: bool
    thumbnails_retried: int = 0
    translated: int = 0


async def upkeep(runtime: Runtime, clock: Clock, shard: str, *, stopped: bool = False) -> Upkeep:
    """What the inline run does after its batch, for the pipeline's shard: accepted articles
    still without a thumbnail tried again (``hydrate``), then — with a model — summaries whose
    translation failed translated (``review``, at most MAX_AI_REVIEWS), under a short
    PostgreSQL lease so two passes of one shard never both do it; a translation the model
    fails stays in the backlog for a later pass. ``stopped``: the article limit is reached,
    and nothing expensive runs (as inline)."""
    if stopped:
        return Upkeep(ran=False)
    db, settings, deps = runtime.db, runtime.settings, runtime.news_adapters()
    lease = await deps.leases.acquire(upkeep_lease_name(shard), UPKEEP_LEASE_SECONDS)
    if lease is None:
        event("news.upkeep_skipped", shard=shard, why="another pass of the shard holds it")
        return Upkeep(ran=False)
    try:
        now = clock.now()
        retries = await hydrate.thumbnail_retries(db, shard, now)
        await hydrate.retry_thumbnails(db, deps, retries, now)
        translated = 0
        if deps.reviewer.translation_enabled:
            backlog = await review.translation_backlog(db, shard, settings.max_ai_reviews)
            translated = await review.translate_backlog(
                db,
                deps.reviewer,
                backlog,
                still_held=lambda: deps.leases.extend(lease, UPKEEP_LEASE_SECONDS),
            )
    finally:
        await deps.leases.release(lease)
    event("news.upkeep", shard=shard, thumbnails_retried=len(retries), translated=translated)
    return Upkeep(ran=True, thumbnails_retried=len(retries), translated=translated)


# --- the pass ---------------------------------------------------------------------------------
async def enqueue_shard(
    runtime: Runtime, clock: Clock, shard: str, *, trigger: str = "manual"
) -> NewsReport:
    """One pass over ``shard``: release held candidates into stages with room, enqueue the due
    sources, resend what must have been lost, relay the outbox; report (``report.pass_report``:
    spec 001's fields, with the workers' results since the shard's previous report)."""
    started = time.perf_counter()
    redis = RedisUse(runtime.news_adapters())  # this process's Redis breaker, watched from now
    db, settings, broker = runtime.db, runtime.settings, broker_of(runtime)
    now = clock.now()
    articles = await count_articles(db)
    over_budget = await open_review_budget(runtime, shard, now)
    released, reasons, owed = await release_held(db, settings, now, shard=shard)
    reasons += over_budget
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
    kept = await upkeep(
        runtime, clock, shard, stopped=over_article_limit(settings, articles) is not None
    )
    report = await pass_report(
        db,
        settings,
        runtime.news_adapters(),
        shard=shard,
        trigger=trigger,
        now=now,
        work=PassWork(
            enqueued_sources=len(sources),
            released_count=released,
            resent_count=len(resent),
            relayed_count=relayed,
            deferred_reasons=reasons,
            article_count=articles.n,
            article_count_error=articles.error,
            translated_count=kept.translated,
            thumbnail_retries=kept.thumbnails_retried if kept.ran else None,
        ),
        redis=redis,
        duration_ms=round((time.perf_counter() - started) * 1000, 1),
    )
    await save_report(db, shard=shard, trigger=trigger, started_at=now, report=report)
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
