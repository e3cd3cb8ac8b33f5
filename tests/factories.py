"""Rows for tests, inserted with plain SQL so each test states exactly the data it relies on."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime
from typing import Any

from nightcrew.db.database import Database, Tx

_seq = itertools.count()


async def _insert(db: Database | Tx, table: str, values: dict[str, Any]) -> str:
    columns = ", ".join(values)
    params = ", ".join(f"%({k})s" for k in values)
    row = await db.fetch_one(
        f"INSERT INTO {table} ({columns}) VALUES ({params}) RETURNING id", values
    )
    assert row is not None
    return str(row["id"])


async def account(db: Database | Tx, **values: Any) -> str:
    return await _insert(db, "public.billing_accounts", {"plan": "free", **values})


async def podcast(db: Database | Tx, **values: Any) -> str:
    n = next(_seq)
    return await _insert(
        db,
        "public.podcasts",
        {"slug": f"show-{n}-{uuid.uuid4().hex[:6]}", "title": f"Show {n}", **values},
    )


async def episode(db: Database | Tx, podcast_id: str, **values: Any) -> str:
    return await _insert(db, "public.episodes", {"podcast_id": podcast_id, **values})


async def podcast_import(
    db: Database | Tx, podcast_id: str, *, status: str = "running", **values: Any
) -> str:
    return await _insert(
        db, "public.podcast_imports", {"podcast_id": podcast_id, "status": status, **values}
    )


async def import_item(
    db: Database | Tx,
    import_id: str,
    *,
    updated_at: datetime,
    status: str = "pending",
    attempts: int = 0,
) -> str:
    return await _insert(
        db,
        "public.import_items",
        {
            "import_id": import_id,
            "status": status,
            "attempts": attempts,
            "created_at": updated_at,
            "updated_at": updated_at,
        },
    )


async def media_job(
    db: Database | Tx,
    episode_id: str,
    *,
    updated_at: datetime,
    status: str = "running",
    type: str = "normalize",
) -> str:
    return await _insert(
        db,
        "public.media_jobs",
        {
            "episode_id": episode_id,
            "type": type,
            "status": status,
            "created_at": updated_at,
            "updated_at": updated_at,
        },
    )


async def user(db: Database | Tx, **values: Any) -> str:
    n = next(_seq)
    return await _insert(db, "auth.users", {"email": f"user{n}@example.test", **values})


async def queue_messages(db: Database, queue: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT body, visible_at FROM nightcrew.queue_messages WHERE queue = %(q)s ORDER BY id",
        {"q": queue},
    )
    return rows
