"""News sources: add, list, disable, and record what each fetch left behind."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.log import event, warning
from nightcrew.news.fetch import FetchResult, next_check

SQL = load_queries(__file__)

# A source failing this many times in a row is parked (reported, not retried every run).
PARK_AFTER_FAILURES = 5
CHECK_INTERVAL = timedelta(minutes=15)


class SourceError(NightcrewError):
    """A source command was refused; the message says why."""


def validate_feed_url(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SourceError(f"not an http(s) feed URL: {url!r}")
    return url.strip()


async def add_source(
    db: Database, *, url: str, name: str, shard: str, now: datetime
) -> dict[str, Any]:
    row = await db.fetch_one(
        SQL["add_source"],
        {"name": name, "feed_url": validate_feed_url(url), "shard": shard, "now": now},
    )
    if row is None:
        raise SourceError(f"a source with feed URL {url!r} already exists")
    return row


async def list_sources(db: Database, *, shard: str | None = None) -> list[dict[str, Any]]:
    return await db.fetch(SQL["list_sources"], {"shard": shard})


async def set_enabled(db: Database, ref: str, *, enabled: bool) -> dict[str, Any]:
    row = await db.fetch_one(SQL["enable_source" if enabled else "disable_source"], {"ref": ref})
    if row is None:
        raise SourceError(f"no source {ref!r} (give its id or its feed URL)")
    return row


async def record_fetch(
    db: Database | Tx, source: dict[str, Any], result: FetchResult, now: datetime
) -> None:
    if result.outcome in ("ok", "not_modified"):
        await db.execute(
            SQL["record_success"],
            {
                "id": source["id"],
                "etag": result.etag,
                "last_modified": result.last_modified,
                "body_hash": result.body_hash,
                "now": now,
                "next_check_at": next_check(now, result, CHECK_INTERVAL),
            },
        )
        return
    row = await db.fetch_one(
        SQL["record_failure"],
        {
            "id": source["id"],
            "error": result.error,
            "now": now,
            "next_check_at": next_check(now, result, CHECK_INTERVAL),
            "park_after": PARK_AFTER_FAILURES,
        },
    )
    if row is not None and row["parked_at"] is not None:
        warning(
            "news.source_parked",
            source_id=source["id"],
            feed_url=source["feed_url"],
            failures=row["consecutive_failures"],
            error=result.error,
        )
    else:
        event(
            "news.source_fetch_failed",
            source_id=source["id"],
            error=result.error,
            outcome=result.outcome,
        )
