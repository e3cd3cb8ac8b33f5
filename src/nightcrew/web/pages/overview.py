"""The overview: each lane's latest run, the schedules, and the counts every page refreshes
without a reload (``/live.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC

from starlette.requests import Request
from starlette.responses import Response

from nightcrew.assembly import effect_kinds
from nightcrew.db.database import Database
from nightcrew.effects import outbox as effects_outbox
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS
from nightcrew.web.pages import deletions, news, overage, runs
from nightcrew.web.pages.base import (
    Pages,
)


# --- the overview's counts -------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Counts:
    effects_pending: int
    effects_dead: int
    deletion_leftovers: int
    on_clock: int
    parked: int
    sources: int
    active: int
    effects_by_kind: dict[str, dict[str, int]]  # kind → {"pending": n, "dead": n}


async def counts(db: Database) -> Counts:
    owed = await effects_outbox.counts(db, effect_kinds())
    leftovers = await deletions.unfinished_count(db)
    on_clock = await overage.on_clock_count(db)
    sources = await news.source_counts(db)
    return Counts(
        effects_pending=sum(k["pending"] for k in owed.values()),
        effects_dead=sum(k["dead"] for k in owed.values()),
        deletion_leftovers=leftovers,
        on_clock=on_clock,
        parked=sources.parked,
        sources=sources.sources,
        active=sources.active,
        effects_by_kind=owed,
    )


async def live_values(db: Database) -> dict[str, int]:
    """The counts the pages refresh without a reload, by their ``data-live`` keys."""
    overview = await counts(db)
    values = {
        "effects.pending": overview.effects_pending,
        "effects.dead": overview.effects_dead,
        "deletions.leftovers": overview.deletion_leftovers,
        "overage.on_clock": overview.on_clock,
        "news.parked": overview.parked,
        "news.sources": overview.sources,
        "news.active": overview.active,
    }
    for kind, c in overview.effects_by_kind.items():
        values[f"effects.{kind}.pending"] = c["pending"]
        values[f"effects.{kind}.dead"] = c["dead"]
    return values


async def show(pages: Pages, request: Request) -> Response:
    # A database that is gone is the guard's 503 page, like every other page's.
    return pages.render(
        request,
        "overview.html",
        title="Overview",
        lanes=await runs.latest_per_lane(pages.ctx.db),
        schedules=pages.ctx.schedules() if pages.ctx.schedules else None,
        counts=await counts(pages.ctx.db),
        live=True,
    )


async def live(pages: Pages, request: Request) -> Response:
    # What static/live.js writes into the pages' counts (their data-live keys).
    read_at = pages.ctx.clock.now().astimezone(UTC)
    body = {
        "read_at": read_at.isoformat(),
        "read_at_text": read_at.strftime("%H:%M:%S"),
        "values": await live_values(pages.ctx.db),
    }
    return Response(json.dumps(body) + "\n", media_type="application/json", headers=HEADERS)
