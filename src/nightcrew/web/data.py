"""What the dashboard shows, read from PostgreSQL into frozen records.

Every read is one of ``data.sql``'s named queries: read-only, indexed, bounded by a LIMIT
(lists are keyset-paginated, so page 10,000 costs what page 1 costs). Filters come from the
request already validated (``RunFilter``); nothing the request carries is put into SQL text.
"""

from __future__ import annotations

import base64
import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects_outbox
from nightcrew.errors import NightcrewError
from nightcrew.lifecycle.lanes import LANES
from nightcrew.log import describe_error
from nightcrew.setting_parsers import STAGES

if TYPE_CHECKING:
    from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

PAGE_SIZE = 50
RUN_STATUSES = ("running", "completed", "failed", "abandoned", "skipped")
_FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
_MAX_ID = 2**63 - 1
_MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"

# Fixed SQL fragments for the run filters; the values travel as parameters.
_LANE = "AND r.lane = %(lane)s"
_STATUS = "AND r.status = %(status)s"
_SKIPPED = "AND r.status = 'completed' AND (r.report ->> 'skipped') = 'true'"
_NOT_SKIPPED = "AND (r.report ->> 'skipped') IS DISTINCT FROM 'true'"


class BadRequest(NightcrewError, ValueError):
    """A filter or cursor the dashboard cannot use; the message names it."""


def _float(value: object) -> float | None:
    """A finite duration in milliseconds from a report, or None (a report is not trusted)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and 0 <= number < 1e12 else None


def _count(row: dict[str, Any] | None, key: str) -> int:
    """A count(*) column of a one-row answer (no row: 0)."""
    return int(row[key]) if row else 0


# --- cursors ---------------------------------------------------------------------------------
def encode_cursor(at: datetime, key: object) -> str:
    raw = f"{at.isoformat()}|{key}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, _, key = raw.partition("|")
        when = datetime.fromisoformat(at)
    except ValueError as exc:
        raise BadRequest("before: not a cursor this page made") from exc
    if when.tzinfo is None or not key:
        raise BadRequest("before: not a cursor this page made")
    return when, key


# --- runs ------------------------------------------------------------------------------------
def run_id(text: str) -> int | None:
    """A run id from a path or a cursor: digits within bigint, else None (a 404 or a 400, never
    a table scan)."""
    if not text.isdigit() or len(text) > 19 or int(text) > _MAX_ID:
        return None
    return int(text)


def _run_cursor(text: str) -> tuple[datetime, int]:
    """The (started_at, id) a runs page's "older" link carries."""
    at, key = decode_cursor(text)
    if (found := run_id(key)) is None:
        raise BadRequest("before: not a cursor this page made")
    return at, found


def _shown_status(status: str, skipped: bool | None) -> str:
    """A completed run whose report says it was skipped (a shard another worker held) shows
    as skipped."""
    return "skipped" if status == "completed" and skipped else status


def _duration(
    measured_ms: float | None, started_at: datetime, finished_at: datetime | None
) -> timedelta | None:
    """As the run measured it (a --now run's clock stands still), else from its row."""
    if measured_ms is not None:
        return timedelta(milliseconds=measured_ms)
    return finished_at - started_at if finished_at else None


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    lane: str | None = None
    status: str | None = None
    day: date | None = None
    before: str | None = None  # a cursor

    @classmethod
    def parse(cls, params: dict[str, str]) -> RunFilter:
        lane = params.get("lane") or None
        if lane is not None and (len(lane) > 200 or not lane.isprintable()):
            raise BadRequest("lane: not a lane name")
        status = params.get("status") or None
        if status is not None and status not in RUN_STATUSES:
            raise BadRequest(f"status: one of {', '.join(RUN_STATUSES)}")
        day = None
        if text := params.get("date"):
            try:
                day = date.fromisoformat(text)
            except ValueError:
                raise BadRequest("date: a day as YYYY-MM-DD") from None
            if not date(1970, 1, 1) <= day < date(9999, 1, 1):
                raise BadRequest("date: a day between 1970 and 9998")
        before = params.get("before") or None
        if before is not None:
            _run_cursor(before)
        return cls(lane=lane, status=status, day=day, before=before)

    def query(self, **changes: Any) -> dict[str, str]:
        """These filters as query parameters (for links), with ``changes`` applied."""
        values = {
            "lane": self.lane,
            "status": self.status,
            "date": self.day.isoformat() if self.day else None,
            "before": self.before,
            **changes,
        }
        return {k: str(v) for k, v in values.items() if v}


@dataclass(frozen=True, kw_only=True)
class RunRow:
    id: int
    lane: str
    trigger: str
    slot: datetime | None
    started_at: datetime
    finished_at: datetime | None
    status: str  # running / completed / failed / abandoned / skipped
    attempts: int
    error: str | None
    failures: int
    headline: dict[str, Any]
    duration_ms: float | None
    requested_by: str | None = None  # an operator's manual run: "dashboard ADDRESS", "cli"

    @property
    def duration(self) -> timedelta | None:
        return _duration(self.duration_ms, self.started_at, self.finished_at)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRow:
        return cls(
            id=row["id"],
            lane=row["lane"],
            trigger=row["trigger"],
            slot=row["slot"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            status=_shown_status(row["status"], row["skipped"]),
            attempts=row["attempts"],
            error=row["error"],
            failures=row["failures"] or 0,
            headline=dict(row["headline"] or {}),
            duration_ms=_float(row["duration_ms"]),
            requested_by=row.get("requested_by"),
        )


@dataclass(frozen=True, kw_only=True)
class RunPage:
    rows: list[RunRow]
    older: str | None  # the cursor of the next (older) page, if any


async def runs_page(db: Database, wanted: RunFilter, *, limit: int = PAGE_SIZE) -> RunPage:
    filters: list[str] = []
    if wanted.lane:
        filters.append(_LANE)
    if wanted.status == "skipped":
        filters.append(_SKIPPED)
    elif wanted.status:
        filters.append(_STATUS)
        if wanted.status == "completed":
            filters.append(_NOT_SKIPPED)
    since = _FAR_PAST
    before_at, before_id = _FAR_FUTURE, _MAX_ID
    if wanted.before:
        before_at, before_id = _run_cursor(wanted.before)
    if wanted.day:
        since = datetime.combine(wanted.day, time(), UTC)
        until = since + timedelta(days=1)
        if until <= before_at:  # the day's end is the nearer bound: (until, 0) is "< until"
            before_at, before_id = until, 0
    query = SQL["runs_page"].replace("/*filters*/", "\n   ".join(filters))
    rows = await db.fetch(
        query,
        {
            "lane": wanted.lane,
            "status": "completed" if wanted.status == "skipped" else wanted.status,
            "since": since,
            "before_at": before_at,
            "before_id": before_id,
            "limit": limit + 1,
        },
    )
    records = [RunRow.from_row(r) for r in rows[:limit]]
    older = encode_cursor(records[-1].started_at, records[-1].id) if len(rows) > limit else None
    return RunPage(rows=records, older=older)


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """One job of a lane run's report, read defensively (reports are stored JSON)."""

    name: str
    status: str
    duration_ms: float | None
    detail: str | None  # why it was skipped, or its error
    counts: dict[str, int | float]

    @classmethod
    def from_report(cls, name: str, job: object) -> JobRow:
        body = job if isinstance(job, dict) else {}
        status = body.get("status") if isinstance(body.get("status"), str) else "ok"
        detail = body.get("error") or body.get("skipped")
        counts = {
            k: v
            for k, v in sorted(body.items())
            if isinstance(v, int | float) and not isinstance(v, bool) and v and k != "duration_ms"
        }
        return cls(
            name=str(name),
            status=str(status),
            duration_ms=_float(body.get("duration_ms")),
            detail=str(detail) if detail else None,
            counts=counts,
        )


@dataclass(frozen=True, kw_only=True)
class RunDetail:
    id: int
    lane: str
    trigger: str
    slot: datetime | None
    started_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime | None
    status: str
    attempts: int
    report: dict[str, Any]  # {} when what is stored is not an object
    raw: Any  # what is stored, for the JSON view
    requested_by: str | None = None

    @property
    def duration(self) -> timedelta | None:
        measured = _float(self.report.get("duration_ms", self.report.get("durationMs")))
        return _duration(measured, self.started_at, self.finished_at)

    @property
    def jobs(self) -> list[JobRow]:
        jobs = self.report.get("jobs")
        if not isinstance(jobs, dict):
            return []
        # the lane's own order (stored JSON keeps none: jsonb orders keys by length)
        lane = LANES.get(self.lane)
        order = {job.name: n for n, job in enumerate(lane.jobs)} if lane else {}
        rows = [JobRow.from_report(name, job) for name, job in jobs.items()]
        return sorted(rows, key=lambda r: (order.get(r.name, len(order)), r.name))


async def run_detail(db: Database, run_id: int) -> RunDetail | None:
    row = await db.fetch_one(SQL["run"], {"id": run_id})
    if row is None:
        return None
    report = row["report"] if isinstance(row["report"], dict) else {}
    return RunDetail(
        id=row["id"],
        lane=row["lane"],
        trigger=row["trigger"],
        slot=row["slot"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        heartbeat_at=row["heartbeat_at"],
        status=_shown_status(row["status"], report.get("skipped") is True),
        attempts=row["attempts"],
        report=report,
        raw=row["report"],
        requested_by=row.get("requested_by"),
    )


@dataclass(frozen=True, kw_only=True)
class LaneState:
    lane: str
    last_id: int
    last_status: str
    last_started_at: datetime
    last_completed_at: datetime | None


async def latest_per_lane(db: Database) -> list[LaneState]:
    return [
        LaneState(
            lane=r["lane"],
            last_id=r["id"],
            last_status=_shown_status(r["status"], r["skipped"]),
            last_started_at=r["started_at"],
            last_completed_at=r["last_completed_at"],
        )
        for r in await db.fetch(SQL["latest_per_lane"])
    ]


# --- deletions -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Deletion:
    podcast_id: str
    slug: str
    deleted_at: datetime
    storage_cleaned_at: datetime | None
    invalidated_at: datetime | None
    objects_deleted: int
    bytes_deleted: int
    objects_left: int | None
    attempts: int
    last_error: str | None

    @property
    def finished(self) -> bool:
        return self.storage_cleaned_at is not None and self.invalidated_at is not None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Deletion:
        return cls(
            podcast_id=str(row["podcast_id"]),
            slug=row["slug"],
            deleted_at=row["deleted_at"],
            storage_cleaned_at=row["storage_cleaned_at"],
            invalidated_at=row["invalidated_at"],
            objects_deleted=row["objects_deleted"],
            bytes_deleted=row["bytes_deleted"],
            objects_left=row["objects_left"],
            attempts=row["attempts"],
            last_error=row["last_error"],
        )


@dataclass(frozen=True, kw_only=True)
class DeletionsView:
    unfinished: list[Deletion]  # the oldest 100
    unfinished_count: int
    page: list[Deletion]
    older: str | None
    recent_podcasts: int
    recent_objects: int
    recent_bytes: int


async def deletions(
    db: Database, now: datetime, before: str | None, *, limit: int = PAGE_SIZE
) -> DeletionsView:
    before_at, before_id = _FAR_FUTURE, _MAX_UUID
    if before:
        before_at, before_id = decode_cursor(before)
        try:
            before_id = str(uuid.UUID(before_id))
        except ValueError:
            raise BadRequest("before: not a cursor this page made") from None
    unfinished = await db.fetch(SQL["deletions_unfinished"], {"limit": 100})
    unfinished_count = await db.fetch_one(SQL["deletions_unfinished_count"])
    rows = await db.fetch(
        SQL["deletions_page"],
        {"before_at": before_at, "before_id": before_id, "limit": limit + 1},
    )
    page = [Deletion.from_row(r) for r in rows[:limit]]
    totals = await db.fetch_one(SQL["deletions_recent_totals"], {"since": now - timedelta(30)})
    older = encode_cursor(page[-1].deleted_at, page[-1].podcast_id) if len(rows) > limit else None
    return DeletionsView(
        unfinished=[Deletion.from_row(r) for r in unfinished],
        unfinished_count=_count(unfinished_count, "n"),
        page=page,
        older=older,
        recent_podcasts=_count(totals, "podcasts"),
        recent_objects=_count(totals, "objects"),
        recent_bytes=_count(totals, "bytes"),
    )


# --- overage ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SuspendedFeed:
    slug: str
    title: str
    suspended_at: datetime


@dataclass(frozen=True, kw_only=True)
class OverageAccount:
    id: str
    owner_email: str | None
    since: datetime
    deadline: datetime | None
    stage: int | None  # -1 armed, 0-3 warnings sent, 4 suspended
    last_nag_at: datetime | None
    podcasts: int
    podcast_cap: int | None
    bytes: int
    storage_cap_gb: float | None
    suspended: list[SuspendedFeed] = field(default_factory=list)

    def days_left(self, now: datetime) -> int | None:
        if self.deadline is None:
            return None
        return max(0, (self.deadline - now).days)

    @property
    def podcasts_over(self) -> int:
        if self.podcast_cap is None:
            return 0
        return max(0, self.podcasts - int(self.podcast_cap))

    @property
    def bytes_over(self) -> int:
        if self.storage_cap_gb is None:
            return 0
        return max(0, self.bytes - int(float(self.storage_cap_gb) * 1_000_000_000))


@dataclass(frozen=True, kw_only=True)
class Restoration:
    run_id: int
    at: datetime
    account_id: str
    since: str | None
    podcasts: list[str]


@dataclass(frozen=True, kw_only=True)
class OverageView:
    accounts: list[OverageAccount]  # soonest deadline first, at most 200
    on_clock: int
    restored: list[Restoration]


async def overage(db: Database, now: datetime, *, limit: int = 200) -> OverageView:
    rows = await db.fetch(SQL["overage_clocks"], {"now": now, "limit": limit})
    feeds: dict[str, list[SuspendedFeed]] = {}
    if rows:
        for f in await db.fetch(SQL["suspended_feeds"], {"accounts": [r["id"] for r in rows]}):
            feeds.setdefault(str(f["account_id"]), []).append(
                SuspendedFeed(
                    slug=f["slug"], title=f["title"], suspended_at=f["overage_suspended_at"]
                )
            )
    accounts = [
        OverageAccount(
            id=str(r["id"]),
            owner_email=r["owner_email"],
            since=r["since"],
            deadline=r["deadline"],
            stage=r["stage"],
            last_nag_at=r["last_nag_at"],
            podcasts=int(r["podcasts"]),
            podcast_cap=None if r["podcast_cap"] is None else int(r["podcast_cap"]),
            bytes=int(r["bytes"] or 0),
            storage_cap_gb=None if r["storage_cap_gb"] is None else float(r["storage_cap_gb"]),
            suspended=feeds.get(str(r["id"]), []),
        )
        for r in rows
    ]
    restored = [
        Restoration(
            run_id=r["run_id"],
            at=r["started_at"],
            account_id=str(r["account_id"]),
            since=r["since"],
            podcasts=[str(p) for p in (r["podcasts"] or [])],
        )
        for r in await db.fetch(
            SQL["overage_restored"],
            {"since": now - timedelta(days=30), "until": now + timedelta(days=1), "limit": 200},
        )
    ]
    on_clock = await db.fetch_one(SQL["overage_clock_count"])
    return OverageView(accounts=accounts, on_clock=_count(on_clock, "n"), restored=restored)


# --- watchdogs -------------------------------------------------------------------------------
WATCHDOG_COUNTS = (
    "items_requeued",
    "links_requeued",
    "previews_canceled",
    "media_jobs_flagged",
)


@dataclass(frozen=True, kw_only=True)
class WatchdogHour:
    hour: datetime
    runs: int
    counts: dict[str, int]

    @property
    def resent(self) -> int:
        return self.counts.get("items_requeued", 0) + self.counts.get("links_requeued", 0)


@dataclass(frozen=True, kw_only=True)
class WatchdogsView:
    since: datetime
    hours: list[WatchdogHour]  # every hour of the window, zeros included
    rescues: list[dict[str, Any]]

    def total(self, key: str) -> int:
        return sum(h.counts.get(key, 0) for h in self.hours)


async def watchdogs(db: Database, now: datetime) -> WatchdogsView:
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    since = end - timedelta(hours=24)
    params = {"since": since, "until": end, "origin": since}
    found = {
        r["hour"]: WatchdogHour(
            hour=r["hour"],
            runs=int(r["runs"]),
            counts={k: int(r[k]) for k in (*WATCHDOG_COUNTS, "items_rescued", "effects_retried")},
        )
        for r in await db.fetch(SQL["watchdog_hours"], params)
    }
    hours = [
        found.get(since + timedelta(hours=i))
        or WatchdogHour(hour=since + timedelta(hours=i), runs=0, counts={})
        for i in range(24)
    ]
    rescues = await db.fetch(SQL["watchdog_rescues"], {**params, "limit": 50})
    return WatchdogsView(since=since, hours=hours, rescues=rescues)


# --- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EffectsView:
    counts: dict[str, dict[str, int]]
    failing: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    news_candidates: list[dict[str, Any]]
    due: list[dict[str, Any]] = field(default_factory=list)


async def effects(db: Database) -> EffectsView:
    return EffectsView(
        counts=await effects_outbox.counts(db),
        failing=await db.fetch(SQL["effects_failing"], {"limit": 50}),
        dead=await db.fetch(SQL["effects_dead"], {"limit": 50}),
        due=await db.fetch(SQL["effects_due"], {"limit": 50}),
        news_candidates=await db.fetch(SQL["news_candidates"]),
    )


# --- news ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ShardNews:
    shard: str
    latest_at: datetime | None
    latest_trigger: str | None
    latest: dict[str, Any]
    series: list[dict[str, Any]]  # oldest first: started_at, queued, deferred, processed
    recent: list[dict[str, Any]] = field(default_factory=list)  # newest first, with counts


@dataclass(frozen=True, kw_only=True)
class NewsView:
    shards: list[ShardNews]
    parked: list[dict[str, Any]]  # the newest 100
    parked_count: int
    sources: int
    active: int
    refused: list[dict[str, Any]] = field(default_factory=list)  # for their address, not parked


async def news(db: Database, *, points: int = 48) -> NewsView:
    shards = [r["shard"] for r in await db.fetch(SQL["news_shards"])]
    latest = {r["shard"]: r for r in await db.fetch(SQL["news_latest"], {"shards": shards})}
    series: dict[str, list[dict[str, Any]]] = {}
    for r in await db.fetch(SQL["news_series"], {"shards": shards, "points": points}):
        series.setdefault(r["shard"], []).append(r)
    recent: dict[str, list[dict[str, Any]]] = {}
    for r in await db.fetch(SQL["news_recent_runs"], {"shards": shards, "limit": RECENT_RUNS}):
        recent.setdefault(r["shard"], []).append(_recent_run(r))
    counts = await db.fetch_one(SQL["news_source_counts"])
    return NewsView(
        shards=[
            ShardNews(
                shard=s,
                latest_at=latest[s]["started_at"] if s in latest else None,
                latest_trigger=latest[s]["trigger"] if s in latest else None,
                latest=latest[s]["report"] if s in latest else {},
                series=series.get(s, []),
                recent=recent.get(s, []),
            )
            for s in shards
        ],
        parked=await db.fetch(SQL["news_parked"], {"limit": 100}),
        refused=await db.fetch(SQL["news_address_refused"], {"limit": 100}),
        parked_count=_count(counts, "parked"),
        sources=_count(counts, "sources"),
        active=_count(counts, "active"),
    )


# --- the overview's counts -------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Counts:
    effects_pending: int
    effects_dead: int
    deletion_leftovers: int
    on_clock: int
    parked: int


async def counts(db: Database) -> Counts:
    owed = await effects_outbox.counts(db)
    leftovers = await db.fetch_one(SQL["deletions_unfinished_count"])
    on_clock = await db.fetch_one(SQL["overage_clock_count"])
    sources = await db.fetch_one(SQL["news_source_counts"])
    return Counts(
        effects_pending=sum(k["pending"] for k in owed.values()),
        effects_dead=sum(k["dead"] for k in owed.values()),
        deletion_leftovers=_count(leftovers, "n"),
        on_clock=_count(on_clock, "n"),
        parked=_count(sources, "parked"),
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


def _recent_run(row: dict[str, Any]) -> dict[str, Any]:
    """One of a shard's recent runs, read defensively (a report is stored JSON)."""
    report = row["report"] if isinstance(row["report"], dict) else {}
    # a pipeline pass writes nothing itself: what was written, its workers' since the last one
    workers = report.get("workers")
    done: dict[str, Any] = workers if isinstance(workers, dict) else report
    errors = report.get("fetchErrors")
    return {
        "started_at": row["started_at"],
        "trigger": row["trigger"],
        "status": report.get("status") or ("skipped" if report.get("skipped") else "completed"),
        "counts": {
            label: int(v)
            for key, label in _RUN_COUNTS
            if isinstance(v := (done if key in _DONE_COUNTS else report).get(key), int)
            and not isinstance(v, bool)
        },
        "fetch_errors": len(errors) if isinstance(errors, list) else 0,
        "duration_ms": _float(report.get("durationMs")),
    }


def refusal_hints(sources: list[dict[str, Any]], allowed_private_hosts: str) -> dict[int, str]:
    """For each source a run refuses (or refused) for its feed's address: what lets it be
    fetched, and that enabling it frees it now (else it waits for its next check)."""
    from nightcrew.news.sources.registry import refusal_hint

    hints: dict[int, str] = {}
    for source in sources:
        found = refusal_hint([str(source["feed_url"])], allowed_private_hosts)
        error = str(source.get("last_error") or "")
        if found:
            hints[int(source["id"])] = f"{found[0]}. Enable frees it at once after that."
        elif _ADDRESS_REFUSED in error or "internal name" in error or "non-public" in error:
            hints[int(source["id"])] = (
                "Refused for its address by an earlier run; NEWS_ALLOWED_PRIVATE_HOSTS now "
                "allows it (or its address changed): Enable fetches it on the next run."
            )
    return hints


_ADDRESS_REFUSED = "is not a public address"


@dataclass(frozen=True, kw_only=True)
class DeadLetters:
    """The RabbitMQ pipeline's dead letters, the first few of each stage."""

    letters: dict[str, list[dict[str, Any]]]  # stage → letters
    counts: dict[str, int]  # stage → letters waiting
    problem: str | None = None  # RabbitMQ could not be read: said, not a failed page


LETTERS_SHOWN = 50


async def dead_letters(runtime: Runtime | None) -> DeadLetters | None:
    """None when this process has no pipeline (NEWS_PIPELINE=inline): nothing to show."""
    if runtime is None or runtime.settings.news_pipeline != "rabbitmq":
        return None
    from nightcrew.news.engines.pipeline import dlq, outbox

    letters: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, int] = {}
    try:
        broker = outbox.broker_of(runtime)
        for stage in STAGES:
            counts[stage] = await broker.ready(stage, dlq=True)
            if counts[stage]:
                letters[stage] = [
                    {
                        "id": x.message_id,
                        "stage": x.stage,
                        "deliveries": x.deliveries,
                        "error": x.error,
                        "what": str(x.body.get("url") or f"source {x.body.get('source_id', '?')}"),
                    }
                    for x in await dlq.list_dead(runtime, stage, limit=LETTERS_SHOWN)
                ]
    except NightcrewError as exc:
        return DeadLetters(letters=letters, counts=counts, problem=describe_error(exc))
    return DeadLetters(letters=letters, counts=counts)


async def live_values(db: Database) -> dict[str, int]:
    """The counts the pages refresh without a reload, by their ``data-live`` keys."""
    owed = await effects_outbox.counts(db)
    overview = await counts(db)
    sources = await db.fetch_one(SQL["news_source_counts"])
    values = {
        "effects.pending": overview.effects_pending,
        "effects.dead": overview.effects_dead,
        "deletions.leftovers": overview.deletion_leftovers,
        "overage.on_clock": overview.on_clock,
        "news.parked": overview.parked,
        "news.sources": _count(sources, "sources"),
        "news.active": _count(sources, "active"),
    }
    for kind, c in owed.items():
        values[f"effects.{kind}.pending"] = c["pending"]
        values[f"effects.{kind}.dead"] = c["dead"]
    return values


_MAX_NAMED = 500


def _ids_in(value: Any, found: set[str]) -> None:
    """Every UUID a stored report names (podcast_id fields, import_ids, job_ids, …)."""
    if isinstance(value, dict):
        for item in value.values():
            _ids_in(item, found)
    elif isinstance(value, list):
        for item in value:
            _ids_in(item, found)
    elif isinstance(value, str) and len(value) == 36 and len(found) < _MAX_NAMED:
        try:
            found.add(str(uuid.UUID(value)))
        except ValueError:
            pass


async def run_names(db: Database, report: dict[str, Any]) -> dict[str, str]:
    """Names for the ids a run's report carries: titles while the rows exist (a deleted
    podcast is named by the slug its report kept)."""
    ids: set[str] = set()
    _ids_in(report, ids)
    if not ids:
        return {}
    names: dict[str, str] = {}
    for row in await db.fetch(SQL["run_names"], {"ids": sorted(ids)}):
        title = f"“{row['title']}”" if row["title"] else str(row["id"])[:8]
        names[row["id"]] = {
            "podcast": title,
            "import": f"the import preview of {title}",
            "media_job": f"a media job on {title}",
        }[row["kind"]]
    return names
