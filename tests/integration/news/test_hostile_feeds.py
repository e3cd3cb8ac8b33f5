"""Hostile feeds served on loopback, each beside a good neighbour in one shard: the bad feed is
that source's error (or its bad item is dropped), the neighbour's articles are written, the run
completes and its report is saved (issue 10, per-feed isolation)."""

from __future__ import annotations

import httpx
import pytest

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.fetch import MAX_SUMMARY_CHARS, MAX_TITLE_CHARS
from nightcrew.news.run import run_shard
from nightcrew.news.sources import add_source
from tests.conftest import NOW
from tests.integration.news.test_run import deps_for, rss, runtime_for, site
from tests.support.servers import RecordingServer


def _feed(items: str) -> bytes:
    return (
        b'<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>H</title>'
        + items.encode()
        + b"</channel></rss>"
    )


def _item(
    base: str, n: int, *, title: str = "fine title", link: str | None = None, extra: str = ""
) -> str:
    return (
        f"<item><title>{title}</title><link>{link or f'{base}/articles/hostile-{n}'}</link>"
        f"<description>A long enough description of hostile item {n}.</description>{extra}</item>"
    )


HOSTILE = {
    "lone surrogate (hex)": lambda b: _item(b, 1, title="a&#xD800;b"),
    "lone surrogate (decimal)": lambda b: _item(b, 1, title="a&#56320;b"),
    "code point past U+10FFFF": lambda b: _item(b, 1, title="a&#x110000;b"),
    "year 0": lambda b: _item(b, 1, extra="<pubDate>0000-01-01T00:00:00Z</pubDate>"),
    "year 10000": lambda b: _item(b, 1, extra="<pubDate>9999-12-31T23:59:59-01:00</pubDate>"),
    "NUL reference in a title": lambda b: _item(b, 1, title="nul&#0;here"),
    "NUL reference in a link": lambda b: _item(b, 1, link=f"{b}/articles/nul&#0;x"),
    "3,000-character link": lambda b: _item(b, 1, link=f"{b}/articles/{'x' * 3000}"),
    "1 MB title": lambda b: _item(b, 1, title="t" * 1_000_000),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_item_never_costs_the_neighbour_feed_its_articles(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: httpx.AsyncClient,
    case: str,
) -> None:
    base = feed_server.url
    hostile = _feed(HOSTILE[case](base) + _item(base, 2, title="the plain item beside it"))
    site(feed_server, {"/feeds/good": rss(base, 2, prefix="good"), "/feeds/bad": hostile})
    await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/bad", name="Bad", shard="s", now=NOW)
    runtime = runtime_for(db, clock, fresh_db_url)

    report = (await run_shard(runtime, clock, deps_for(db, clock, http), "s")).to_json()

    rows = await db.fetch("SELECT url, title, summary, published_at FROM news.articles")
    urls = {r["url"] for r in rows}
    assert {f"{base}/articles/good-0", f"{base}/articles/good-1"} <= urls, report
    assert f"{base}/articles/hostile-2" in urls  # the hostile item's own neighbour too
    for row in rows:
        assert "\x00" not in row["title"] and len(row["title"]) <= MAX_TITLE_CHARS
        assert len(row["summary"]) <= MAX_SUMMARY_CHARS
        assert len(row["url"]) <= 2048
    saved = await db.fetch("SELECT report FROM news.worker_reports")
    assert len(saved) == 1  # the run completed and saved its report


async def test_a_feed_that_breaks_the_parser_is_its_own_fetch_error(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: httpx.AsyncClient,
) -> None:
    base = feed_server.url
    site(
        feed_server,
        {
            "/feeds/good": rss(base, 2, prefix="good"),
            "/feeds/empty": b"",
            "/feeds/html": b"<html><body>not a feed</body></html>",
        },
    )
    for name in ("good", "empty", "html"):
        await add_source(db, url=f"{base}/feeds/{name}", name=name, shard="s", now=NOW)
    runtime = runtime_for(db, clock, fresh_db_url)
    report = (await run_shard(runtime, clock, deps_for(db, clock, http), "s")).to_json()
    assert report["processedCount"] == 2
    assert {e["source"] for e in report["fetchErrors"]} == {"empty", "html"}
