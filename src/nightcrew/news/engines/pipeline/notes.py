"""What the pipeline's stage workers leave for the passes' reports.

A pass reports what it found and decided itself (``report.NewsReport``); the stage workers do
the expensive steps after it, in other processes. What they did is read back from PostgreSQL by
the shard's next pass and reported under ``workers`` (``report.WorkerResults``): most of it is
rows already there (articles, reviews, rejected candidates), and what leaves no row is noted
in ``news.report_notes`` by the worker that saw it — items a fetch dropped (the pass that sent
the fetch reports them as its own ``droppedItems``), fetches put off behind another worker's
lease, a Redis failure (shard NULL: a worker serves every shard).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.news.report import WorkerResults

if TYPE_CHECKING:
    from nightcrew.adapters.news import NewsAdapters

SQL = load_queries(__file__)


# --- noted by the stage workers ------------------------------------------------------------------
async def note_dropped(
    db: Database | Tx, *, shard: str, source: str, dropped: Mapping[str, int], now: datetime
) -> None:
    """Items a fetch dropped (``FetchResult.dropped``: {reason: count}) of ``source`` (its
    name), for the ``droppedItems`` of the pass that sent the fetch."""
    if not dropped:
        return
    reasons = sorted(dropped)
    await db.execute(
        SQL["note_many"],
        {
            "shard": shard,
            "kind": "dropped_items",
            "source": source,
            "reasons": reasons,
            "counts": [int(dropped[r]) for r in reasons],
            "now": now,
        },
    )


async def _note(
    db: Database | Tx, *, shard: str | None, kind: str, reason: str | None, now: datetime
) -> None:
    await db.execute(
        SQL["note"],
        {"shard": shard, "kind": kind, "source": None, "reason": reason, "n": 1, "now": now},
    )


async def note_fetch_locked(db: Database | Tx, *, shard: str, now: datetime) -> None:
    """A fetch of ``shard``'s source put off because another worker holds its fetch lease,
    for the workers' ``fetchLeaseSkippedCount``."""
    await _note(db, shard=shard, kind="fetch_locked", reason=None, now=now)


async def note_redis_trouble(
    db: Database, adapters: NewsAdapters, *, since: float | None, now: datetime
) -> float | None:
    """For a worker's housekeeping: a Redis failure its circuit breaker saw since ``since``
    (the breaker's clock; None: the worker's start) noted for every shard's next pass
    (``workers.redisEnabled``). Returns the next call's ``since`` (None without Redis)."""
    breaker = adapters.redis_breaker
    if breaker is None:
        return None
    checked = breaker.now()
    if breaker.failed_since(since if since is not None else -math.inf):
        await _note(db, shard=None, kind="redis_failed", reason=breaker.last_error, now=now)
    return checked


# --- read by the pass ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Noted:
    """What a pass reads back: its fetches' errors and dropped items, the workers' results
    since the shard's previous report, the shard's candidates by stage and state."""

    fetch_errors: list[dict[str, Any]]
    dropped_items: list[dict[str, Any]]
    workers: WorkerResults
    stages: dict[str, dict[str, int]]


async def worker_results(
    db: Database,
    *,
    shard: str,
    since: datetime | None,
    now: datetime,
    fetch_locked: int = 0,
    redis_failed: bool = False,
) -> WorkerResults:
    """What the stage workers did for ``shard`` in the window (``since``, ``now``], from the
    rows they wrote (reading only: the notes are ``read_for_pass``'s)."""
    window = {"shard": shard, "since": since or datetime.min.replace(tzinfo=now.tzinfo), "now": now}
    results = await db.fetch_one(SQL["pass_results"], window)
    waits = await db.fetch_one(SQL["pass_review_waits"], window)
    assert results is not None and waits is not None  # aggregates: always one row
    return WorkerResults(
        since=since,
        until=now,
        processed_count=int(results["written"]),
        ai_reviewed_count=int(results["reviewed"]),
        accepted_count=int(results["accepted"]),
        rejected_count=int(results["rejected"]),
        translated_count=int(results["translated"]),
        redis_ai_review_lock_skipped_count=int(waits["lock_skipped"]),
        fetch_lease_skipped_count=fetch_locked,
        review_retry_count=int(waits["review_retries"]),
        redis_enabled=not redis_failed,
        write_errors=[
            {"url": r["url"], "error": r["error"]}
            for r in await db.fetch(SQL["pass_write_errors"], window)
        ],
    )


async def read_for_pass(db: Database, *, shard: str, began: datetime, now: datetime) -> Noted:
    """What a pass reports of what happened since the shard's previous report stopped reading:
    its fetches' errors and dropped items, and the workers' results. The shard's notes are
    taken (deleted as read: two passes never report one twice), and the workers' Redis failures
    older than a day forgotten."""
    previous = await db.fetch_one(SQL["previous_report"], {"shard": shard, "now": began})
    since: datetime | None = previous["at"] if previous is not None else None
    window = {"shard": shard, "since": since or datetime.min.replace(tzinfo=now.tzinfo), "now": now}
    # the pass's own fetches, and any failure the previous report did not see
    fetched_since = {"shard": shard, "since": min(since or began, began), "now": now}
    dropped: list[dict[str, Any]] = []
    fetch_locked, redis_failed = 0, False
    for note in await db.fetch(SQL["pass_notes"], window):
        if note["kind"] == "dropped_items":
            dropped.append({"source": note["source"], "reason": note["reason"], "count": note["n"]})
        elif note["kind"] == "fetch_locked":
            fetch_locked += int(note["n"])
        elif note["kind"] == "redis_failed":
            redis_failed = True
    await db.execute(SQL["forget_notes"], {"now": now})
    stages: dict[str, dict[str, int]] = {s: {} for s in ("enrich", "review", "write")}
    for row in await db.fetch(SQL["shard_stages"], {"shard": shard}):
        stages.setdefault(row["stage"], {})[row["state"]] = int(row["n"])
    return Noted(
        fetch_errors=[
            {"source": r["source"], "error": r["error"]}
            for r in await db.fetch(SQL["fetch_errors_since"], fetched_since)
        ],
        dropped_items=dropped,
        stages=stages,
        workers=await worker_results(
            db,
            shard=shard,
            since=since,
            now=now,
            fetch_locked=fetch_locked,
            redis_failed=redis_failed,
        ),
    )
