"""The minute lane's watchdogs: messages re-sent and rows rescued, hour by hour."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from starlette.requests import Request
from starlette.responses import Response

from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.web.charts import Bar, bar_chart
from nightcrew.web.pages.base import (
    Pages,
)

SQL = load_queries(__file__)


# --- watchdogs -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class WatchdogHour:
    hour: datetime
    runs: int
    counts: dict[str, int]

    @property
    def resent(self) -> int:
        return self.counts.get("items_requeued", 0) + self.counts.get("links_requeued", 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Hour:
    """A row of watchdog_hours: the minute runs of one hour, their counts summed (NUMERIC)."""

    hour: datetime
    runs: int
    items_requeued: Decimal
    items_rescued: Decimal
    links_requeued: Decimal
    previews_canceled: Decimal
    media_jobs_flagged: Decimal
    effects_retried: Decimal

    def counts(self) -> dict[str, int]:
        return {
            "items_requeued": int(self.items_requeued),
            "links_requeued": int(self.links_requeued),
            "previews_canceled": int(self.previews_canceled),
            "media_jobs_flagged": int(self.media_jobs_flagged),
            "items_rescued": int(self.items_rescued),
            "effects_retried": int(self.effects_retried),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Rescue:
    """A row of watchdog_rescues: a minute run that did something."""

    id: int
    started_at: datetime
    status: str
    items_requeued: Decimal
    links_requeued: Decimal
    previews_canceled: Decimal
    media_jobs_flagged: Decimal


@dataclass(frozen=True, kw_only=True)
class WatchdogsView:
    since: datetime
    hours: list[WatchdogHour]  # every hour of the window, zeros included
    rescues: list[Rescue]

    def total(self, key: str) -> int:
        return sum(h.counts.get(key, 0) for h in self.hours)


async def watchdogs(db: Database, now: datetime) -> WatchdogsView:
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    since = end - timedelta(hours=24)
    params = {"since": since, "until": end, "origin": since}
    found = {
        h.hour: WatchdogHour(hour=h.hour, runs=int(h.runs), counts=h.counts())
        for h in await db.fetch_as(_Hour, SQL["watchdog_hours"], params)
    }
    hours = [
        found.get(since + timedelta(hours=i))
        or WatchdogHour(hour=since + timedelta(hours=i), runs=0, counts={})
        for i in range(24)
    ]
    rescues = await db.fetch_as(Rescue, SQL["watchdog_rescues"], {**params, "limit": 50})
    return WatchdogsView(since=since, hours=hours, rescues=rescues)


async def show(pages: Pages, request: Request) -> Response:
    view = await watchdogs(pages.ctx.db, pages.ctx.clock.now())
    chart = bar_chart(
        [
            Bar(
                label=h.hour.astimezone(UTC).strftime("%H"),
                value=h.resent,
                tip=f"{h.hour.astimezone(UTC):%Y-%m-%d %H}:00 — {h.resent} re-sent, "
                f"{h.runs} minute run(s)",
            )
            for h in view.hours
        ],
        title="Messages re-sent per hour, last 24 hours",
        every=3,
    )
    return pages.render(request, "watchdogs.html", title="Watchdogs", view=view, chart=chart)
