"""The news worker: each shard's recent runs, parked and refused sources, dead letters."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from nightcrew import narrate, operator_actions
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error
from nightcrew.news.report import SavedReport
from nightcrew.news.sources.registry import Source
from nightcrew.setting_parsers import STAGES
from nightcrew.web.charts import Bar, bar_chart
from nightcrew.web.pages.base import (
    Pages,
    finite_ms,
)

if TYPE_CHECKING:
    from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

NEWS_ACTIONS = (
    "news.dlq_replay",
    "news.dlq_purge",
    "news.source_enable",
    "news.source_disable",
    "runs.run_now",
)


# --- news ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class SeriesPoint:
    """One report of a shard, for its queued/deferred chart (``news_series``)."""

    shard: str
    started_at: datetime
    queued: Decimal
    deferred: Decimal
    processed: Decimal  # written: a pass's workers' since the report before it


@dataclass(frozen=True, kw_only=True, slots=True)
class RecentRun:
    """One of a shard's recent runs, as the page lists it."""

    started_at: datetime
    trigger: str
    status: str
    counts: dict[str, int]  # by the page's labels: queued, written, accepted, …
    fetch_errors: int
    duration_ms: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TroubledSource(Source):
    """A parked source (``news_parked``), or one refused for its address
    (``news_address_refused``)."""

    consecutive_failures: int
    last_error: str | None
    parked_at: datetime | None = None  # a parked one's
    next_check_at: datetime | None = None  # a refused one's


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceCounts:
    sources: int  # ``news_source_counts``
    active: int
    parked: int


async def source_counts(db: Database) -> SourceCounts:
    """How many sources there are, how many are enabled, how many parked (the overview too)."""
    counts = await db.fetch_one_as(SourceCounts, SQL["news_source_counts"])
    return counts or SourceCounts(sources=0, active=0, parked=0)


async def shards(db: Database) -> list[str]:
    """Every shard with a source, in order (the page's sections, the run-now lanes)."""
    return await db.fetch_values(str, SQL["news_shards"])


@dataclass(frozen=True, kw_only=True)
class ShardNews:
    shard: str
    latest_at: datetime | None
    latest_trigger: str | None
    latest: JsonObject  # its latest report
    series: list[SeriesPoint]  # oldest first
    recent: list[RecentRun] = field(default_factory=list)  # newest first


@dataclass(frozen=True, kw_only=True)
class NewsView:
    shards: list[ShardNews]
    parked: list[TroubledSource]  # the newest 100
    parked_count: int
    sources: int
    active: int
    refused: list[TroubledSource] = field(default_factory=list)  # for their address, not parked


async def news(db: Database, *, points: int = 48) -> NewsView:
    shard_names = await shards(db)
    saved = await db.fetch_as(
        SavedReport, SQL["news_recent_runs"], {"shards": shard_names, "limit": RECENT_RUNS}
    )
    latest: dict[str, SavedReport] = {}
    recent: dict[str, list[RecentRun]] = {}
    for r in saved:  # each shard's newest first
        latest.setdefault(r.shard, r)
        recent.setdefault(r.shard, []).append(_recent_run(r))
    series: dict[str, list[SeriesPoint]] = {}
    for p in await db.fetch_as(
        SeriesPoint, SQL["news_series"], {"shards": shard_names, "points": points}
    ):
        series.setdefault(p.shard, []).append(p)
    counts = await source_counts(db)
    return NewsView(
        shards=[
            ShardNews(
                shard=s,
                latest_at=latest[s].started_at if s in latest else None,
                latest_trigger=latest[s].trigger if s in latest else None,
                latest=latest[s].report if s in latest else {},
                series=series.get(s, []),
                recent=recent.get(s, []),
            )
            for s in shard_names
        ],
        parked=await db.fetch_as(TroubledSource, SQL["news_parked"], {"limit": 100}),
        refused=await db.fetch_as(TroubledSource, SQL["news_address_refused"], {"limit": 100}),
        parked_count=counts.parked,
        sources=counts.sources,
        active=counts.active,
    )


RECENT_RUNS = 10
_RUN_COUNTS = (
    ("queuedCount", "queued"),
    ("processedCount", "written"),
    ("acceptedCount", "accepted"),
    ("rejectedCount", "rejected"),
    ("deferredCount", "deferred"),
)


_DONE_COUNTS = ("processedCount", "acceptedCount", "rejectedCount")


def _recent_run(saved: SavedReport) -> RecentRun:
    """One of a shard's recent runs, read defensively (a report is stored JSON)."""
    report: JsonObject = saved.report if isinstance(saved.report, dict) else {}
    # a pipeline pass writes nothing itself: what was written, its workers' since the last one
    workers = report.get("workers")
    done: JsonObject = workers if isinstance(workers, dict) else report
    errors = report.get("fetchErrors")
    return RecentRun(
        started_at=saved.started_at,
        trigger=saved.trigger,
        status=report.get("status") or ("skipped" if report.get("skipped") else "completed"),
        counts={
            label: int(v)
            for key, label in _RUN_COUNTS
            if isinstance(v := (done if key in _DONE_COUNTS else report).get(key), int)
            and not isinstance(v, bool)
        },
        fetch_errors=len(errors) if isinstance(errors, list) else 0,
        duration_ms=finite_ms(report.get("durationMs")),
    )


def refusal_hints(sources: list[TroubledSource], allowed_private_hosts: str) -> dict[int, str]:
    """For each source a run refuses (or refused) for its feed's address: what lets it be
    fetched, and that enabling it frees it now (else it waits for its next check)."""
    from nightcrew.news.sources.registry import refusal_hint

    hints: dict[int, str] = {}
    for source in sources:
        found = refusal_hint([source.feed_url], allowed_private_hosts)
        error = source.last_error or ""
        if found:
            hints[source.id] = f"{found[0]}. Enable frees it at once after that."
        elif _ADDRESS_REFUSED in error or "internal name" in error or "non-public" in error:
            hints[source.id] = (
                "Refused for its address by an earlier run; NEWS_ALLOWED_PRIVATE_HOSTS now "
                "allows it (or its address changed): Enable fetches it on the next run."
            )
    return hints


_ADDRESS_REFUSED = "is not a public address"


@dataclass(frozen=True, kw_only=True, slots=True)
class LetterLine:
    """A dead letter as the page lists it."""

    id: str
    stage: str
    deliveries: int
    error: str
    what: str  # the candidate's URL, or "source N"


@dataclass(frozen=True, kw_only=True)
class DeadLetters:
    """The RabbitMQ pipeline's dead letters, the first few of each stage."""

    letters: dict[str, list[LetterLine]]  # stage → letters
    counts: dict[str, int]  # stage → letters waiting
    problem: str | None = None  # RabbitMQ could not be read: said, not a failed page


LETTERS_SHOWN = 50


async def dead_letters(runtime: Runtime | None) -> DeadLetters | None:
    """None when this process has no pipeline (NEWS_PIPELINE=inline): nothing to show."""
    if runtime is None or runtime.settings.news_pipeline != "rabbitmq":
        return None
    from nightcrew.news.engines.pipeline import dlq, message_outbox

    letters: dict[str, list[LetterLine]] = {}
    counts: dict[str, int] = {}
    try:
        broker = message_outbox.broker_of(runtime)
        for stage in STAGES:
            counts[stage] = await broker.ready(stage, dlq=True)
            if counts[stage]:
                letters[stage] = [
                    LetterLine(
                        id=x.message_id,
                        stage=x.stage,
                        deliveries=x.deliveries,
                        error=x.error,
                        what=str(x.body.get("url") or f"source {x.body.get('source_id', '?')}"),
                    )
                    for x in await dlq.list_dead(runtime, stage, limit=LETTERS_SHOWN)
                ]
    except NightcrewError as exc:
        return DeadLetters(letters=letters, counts=counts, problem=describe_error(exc))
    return DeadLetters(letters=letters, counts=counts)


async def show(pages: Pages, request: Request) -> Response:
    view = await news(pages.ctx.db)
    charts = {
        s.shard: bar_chart(
            [
                Bar(
                    label="",
                    value=int(p.queued) + int(p.deferred),
                    tip=f"{p.started_at.astimezone(UTC):%Y-%m-%d %H:%M} — "
                    f"{p.queued} queued, {p.deferred} deferred",
                )
                for p in s.series
            ],
            title=f"Stories queued and deferred per run, shard {s.shard}",
            height=90,
        )
        for s in view.shards
    }
    letters = await dead_letters(pages.ctx.runtime)
    return pages.render(
        request,
        "news.html",
        title="News",
        view=view,
        charts=charts,
        sentences={s.shard: narrate.news_sentences(s.latest) for s in view.shards},
        letters=letters,
        refusal_hints=refusal_hints(
            view.parked,
            pages.ctx.runtime.settings.news_allowed_private_hosts if pages.ctx.runtime else "",
        ),
        recent_actions=await operator_actions.recent(pages.ctx.db, actions=NEWS_ACTIONS),
        live=True,
    )
