"""Fetched articles wait in ``news.candidates`` until they are written: deferred means later.

A source's new items are held in the same transaction that saves its ETag / Last-Modified /
body hash, so the next conditional GET answering 304 can never lose them. Each run takes the
shard's held candidates oldest first; a written candidate is dropped in the transaction that
writes its article; one the database cannot store is ``rejected`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.news import sources as news_sources
from nightcrew.news.fetch import FeedItem, FetchResult

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    source_id: int
    source_label: str  # "name (shard)", as queuedBySource names it
    item: FeedItem
    reason: str
    attempts: int

    @property
    def url(self) -> str:
        return self.item.url

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Candidate:
        return cls(
            source_id=int(row["source_id"]),
            source_label=f"{row['source_name']} ({row['source_shard']})",
            item=FeedItem(
                url=row["url"],
                title=row["title"],
                summary=row["summary"],
                published=row["published_at"],
                image_url=row["image_url"],
            ),
            reason=row["reason"],
            attempts=int(row["attempts"]),
        )


async def record_and_hold(
    db: Database,
    source: dict[str, Any],
    result: FetchResult,
    items: list[FeedItem],
    now: datetime,
) -> None:
    """The fetch's outcome and its new items, in one transaction."""
    async with db.transaction() as tx:
        await news_sources.record_fetch(tx, source, result, now)
        if items:
            await tx.execute(
                SQL["hold"],
                {
                    "source_id": source["id"],
                    "shard": source["shard"],
                    "now": now,
                    "urls": [i.url for i in items],
                    "titles": [i.title for i in items],
                    "summaries": [i.summary for i in items],
                    "images": [i.image_url for i in items],
                    "published": [i.published for i in items],
                },
            )


async def held(db: Database, shard: str) -> list[Candidate]:
    await db.execute(SQL["forget_written"], {"shard": shard})
    return [Candidate.from_row(r) for r in await db.fetch(SQL["held"], {"shard": shard})]


async def count_held(db: Database, shard: str) -> int:
    row = await db.fetch_one(SQL["count_held"], {"shard": shard})
    return int(row["n"]) if row else 0


async def defer(
    db: Database, urls: list[str], reason: str, now: datetime, *, attempted: bool = False
) -> None:
    if urls:
        await db.execute(
            SQL["defer"], {"urls": urls, "reason": reason, "now": now, "attempted": attempted}
        )


async def drop(tx: Database | Tx, urls: list[str]) -> None:
    if urls:
        await tx.execute(SQL["drop"], {"urls": urls})


async def reject(db: Database, url: str, reason: str, now: datetime) -> None:
    await db.execute(SQL["reject"], {"url": url, "reason": reason, "now": now})
