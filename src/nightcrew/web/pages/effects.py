"""The effects outbox: what is due, failing and dead, by kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from nightcrew import actions as operator_actions
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.effects import outbox as effects_outbox
from nightcrew.web.pages.base import (
    Pages,
)

SQL = load_queries(__file__)

EFFECT_ACTIONS = ("effects.retry", "effects.retry_dead", "effects.drop")


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


async def show(pages: Pages, request: Request) -> Response:
    return pages.render(
        request,
        "effects.html",
        title="Effects",
        view=await effects(pages.ctx.db),
        recent_actions=await operator_actions.recent(pages.ctx.db, actions=EFFECT_ACTIONS),
        live=True,
    )
