"""The overage escalation: the accounts on the 30-day clock, suspended feeds, restorations."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from starlette.requests import Request
from starlette.responses import Response

from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.lifecycle import overage as overage_rules
from nightcrew.web.pages.base import (
    Pages,
)

SQL = load_queries(__file__)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Clock:
    """A row of overage_clocks: an account on the clock, measured as the escalation does."""

    id: UUID
    owner_email: str | None
    since: datetime
    deadline: datetime | None
    stage: int | None
    last_nag_at: datetime | None
    podcasts: int
    bytes: Decimal
    podcast_cap: Decimal | None
    storage_cap_gb: Decimal | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Suspended:
    """A row of suspended_feeds."""

    account_id: UUID
    slug: str
    title: str
    overage_suspended_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class _Restored:
    """A row of overage_restored: one restoration a daily run's report names."""

    run_id: int
    started_at: datetime
    account_id: str | None  # read from stored JSON: as text
    since: str | None
    podcasts: list[object] | None  # the report's slugs, as stored


async def on_clock_count(db: Database) -> int:
    """Accounts whose 30-day clock runs."""
    return await db.fetch_count(SQL["overage_clock_count"])


async def overage(db: Database, now: datetime, *, limit: int = 200) -> OverageView:
    clocks = await db.fetch_as(_Clock, SQL["overage_clocks"], {"now": now, "limit": limit})
    feeds: dict[str, list[SuspendedFeed]] = {}
    if clocks:
        for f in await db.fetch_as(
            _Suspended, SQL["suspended_feeds"], {"accounts": [c.id for c in clocks]}
        ):
            feeds.setdefault(str(f.account_id), []).append(
                SuspendedFeed(slug=f.slug, title=f.title, suspended_at=f.overage_suspended_at)
            )
    accounts = [
        OverageAccount(
            id=str(c.id),
            owner_email=c.owner_email,
            since=c.since,
            deadline=c.deadline,
            stage=c.stage,
            last_nag_at=c.last_nag_at,
            podcasts=int(c.podcasts),
            podcast_cap=None if c.podcast_cap is None else int(c.podcast_cap),
            bytes=int(c.bytes or 0),
            storage_cap_gb=None if c.storage_cap_gb is None else float(c.storage_cap_gb),
            suspended=feeds.get(str(c.id), []),
        )
        for c in clocks
    ]
    restored = [
        Restoration(
            run_id=r.run_id,
            at=r.started_at,
            account_id=str(r.account_id),
            since=r.since,
            podcasts=[str(p) for p in (r.podcasts or [])],
        )
        for r in await db.fetch_as(
            _Restored,
            SQL["overage_restored"],
            {"since": now - timedelta(days=30), "until": now + timedelta(days=1), "limit": 200},
        )
    ]
    return OverageView(accounts=accounts, on_clock=await on_clock_count(db), restored=restored)


async def show(pages: Pages, request: Request) -> Response:
    now = pages.ctx.clock.now()
    return pages.render(
        request,
        "overage.html",
        title="Overage",
        view=await overage(pages.ctx.db, now),
        grace_days=overage_rules.OVERAGE_GRACE_DAYS,
        nag_days=overage_rules.NAG_STAGE_DAYS,
        notice_days=overage_rules.SUSPEND_NOTICE_DAYS,
    )
