"""The reconciler's listing: ``podcasts/`` partitioned by podcast, COPYed into the session's
temp table as it is listed, and the enclosures outside it HEADed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nightcrew.adapters.storage import ObjectStore, StoredObject
from nightcrew.db.database import Tx
from nightcrew.lifecycle.reconcile.core import (
    classify_key,
)
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import Listing, Progress

LIST_PAGE = 1000
REMOTE_LIST_CONCURRENCY = 16
# Listing pages buffered while the session derives the episodes' keys before its COPY starts:
# 64 pages of 1,000 objects, ~20 MB, enough for the listers to run through that work (100k
# episodes: 0.8 s of it, ~14k objects/s listed on local disk).
OVERLAP_PAGES = 64
HEAD_CONCURRENCY = 32


@dataclass(frozen=True, kw_only=True, slots=True)
class _Unlisted:
    """unlisted_keys: an enclosure key outside the listing, and how many enclosures name it."""

    key: str
    episodes: int


def _listing_rows(page: list[StoredObject], kinds: dict[str, int]) -> list[tuple[Any, ...]]:
    rows = []
    for obj in page:
        kind = classify_key(obj.key)
        kinds[kind] = kinds.get(kind, 0) + 1
        rows.append((obj.key, kind, obj.size, obj.last_modified))
    return rows


def list_concurrency(settings_value: int | None, store: ObjectStore) -> int:
    """RECONCILE_LIST_CONCURRENCY, else 16 listings in flight on S3 (each page a round trip)
    and one per core on local disk (each page a directory walk)."""
    if settings_value:
        return settings_value
    return REMOTE_LIST_CONCURRENCY if store.remote else max(1, os.cpu_count() or 1)


async def load_listing(
    conn: Tx,
    store: ObjectStore,
    tick: Progress,
    concurrency: int,
    *,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> Listing:
    """List ``podcasts/`` partitioned by podcast and COPY as we go.

    A delimiter listing finds every ``podcasts/{id}/`` prefix the store holds (of podcasts in
    the database or not: a deleted podcast's objects are orphans to find) and the objects
    directly under ``podcasts/``; ``concurrency`` listers then take the prefixes one after
    another, each streaming its pages into one queue that the COPY drains. Memory holds at
    most the queue's pages plus one page per lister; requests are the prefix listing's pages
    plus every prefix's own (N/1000 + prefixes). One partition failing fails the listing,
    before anything is changed.

    ``meanwhile`` is the session's work that needs no listing (deriving the episodes' keys):
    it runs on ``conn`` before the COPY starts while the listers already fill the queue, which
    then holds up to OVERLAP_PAGES pages so that they are not held up meanwhile."""
    totals = {"objects": 0, "bytes": 0}
    kinds: dict[str, int] = {}
    pages_before = store.stats.list_pages
    prefixes, loose = await store.list_children("podcasts/")
    queue: asyncio.Queue[list[StoredObject] | None] = asyncio.Queue(
        maxsize=max(concurrency * 2, OVERLAP_PAGES if meanwhile else 0)
    )
    done = {"prefixes": 0}
    started = time.monotonic()

    async def lister(todo: Iterator[str]) -> None:
        for prefix in todo:  # shared: each lister takes the next prefix not yet taken
            async for page in store.list_prefix(prefix):
                await queue.put(page)
            done["prefixes"] += 1

    async def produce() -> None:
        try:
            for start in range(0, len(loose), LIST_PAGE):
                await queue.put(loose[start : start + LIST_PAGE])
            todo = iter(prefixes)
            listers = [
                asyncio.create_task(lister(todo)) for _ in range(min(concurrency, len(prefixes)))
            ]
            try:
                await asyncio.gather(*listers)
            finally:
                for task in listers:
                    task.cancel()
                await asyncio.gather(*listers, return_exceptions=True)
        finally:
            await queue.put(None)

    async def pages() -> AsyncIterator[list[tuple[Any, ...]]]:
        while (page := await queue.get()) is not None:
            totals["objects"] += len(page)
            totals["bytes"] += sum(o.size for o in page)
            tick(
                _listing_phase(totals["objects"], done["prefixes"], len(prefixes), started),
                totals["objects"],
            )
            yield _listing_rows(page, kinds)

    producer = asyncio.create_task(produce())
    try:
        if meanwhile is not None:
            await meanwhile()
        await conn.copy_in_batches(SQL["copy_listing"], pages())
    finally:
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer  # re-raises a listing failure
    seconds = time.monotonic() - started
    await conn.execute(SQL["index_listing"])
    await conn.execute(SQL["analyze_listing"])
    return Listing(
        objects=totals["objects"],
        bytes=totals["bytes"],
        list_requests=store.stats.list_pages - pages_before,
        partitions=len(prefixes),
        list_concurrency=concurrency,
        objects_per_second=round(totals["objects"] / seconds) if seconds > 0 else 0,
        kinds=kinds,
    )


def _listing_phase(objects: int, done: int, partitions: int, started: float) -> str:
    """The progress line: objects so far, objects/s, and an ETA from the partitions left."""
    elapsed = time.monotonic() - started
    rate = objects / elapsed if elapsed > 0 else 0.0
    if done and partitions > done:
        eta = f", ETA {elapsed * (partitions - done) / done:.0f} s"
    else:
        eta = ""
    return f"listing ({rate:,.0f} objects/s, {done:,}/{partitions:,} podcasts{eta})"


async def head_unlisted(conn: Tx, store: ObjectStore, tick: Progress) -> tuple[int, int]:
    """HEAD every enclosure key the listing of ``podcasts/`` cannot cover (spec 000: "for every
    episode with audio_url, derive the R2 key and HEAD it"), HEAD_CONCURRENCY at a time, and add
    the objects found to the listing as kind 'headed': the size backfill then joins them like
    listed ones, the missing check does not HEAD them again, and no sweep selects them.
    Returns (HEAD requests, enclosures whose object a HEAD found)."""
    gate = asyncio.Semaphore(HEAD_CONCURRENCY)
    after, heads, by_head = "", 0, 0

    async def head(key: str) -> StoredObject | None:
        async with gate:
            return await store.head(key)

    while page := await conn.fetch_as(
        _Unlisted, SQL["unlisted_keys"], {"after": after, "limit": LIST_PAGE}
    ):
        found = await asyncio.gather(*(head(u.key) for u in page))
        heads += len(page)
        by_head += sum(u.episodes for u, o in zip(page, found, strict=True) if o is not None)
        after = page[-1].key
        present = [o for o in found if o is not None]
        if present:
            await conn.execute(
                SQL["add_headed"],
                {
                    "keys": [o.key for o in present],
                    "sizes": [o.size for o in present],
                    "modified": [o.last_modified for o in present],
                },
            )
        tick("keys outside the listing", heads)
    return heads, by_head
