"""The pipeline's figures for /metrics: per stage, queued, held, in flight, ready, dead
letters, the oldest age, and the workers' totals (``news.stage_counters``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from nightcrew.clock import Clock
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, warning
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageNow:
    """A stage's candidates now (``stage_metrics``; a stage with none has no row)."""

    stage: str
    queued: int = 0
    held: int = 0
    oldest: datetime | None = None  # the oldest queued one's last change


@dataclass(frozen=True, kw_only=True, slots=True)
class _Totals:
    """The workers' totals of a stage (``stage_counters``; none yet: no row)."""

    stage: str
    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0


async def add_counters(db: Database, counts: dict[str, Counter[str]]) -> None:
    """A worker's counts since its last flush (``processed``, ``failed``, ``dead``, by stage)
    added to the totals every process shares."""
    names = sorted(set().union(*(c.keys() for c in counts.values())))
    if not names:
        return
    await db.execute(
        SQL["add_counters"],
        {
            "stages": names,
            "processed": [counts["processed"][n] for n in names],
            "failed": [counts["failed"][n] for n in names],
            "dead": [counts["dead"][n] for n in names],
        },
    )


async def collect_metrics(runtime: Runtime, clock: Clock) -> None:
    """Per stage: queued, held, in flight, ready, dead letters, oldest age and the workers'
    totals — from PostgreSQL, and from the broker when it answers within its timeout."""
    metrics, now = runtime.metrics, clock.now()
    figures = {r.stage: r for r in await runtime.db.fetch_as(_StageNow, SQL["stage_metrics"])}
    totals = {r.stage: r for r in await runtime.db.fetch_as(_Totals, SQL["stage_counters"])}
    broker = runtime.news_adapters().pipeline
    for stage in STAGES:
        current = figures.get(stage) or _StageNow(stage=stage)
        queued = current.queued
        metrics.set("nightcrew_news_stage_queued", queued, stage=stage)
        metrics.set("nightcrew_news_stage_held", current.held, stage=stage)
        oldest = current.oldest
        age = (now - oldest).total_seconds() if oldest is not None else 0.0
        metrics.set("nightcrew_news_stage_oldest_age_seconds", max(0.0, age), stage=stage)
        total = totals.get(stage) or _Totals(stage=stage)
        metrics.set_total("nightcrew_news_stage_processed_total", total.processed, stage=stage)
        metrics.set_total("nightcrew_news_stage_failed_total", total.failed, stage=stage)
        metrics.set_total(
            "nightcrew_news_stage_dead_lettered_total", total.dead_lettered, stage=stage
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
