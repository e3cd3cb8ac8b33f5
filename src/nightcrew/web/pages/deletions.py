"""Deletions: every hard delete, newest first, and the ones with storage left to clean."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.web.pages.base import (
    FAR_FUTURE,
    MAX_UUID,
    PAGE_SIZE,
    BadRequest,
    Pages,
    decode_cursor,
    encode_cursor,
)

SQL = load_queries(__file__)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Totals:
    """The one row of deletions_recent_totals (its sums are NUMERIC)."""

    podcasts: int
    objects: Decimal
    bytes: Decimal


async def unfinished_count(db: Database) -> int:
    """Deletions with storage or a feed invalidation still owed."""
    return await db.fetch_count(SQL["deletions_unfinished_count"])


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
    before_at, before_id = FAR_FUTURE, MAX_UUID
    if before:
        before_at, before_id = decode_cursor(before)
        try:
            before_id = str(uuid.UUID(before_id))
        except ValueError:
            raise BadRequest("before: not a cursor this page made") from None
    unfinished = await db.fetch_as(Deletion, SQL["deletions_unfinished"], {"limit": 100})
    listed = await db.fetch_as(
        Deletion,
        SQL["deletions_page"],
        {"before_at": before_at, "before_id": before_id, "limit": limit + 1},
    )
    page = listed[:limit]
    totals = await db.fetch_one_as(
        _Totals, SQL["deletions_recent_totals"], {"since": now - timedelta(30)}
    )
    older = encode_cursor(page[-1].deleted_at, page[-1].podcast_id) if len(listed) > limit else None
    return DeletionsView(
        unfinished=unfinished,
        unfinished_count=await unfinished_count(db),
        page=page,
        older=older,
        recent_podcasts=int(totals.podcasts) if totals else 0,
        recent_objects=int(totals.objects) if totals else 0,
        recent_bytes=int(totals.bytes) if totals else 0,
    )


async def show(pages: Pages, request: Request) -> Response:
    view = await deletions(
        pages.ctx.db, pages.ctx.clock.now(), request.query_params.get("before") or None
    )
    return pages.render(
        request,
        "deletions.html",
        title="Deletions",
        view=view,
        older_query=urlencode({"before": view.older}) if view.older else None,
    )
