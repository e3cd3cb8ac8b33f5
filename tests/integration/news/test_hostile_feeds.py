"""Hostile feeds served on loopback, each beside a good neighbour in one shard: the bad feed is
that source's error (or its bad item is dropped), the neighbour's articles are written, the run
completes and its report is saved (issue 10, per-feed isolation)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.fetch import MAX_SUMMARY_CHARS, MAX_TITLE_CHARS
from nightcrew.news.run import run_shard
from nightcrew.news.sources import add_source
from tests.conftest import NOW
from tests.integration.news.test_run import deps_for, rss, runtime_for, site
from tests.support.servers import RecordingServer, answers, free_port


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

    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

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
    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert report["processedCount"] == 2
    assert {e["source"] for e in report["fetchErrors"]} == {"empty", "html"}


def _doc(base: str, declaration: str, title: str) -> str:
    return (
        f'{declaration}<rss version="2.0"><channel><title>E</title><item><title>{title}</title>'
        f"<link>{base}/articles/enc-1</link><description>d</description></item>"
        "</channel></rss>"
    )


HOSTILE_DOCUMENTS = {
    "latin-1 declared on utf-8": lambda b: _doc(
        b, '<?xml version="1.0" encoding="iso-8859-1"?>', "café ünïcode"
    ).encode("utf-8"),
    "utf-16 declared on utf-8": lambda b: _doc(
        b, '<?xml version="1.0" encoding="utf-16"?>', "café"
    ).encode("utf-8"),
    "utf-16 without a BOM": lambda b: _doc(
        b, '<?xml version="1.0" encoding="utf-16"?>', "café"
    ).encode("utf-16-le"),
    "gb2312, undeclared": lambda b: _doc(b, '<?xml version="1.0"?>', "新闻标题").encode("gb2312"),
    "truncated XML": lambda b: _doc(b, '<?xml version="1.0"?>', "cut")[:-40].encode(),
    "XML that is no feed": lambda b: b'<?xml version="1.0"?><config><a>1</a></config>',
    "an HTML page": lambda b: b"<!doctype html><html><head><title>x</title></head></html>",
    "an empty body": lambda b: b"",
    "binary noise": lambda b: bytes(range(256)) * 40,
}


@pytest.mark.parametrize("case", list(HOSTILE_DOCUMENTS))
async def test_a_hostile_document_is_at_most_its_own_error(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: httpx.AsyncClient,
    case: str,
) -> None:
    base = feed_server.url
    site(
        feed_server,
        {"/feeds/good": rss(base, 2, prefix="good"), "/feeds/bad": HOSTILE_DOCUMENTS[case](base)},
    )
    await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/bad", name="Bad", shard="s", now=NOW)
    report = (
        await run_shard(
            replace(runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
            clock,
            "s",
        )
    ).to_json()
    urls = {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}
    assert {f"{base}/articles/good-0", f"{base}/articles/good-1"} <= urls, report
    assert urls <= {f"{base}/articles/good-0", f"{base}/articles/good-1", f"{base}/articles/enc-1"}
    assert {e["source"] for e in report["fetchErrors"]} <= {"Bad"}
    if "enc-1" not in str(urls):  # nothing read: then it is the source's counted error
        assert [e["source"] for e in report["fetchErrors"]] == ["Bad"], report
    for row in await db.fetch("SELECT title FROM news.articles"):
        assert "\x00" not in row["title"]
    assert len(await db.fetch("SELECT 1 FROM news.worker_reports")) == 1


@contextmanager
def slow_loris(interval: float = 0.5) -> Iterator[str]:
    """A server that answers 200, then sends one byte every ``interval`` seconds, forever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.1)
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/rss+xml\r\n\r\n<")
            while not stop.wait(interval):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


async def test_a_slow_loris_feed_is_cut_at_the_fetch_budget(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: httpx.AsyncClient,
) -> None:
    base = feed_server.url
    site(feed_server, {"/feeds/good": rss(base, 2, prefix="good")})
    with slow_loris() as loris:
        await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
        await add_source(db, url=loris + "/feed", name="Loris", shard="s", now=NOW)
        runtime = runtime_for(db, clock, fresh_db_url, NEWS_FETCH_BUDGET_SECONDS="2")
        started = time.monotonic()
        report = (
            await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
        ).to_json()
        elapsed = time.monotonic() - started
    # every read arrives well within the 15 s read timeout: only the budget can end it
    assert elapsed < 6, elapsed
    assert report["fetchErrors"] == [
        {"source": "Loris", "error": "the feed took longer than the 2 s budget"}
    ]
    assert report["processedCount"] == 2


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary")
async def test_redis_killed_mid_run_costs_nothing_and_the_next_run_falls_back(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: httpx.AsyncClient,
) -> None:
    """A private redis-server is killed during the first review: the run ends normally with
    ``redisEnabled: false`` (lease extension fails → the rest is held), and the next run, with
    Redis still dead, takes PostgreSQL leases and writes the rest — each article once."""
    import redis.asyncio as aioredis

    from nightcrew.adapters.locks import RedisLeases
    from nightcrew.adapters.reviewer import OfflineReviewer

    base = feed_server.url
    site(feed_server, {"/feeds/a": rss(base, 3), "/feeds/b": rss(base, 2, prefix="b")})
    await add_source(db, url=base + "/feeds/a", name="A", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/b", name="B", shard="s", now=NOW)
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *[
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )

    class KillingReviewer(OfflineReviewer):
        async def review(self, article: Any) -> Any:
            if server.returncode is None:
                server.kill()
                await server.wait()
                await asyncio.sleep(1.5)  # past a third of the 3 s lease TTL: extend next
            return await super().review(article)

    client = aioredis.from_url(
        f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5, socket_timeout=1
    )
    try:
        for _ in range(50):
            if answers(port):
                break
            await asyncio.sleep(0.1)
        runtime = runtime_for(db, clock, fresh_db_url, UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS="3")
        deps = deps_for(
            db, clock, http, leases=RedisLeases(client), redis=client, reviewer=KillingReviewer()
        )
        first = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
        assert first["redisEnabled"] is False
        assert first["processedCount"] == 1 and first["deferredCount"] == 4, first
        assert "the shard lease was lost during review" in first["deferredReasons"]

        clock.advance(timedelta(hours=1))
        second = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
        assert second["redisEnabled"] is False and second["processedCount"] == 4, second
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
        await client.aclose()
    rows = await db.fetch("SELECT url, count(*) AS n FROM news.articles GROUP BY url")
    assert len(rows) == 5 and {r["n"] for r in rows} == {1}
