"""Benchmark: a full news run over 200 feeds x 50 items on loopback, offline reviewer.

    python -m bench.news [--feeds 200] [--items 50]

Feeds are served from memory by a threaded HTTP server on 127.0.0.1; every item carries its
own media:thumbnail, so no article page is fetched. Compared with bare ``feedparser.parse`` of
the same bytes (the floor: parsing alone), it reports items per second of:

* the first run — fetch, de-dupe, count, review, fenced writes, snapshot, report;
* the second run — everything already seen: it must do no per-item work beyond the bulk de-dupe.

Target (issue 6): first-run throughput >= 0.7x bare parsing (our overhead <= 30%).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import feedparser

from bench._db import admin_url, drop, recreate
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.locks import PostgresLeases
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.log import configure_logging
from nightcrew.news.demo_feeds import serve_feeds
from nightcrew.news.fetch import new_client
from nightcrew.news.review import OfflineReviewer
from nightcrew.news.run import NewsDeps, run_shard
from nightcrew.news.sources import add_source
from nightcrew.runtime import Runtime

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)


def feed_bytes(feed: int, items: int) -> bytes:
    entries = "".join(
        f"<item><title>Feed {feed} story {n}: the council votes on the bridge</title>"
        f"<link>https://news{feed}.example/story/{n}</link>"
        f"<description>Story {n} of feed {feed}, long enough for every offline rule.</description>"
        f"<pubDate>Sun, 29 Nov 2026 03:{n % 60:02d}:00 GMT</pubDate>"
        f'<media:thumbnail url="https://img.example/{feed}/{n}.jpg"/></item>'
        for n in range(items)
    )
    return (
        '<?xml version="1.0"?><rss version="2.0" xmlns:media="http://search.yahoo.com/mrss/">'
        f"<channel><title>Feed {feed}</title>{entries}</channel></rss>"
    ).encode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feeds", type=int, default=200)
    parser.add_argument("--items", type=int, default=50)
    args = parser.parse_args()
    configure_logging("error")
    feeds = {f"/feeds/{f}": feed_bytes(f, args.items) for f in range(args.feeds)}
    total = args.feeds * args.items

    started = time.perf_counter()
    parsed = sum(len(feedparser.parse(body).entries) for body in feeds.values())
    parse_s = time.perf_counter() - started
    assert parsed == total

    with serve_feeds() as (base, served), admin_url() as admin:
        served.update(feeds)
        name = "nightcrew_bench_news"
        url = recreate(admin, name)
        try:
            db = await Database.open(url)
            try:
                await migrate(db)
                for path in feeds:
                    await add_source(db, url=base + path, name=path, shard="bench", now=NOW)
                clock = FrozenClock(NOW)
                settings = Settings.model_validate(
                    {
                        "DATABASE_URL": url,
                        "INGESTION_BACKPRESSURE_QUEUE_LIMIT": total,
                        "INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT": total * 10,
                        "MAX_AI_REVIEWS": total,
                    }
                )
                runtime = Runtime(
                    settings=settings,
                    db=db,
                    queues=PostgresQueueProducer(db, clock),
                    store=open_store("memory://"),
                    feedcache=RecordingFeedCache(),
                    billing=NoBilling(),
                )
                async with new_client() as http:
                    deps = NewsDeps(
                        leases=PostgresLeases(db, clock), http=http, reviewer=OfflineReviewer()
                    )
                    started = time.perf_counter()
                    first = await run_shard(runtime, clock, deps, "bench")
                    first_s = time.perf_counter() - started
                    clock.advance(timedelta(hours=1))
                    started = time.perf_counter()
                    second = await run_shard(runtime, clock, deps, "bench")
                    second_s = time.perf_counter() - started
            finally:
                await db.close()
        finally:
            drop(admin, name)

    parse_rate, first_rate = total / parse_s, total / first_s
    print(
        f"== {args.feeds} feeds x {args.items} items = {total:,} items (loopback, offline reviewer)"
    )
    print(f"   bare feedparser.parse:  {parse_s:.2f} s  ({parse_rate:,.0f} items/s)")
    print(
        f"   first run:              {first_s:.2f} s  ({first_rate:,.0f} items/s) — "
        f"processed {first.processed_count:,}, accepted {first.accepted_count:,}"
    )
    ratio = first_rate / parse_rate
    print(f"   ratio: {ratio:.2f} (target >= 0.7: {'met' if ratio >= 0.7 else 'MISSED'})")
    print(
        f"   second run (all seen):  {second_s:.2f} s — queued {second.queued_count}, "
        f"processed {second.processed_count}, reviewed {second.ai_reviewed_count}"
    )


if __name__ == "__main__":
    asyncio.run(main())
