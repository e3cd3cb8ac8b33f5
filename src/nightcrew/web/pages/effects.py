"""The effects outbox: what is due, failing and dead, by kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response

from nightcrew import operator_actions
from nightcrew.assembly import effect_kinds
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects_outbox
from nightcrew.web.pages.base import (
    Pages,
)

SQL = load_queries(__file__)

EFFECT_ACTIONS = ("effects.retry", "effects.retry_dead", "effects.drop")


# --- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Failing:
    """A row of effects_failing: being retried."""

    id: int
    kind: str
    key: str
    attempts: int
    last_attempt_at: datetime | None
    next_attempt_at: datetime
    last_error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Dead:
    """A row of effects_dead: given up."""

    id: int
    kind: str
    key: str
    attempts: int
    dead_at: datetime
    dead_reason: str | None
    last_error: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Due:
    """A row of effects_due: waiting for a first attempt (or a re-drive)."""

    id: int
    kind: str
    key: str
    attempts: int
    next_attempt_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidates:
    """A row of news_candidates: how many stories wait in one state of one stage."""

    stage: str
    state: str
    n: int


@dataclass(frozen=True, kw_only=True)
class EffectsView:
    counts: dict[str, dict[str, int]]
    failing: list[Failing]
    dead: list[Dead]
    news_candidates: list[Candidates]
    due: list[Due] = field(default_factory=list)


async def effects(db: Database) -> EffectsView:
    return EffectsView(
        counts=await effects_outbox.counts(db, effect_kinds()),
        failing=await db.fetch_as(Failing, SQL["effects_failing"], {"limit": 50}),
        dead=await db.fetch_as(Dead, SQL["effects_dead"], {"limit": 50}),
        due=await db.fetch_as(Due, SQL["effects_due"], {"limit": 50}),
        news_candidates=await db.fetch_as(Candidates, SQL["news_candidates"]),
    )


async def show(pages: Pages, request: Request) -> Response:
    return pages.render(
        request,
        "effects.html",
        title="Effects",
        view=await effects(pages.ctx.db),
        recent_actions=await operator_actions.recent(pages.ctx.db, actions=EFFECT_ACTIONS),
        live=True,
    )
