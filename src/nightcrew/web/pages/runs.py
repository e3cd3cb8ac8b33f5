"""The run history: the list (filtered, keyset-paginated), one run in words, its stored JSON."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from nightcrew import narrate, operator_actions
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle.lanes import LANES
from nightcrew.web import actions as action_doors
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS
from nightcrew.web.pages.base import (
    FAR_FUTURE,
    FAR_PAST,
    MAX_ID,
    PAGE_SIZE,
    BadRequest,
    Pages,
    decode_cursor,
    encode_cursor,
    finite_ms,
    pretty,
)

SQL = load_queries(__file__)

RUN_STATUSES = ("running", "completed", "failed", "abandoned", "skipped")
LANE_NAMES = ("daily", "minute")
RUN_ACTIONS = ("runs.run_now",)


# Fixed SQL fragments for the run filters; the values travel as parameters.
_LANE = "AND r.lane = %(lane)s"
_STATUS = "AND r.status = %(status)s"
_SKIPPED = "AND r.status = 'completed' AND (r.report ->> 'skipped') = 'true'"
_NOT_SKIPPED = "AND (r.report ->> 'skipped') IS DISTINCT FROM 'true'"


# --- runs ------------------------------------------------------------------------------------
def run_id(text: str) -> int | None:
    """A run id from a path or a cursor: digits within bigint, else None (a 404 or a 400, never
    a table scan)."""
    if not text.isdigit() or len(text) > 19 or int(text) > MAX_ID:
        return None
    return int(text)


def _run_cursor(text: str) -> tuple[datetime, int]:
    """The (started_at, id) a runs page's "older" link carries."""
    at, key = decode_cursor(text)
    if (found := run_id(key)) is None:
        raise BadRequest("before: not a cursor this page made")
    return at, found


def reported_ms(report: JsonObject) -> object:
    """The duration a stored report says it took: ``durationMs``, or ``duration_ms`` in a
    lane's report stored before the lanes spelled it as every other report does."""
    return report.get("durationMs", report.get("duration_ms"))


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


@dataclass(frozen=True, kw_only=True, slots=True)
class _RunColumns:
    """The columns of ``nightcrew.runs`` both the list and a run's page read."""

    id: int
    lane: str
    trigger: str
    slot: datetime | None
    started_at: datetime
    finished_at: datetime | None
    status: str
    attempts: int
    requested_by: str | None = None  # an operator's manual run: "dashboard ADDRESS", "cli"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow(_RunColumns):
    """A row of ``runs_page``: a listed run, its status as shown (a skipped shard's run is
    ``skipped``) and the report's few fields the list shows, read in SQL."""

    error: str | None
    failures: int
    headline: dict[str, int | float]  # the report's nonzero numbers (runs.sql)
    duration_ms: str | None  # as stored: a report is not trusted (finite_ms reads it)

    @property
    def duration(self) -> timedelta | None:
        return _duration(finite_ms(self.duration_ms), self.started_at, self.finished_at)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Named:
    id: str
    kind: str
    title: str | None


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
    since = FAR_PAST
    before_at, before_id = FAR_FUTURE, MAX_ID
    if wanted.before:
        before_at, before_id = _run_cursor(wanted.before)
    if wanted.day:
        since = datetime.combine(wanted.day, time(), UTC)
        until = since + timedelta(days=1)
        if until <= before_at:  # the day's end is the nearer bound: (until, 0) is "< until"
            before_at, before_id = until, 0
    query = SQL["runs_page"].replace("/*filters*/", "\n   ".join(filters))
    rows = await db.fetch_as(
        RunRow,
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
    shown = rows[:limit]
    older = encode_cursor(shown[-1].started_at, shown[-1].id) if len(rows) > limit else None
    return RunPage(rows=shown, older=older)


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
            if isinstance(v, int | float)
            and not isinstance(v, bool)
            and v
            and k not in ("durationMs", "duration_ms")
        }
        return cls(
            name=str(name),
            status=str(status),
            duration_ms=finite_ms(reported_ms(body)),
            detail=str(detail) if detail else None,
            counts=counts,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunDetail(_RunColumns):
    """A row of ``run``: one run, its status as shown (as in the list) and its report as
    stored (``raw``, for the JSON view)."""

    heartbeat_at: datetime | None
    raw: Any

    @property
    def report(self) -> JsonObject:
        """The stored report; {} when what is stored is not an object."""
        return self.raw if isinstance(self.raw, dict) else {}

    @property
    def duration(self) -> timedelta | None:
        return _duration(finite_ms(reported_ms(self.report)), self.started_at, self.finished_at)

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
    return await db.fetch_one_as(RunDetail, SQL["run"], {"id": run_id})


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneState:
    """A row of ``latest_per_lane``: a lane's newest run (its status as the list shows it) and
    its newest completed one."""

    lane: str
    last_id: int
    last_status: str
    last_started_at: datetime
    last_completed_at: datetime | None


async def latest_per_lane(db: Database) -> list[LaneState]:
    return await db.fetch_as(LaneState, SQL["latest_per_lane"])


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


async def run_names(db: Database, report: JsonObject) -> dict[str, str]:
    """Names for the ids a run's report carries: titles while the rows exist (a deleted
    podcast is named by the slug its report kept)."""
    ids: set[str] = set()
    _ids_in(report, ids)
    if not ids:
        return {}
    names: dict[str, str] = {}
    for named in await db.fetch_as(_Named, SQL["run_names"], {"ids": sorted(ids)}):
        title = f"“{named.title}”" if named.title else named.id[:8]
        names[named.id] = {
            "podcast": title,
            "import": f"the import preview of {title}",
            "media_job": f"a media job on {title}",
        }[named.kind]
    return names


async def listing(pages: Pages, request: Request) -> Response:
    wanted = RunFilter.parse(dict(request.query_params))
    # every lane with a run, and every one that can have one (a shard not run yet)
    runnable = [*LANE_NAMES, *await action_doors.news_lanes(pages.ctx)]
    lanes = sorted({*runnable, *(lane.lane for lane in await latest_per_lane(pages.ctx.db))})
    if wanted.lane is not None and wanted.lane not in lanes:
        raise BadRequest(f"lane: no lane {wanted.lane!r} here; the lanes are {', '.join(lanes)}")
    result = await runs_page(pages.ctx.db, wanted)
    return pages.render(
        request,
        "runs.html",
        title="Runs",
        wanted=wanted,
        page=result,
        lanes=lanes,
        runnable=runnable,
        recent_actions=await operator_actions.recent(pages.ctx.db, actions=RUN_ACTIONS),
        statuses=RUN_STATUSES,
        older_query=urlencode(wanted.query(before=result.older)) if result.older else None,
        newest_query=urlencode(wanted.query(before=None)),
    )


async def one(pages: Pages, request: Request) -> Response:
    wanted = run_id(request.path_params["run_id"])
    detail = None if wanted is None else await run_detail(pages.ctx.db, wanted)
    if detail is None:
        return pages.render(request, "error.html", 404, title="Not found", problem="no such run")
    names = await run_names(pages.ctx.db, detail.report)

    def name(row_id: str, item: Any) -> str:
        # by title, as the CLI says them; a deleted podcast by its slug, else its id
        return names.get(row_id) or narrate.short_name(row_id, item)

    return pages.render(
        request,
        "run.html",
        title=f"Run {detail.id}",
        run=detail,
        sentences=narrate.lane_sentences(detail.lane, detail.report, name),
    )


async def report_json(pages: Pages, request: Request) -> Response:
    wanted = run_id(request.path_params["run_id"])
    detail = None if wanted is None else await run_detail(pages.ctx.db, wanted)
    if detail is None:
        return Response(
            '{"error": "no such run"}\n', 404, media_type="application/json", headers=HEADERS
        )
    return Response(
        pages.shown(pretty(detail.raw)) + "\n",
        media_type="application/json",
        headers={**HEADERS, "Content-Disposition": f'inline; filename="run-{detail.id}.json"'},
    )
