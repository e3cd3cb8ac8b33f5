"""Run history: one ``nightcrew.runs`` row per lane run, and the per-slot claim for schedules."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from nightcrew.db.database import Database, json_param
from nightcrew.db.queries import load_queries

SQL = load_queries(__file__)

RunStatus = Literal["completed", "failed"]


async def claim_slot(db: Database, *, lane: str, slot: datetime, now: datetime) -> int | None:
    """Claim a scheduled slot; the run id if this caller won it, None if another replica did."""
    row = await db.fetch_one(SQL["claim_scheduled_slot"], {"lane": lane, "slot": slot, "now": now})
    return None if row is None else int(row["id"])


async def start_manual(db: Database, *, lane: str, now: datetime) -> int:
    row = await db.fetch_one(SQL["start_manual_run"], {"lane": lane, "now": now})
    assert row is not None  # INSERT … RETURNING always yields the row
    return int(row["id"])


async def finish(
    db: Database, run_id: int, *, status: RunStatus, now: datetime, report: dict[str, Any]
) -> None:
    await db.execute(
        SQL["finish_run"],
        {"id": run_id, "status": status, "now": now, "report": json_param(report)},
    )


async def recent(db: Database, *, lane: str, limit: int = 20) -> list[dict[str, Any]]:
    return await db.fetch(SQL["recent_runs"], {"lane": lane, "limit": limit})
