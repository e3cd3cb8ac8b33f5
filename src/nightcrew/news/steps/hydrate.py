"""Hydrate: an article without an image in its feed gets its page's og:image (``images.py``
reads the page, under the address policy), and accepted articles still without one are tried
again later — spec 001's no-thumbnail retry (``retriedCount``).

Both engines hydrate through ``hydrate_one``: the inline run a batch at a time
(``hydrate_images``), the pipeline's enrich stage one candidate per message. Both retry the
accepted articles still without a thumbnail (``thumbnail_retries``, ``retry_thumbnails``): the
inline run under its shard lock once its batch is admitted, the pipeline's pass under the same
lock after its admission.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from nightcrew.adapters.news import NewsAdapters
from nightcrew.db.database import Database
from nightcrew.db.queries import load_queries
from nightcrew.news.steps.images import hydrate_image

SQL = load_queries(__file__)

HYDRATE_CONCURRENCY = 8
NO_THUMBNAIL_RETRY_AGE_SECONDS = 6 * 3600
NO_THUMBNAIL_RETRY_MAX = 20


async def hydrate_one(adapters: NewsAdapters, url: str) -> str | None:
    """The image of the article page at ``url``; None when there is none (or the page could
    not be read: hydration never fails the article)."""
    image, _ = await hydrate_image(adapters.http, url, adapters.policy)
    return image


async def hydrate_images(adapters: NewsAdapters, urls: list[str]) -> dict[str, str]:
    """{url: image} of those of ``urls`` whose page has one, HYDRATE_CONCURRENCY at a time."""
    gate = asyncio.Semaphore(HYDRATE_CONCURRENCY)

    async def one(url: str) -> tuple[str, str | None]:
        async with gate:
            return url, await hydrate_one(adapters, url)

    return {u: i for u, i in await asyncio.gather(*(one(u) for u in urls)) if i}


@dataclass(frozen=True, kw_only=True, slots=True)
class NoThumbnail:
    """An accepted article without a thumbnail, due another try (``retry_candidates``)."""

    id: int
    url: str


async def thumbnail_retries(db: Database, shard: str, now: datetime) -> list[NoThumbnail]:
    """Accepted articles of ``shard`` still without a thumbnail, due another try (their last
    try, or their creation, older than NO_THUMBNAIL_RETRY_AGE_SECONDS), least recently tried
    first, at most NO_THUMBNAIL_RETRY_MAX."""
    return await db.fetch_as(
        NoThumbnail,
        SQL["retry_candidates"],
        {
            "shard": shard,
            "now": now,
            "retry_age_seconds": NO_THUMBNAIL_RETRY_AGE_SECONDS,
            "limit": NO_THUMBNAIL_RETRY_MAX,
        },
    )


async def retry_thumbnails(
    db: Database, adapters: NewsAdapters, articles: list[NoThumbnail], now: datetime
) -> None:
    """Try ``articles`` (from ``thumbnail_retries``) again: each marked tried first, so a page
    that never answers waits out the retry age like any other."""
    if not articles:
        return
    ids = [a.id for a in articles]
    await db.execute(SQL["mark_thumbnail_attempts"], {"now": now, "ids": ids})
    found = await hydrate_images(adapters, [a.url for a in articles])
    for article in articles:
        if article.url in found:
            await db.execute(SQL["set_image"], {"id": article.id, "image_url": found[article.url]})
