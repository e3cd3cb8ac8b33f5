"""Hostile feeds served on loopback, each beside a good neighbour in one shard: the bad feed is
that source's error (or its bad item is dropped), the neighbour's articles are written, the run
completes and its report is saved (per-feed isolation)."""

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

import pytest

from nightcrew.adapters.addresses import UntrustedHttp
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps.entries import (
    LINK_NOT_HTTP,
    LINK_TOO_LONG,
    MAX_SUMMARY_CHARS,
    MAX_TITLE_CHARS,
    MAX_URL_BYTES,
)
from nightcrew.runtime import Runtime
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
    # a raw 0x00 byte makes the document ill-formed XML: the forgiving parser reads it
    "raw NUL byte in a title": lambda b: _item(b, 1, title="nul\x00here"),
    "raw NUL byte in a link": lambda b: _item(b, 1, link=f"{b}/articles/nul\x00x"),
    "3,000-character link": lambda b: _item(b, 1, link=f"{b}/articles/{'x' * 3000}"),
    "1 MB title": lambda b: _item(b, 1, title="t" * 1_000_000),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_item_never_costs_the_neighbour_feed_its_articles(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
    case: str,
) -> None:
    base = feed_server.url
    hostile = _feed(HOSTILE[case](base) + _item(base, 2, title="the plain item beside it"))
    assert ("raw NUL" not in case) or b"\x00" in hostile  # the byte itself is served
    site(feed_server, {"/feeds/good": rss(base, 2, prefix="good"), "/feeds/bad": hostile})
    await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/bad", name="Bad", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)

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
        assert len(row["url"].encode()) <= MAX_URL_BYTES
    saved = await db.fetch("SELECT report FROM news.worker_reports")
    assert len(saved) == 1  # the run completed and saved its report


async def test_a_feed_that_breaks_the_parser_is_its_own_fetch_error(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
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
    runtime = await runtime_for(db, clock, fresh_db_url)
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
    http: UntrustedHttp,
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
            replace(await runtime_for(db, clock, fresh_db_url), news=deps_for(db, clock, http)),
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
    http: UntrustedHttp,
) -> None:
    base = feed_server.url
    site(feed_server, {"/feeds/good": rss(base, 2, prefix="good")})
    with slow_loris() as loris:
        await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
        await add_source(db, url=loris + "/feed", name="Loris", shard="s", now=NOW)
        # 3 s: the good feed's fetch must fit in it too, on a CI machine running six workers
        # on two cores (at 2 s it once did not)
        runtime = await runtime_for(db, clock, fresh_db_url, NEWS_FETCH_BUDGET_SECONDS="3")
        started = time.monotonic()
        report = (
            await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
        ).to_json()
        elapsed = time.monotonic() - started
    # every read arrives well within the 15 s read timeout: only the budget can end it
    assert elapsed < 8, elapsed
    assert report["fetchErrors"] == [
        {"source": "Loris", "error": "the feed took longer than the 3 s budget"}
    ]
    assert report["processedCount"] == 2


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary")
async def test_redis_killed_mid_run_costs_nothing_and_the_next_run_falls_back(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """A private redis-server is killed during the first review. The shard lease lives in
    PostgreSQL (Redis only carries its copy), so the run goes on: it writes every article,
    each once, and says ``redisEnabled: false``; the next run, Redis still dead, finds nothing
    left and pays no Redis timeout per call (the circuit breaker is open)."""
    import redis.asyncio as aioredis

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
        async def review(self, article: Any, scope: Any = None) -> Any:
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
        runtime = await runtime_for(
            db, clock, fresh_db_url, UPSTASH_REDIS_WORKER_LOCK_TTL_SECONDS="3"
        )
        deps = deps_for(db, clock, http, redis=client, reviewer=KillingReviewer())
        first = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
        assert first["redisEnabled"] is False
        assert first["processedCount"] == 5 and first["deferredCount"] == 0, first

        clock.advance(timedelta(hours=1))
        started = time.perf_counter()
        second = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
        assert second["redisEnabled"] is False and second["processedCount"] == 0, second
        assert time.perf_counter() - started < 5
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
        await client.aclose()
    rows = await db.fetch("SELECT url, count(*) AS n FROM news.articles GROUP BY url")
    assert len(rows) == 5 and {r["n"] for r in rows} == {1}


def _iri_link(base: str, size: int) -> str:
    """A link to ``base``'s articles whose UTF-8 form is exactly ``size`` bytes, mostly
    two-byte characters: far fewer characters than bytes."""
    head = f"{base}/articles/"
    room = size - len(head.encode())
    return head + "x" * (room % 2) + "é" * (room // 2)


async def test_a_link_is_bounded_in_stored_bytes_and_a_dropped_item_is_reported(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    base = feed_server.url
    at_limit, past_limit = _iri_link(base, MAX_URL_BYTES), _iri_link(base, MAX_URL_BYTES + 1)
    assert len(past_limit) < MAX_URL_BYTES  # in characters it would pass
    items = (
        _item(base, 1, link=at_limit)
        + _item(base, 2, link=past_limit)
        + _item(base, 3, link=f"{base}/articles/{'x' * 3000}")
        + _item(base, 4, link="javascript:alert(1)")
        + _item(base, 5)
    )
    site(feed_server, {"/feeds/good": rss(base, 2, prefix="good"), "/feeds/bad": _feed(items)})
    await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/bad", name="Bad", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)

    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    urls = {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}
    assert urls == {
        f"{base}/articles/good-0",
        f"{base}/articles/good-1",
        at_limit,
        f"{base}/articles/hostile-5",
    }, report
    assert sorted(report["droppedItems"], key=lambda d: d["reason"]) == [
        {"source": "Bad", "reason": LINK_NOT_HTTP, "count": 1},
        {"source": "Bad", "reason": LINK_TOO_LONG, "count": 2},
    ]
    assert report["fetchErrors"] == [] and report["writeErrors"] == []
    # dropped items never count toward parking the source
    [bad] = await db.fetch("SELECT consecutive_failures FROM news.sources WHERE name = 'Bad'")
    assert bad["consecutive_failures"] == 0


REFUSE_ONE_URL = """
CREATE FUNCTION public.refuse_one_url() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.url LIKE '%%/articles/hostile-1' THEN
        RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{sqlstate}';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_one_url BEFORE INSERT ON news.{table}
    FOR EACH ROW EXECUTE FUNCTION public.refuse_one_url();
"""


async def _refuse_hostile_1(db: Database, table: str, sqlstate: str) -> None:
    await db.execute(REFUSE_ONE_URL.format(table=table, sqlstate=sqlstate).replace("%%", "%"))


async def _good_and_bad(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    server: RecordingServer,
    *,
    bad_items: int,
    refused_by: tuple[str, str],
    **env: str,
) -> tuple[Runtime, list[int]]:
    """Shard "s": feeds Good (2 items) and Bad (``bad_items``), with ETags, and the database
    refusing Bad's first item in one table (``refused_by``: the table and the SQLSTATE). The
    runtime, and the statuses the feeds were answered with."""
    base = server.url
    statuses = site(
        server,
        {
            "/feeds/good": rss(base, 2, prefix="good"),
            "/feeds/bad": _feed("".join(_item(base, n) for n in range(1, bad_items + 1))),
        },
        etag=True,
    )
    await add_source(db, url=base + "/feeds/good", name="Good", shard="s", now=NOW)
    await add_source(db, url=base + "/feeds/bad", name="Bad", shard="s", now=NOW)
    await _refuse_hostile_1(db, *refused_by)
    return await runtime_for(db, clock, fresh_db_url, **env), statuses


async def _urls(db: Database, table: str) -> set[str]:
    return {r["url"] for r in await db.fetch(f"SELECT url FROM news.{table}")}


async def test_an_item_the_database_refuses_to_write_loses_only_itself(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """54000 is what a btree index answers for a row too big ("index row size exceeds btree
    maximum"): the item's own fault, like classes 22 and 23. The rest of its feed is written,
    the refused one is rejected with the reason, and the feed's state is saved (nothing to
    fetch again)."""
    base = feed_server.url
    runtime, _ = await _good_and_bad(
        db,
        clock,
        fresh_db_url,
        feed_server,
        bad_items=3,
        refused_by=("articles", "54000"),
    )

    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    assert await _urls(db, "articles") == {
        f"{base}/articles/good-0",
        f"{base}/articles/good-1",
        f"{base}/articles/hostile-2",
        f"{base}/articles/hostile-3",
    }, report
    [refused] = report["writeErrors"]
    assert refused["url"] == f"{base}/articles/hostile-1" and "refused by the test" in str(refused)
    assert report["fetchErrors"] == []
    [rejected] = await db.fetch("SELECT url, state FROM news.candidates")
    assert (rejected["url"], rejected["state"]) == (f"{base}/articles/hostile-1", "rejected")
    [bad] = await db.fetch("SELECT body_hash FROM news.sources WHERE name = 'Bad'")
    assert bad["body_hash"] is not None  # its state is saved: the refused item is not retried


async def test_a_write_failure_that_is_no_items_fault_holds_that_item_for_the_next_run(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """40001 (a serialization failure) is nobody's item: the article is held, with the
    reason, and written by the next run — though its feed answers 304 by then."""
    base = feed_server.url
    runtime, statuses = await _good_and_bad(
        db,
        clock,
        fresh_db_url,
        feed_server,
        bad_items=2,
        refused_by=("articles", "40001"),
    )

    first = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    assert f"{base}/articles/hostile-1" not in await _urls(db, "articles")
    assert first["fetchErrors"] == [] and first["writeErrors"] == [] and first["deferredCount"] == 1
    [held] = await db.fetch("SELECT url, state, reason, attempts FROM news.candidates")
    assert (held["url"], held["state"], held["attempts"]) == (
        f"{base}/articles/hostile-1",
        "held",
        1,
    )
    assert held["reason"].startswith("write failed for now")

    await db.execute("DROP TRIGGER refuse_one_url ON news.articles")
    clock.advance(timedelta(hours=1))
    second = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()
    assert second["processedCount"] == 1 and await _urls(db, "candidates") == set()
    assert statuses == [200, 200, 304, 304]  # both feeds' state saved by the first run
    assert {f"{base}/articles/hostile-1", f"{base}/articles/hostile-2"} <= await _urls(
        db, "articles"
    )


async def test_an_item_the_database_refuses_to_hold_loses_only_itself(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """Over the queue limit the run holds what it does not take: an item the database
    refuses to hold (54000, its own fault) is lost alone and reported; the rest of its feed
    is held, and the feed's state saved."""
    base = feed_server.url
    runtime, _ = await _good_and_bad(
        db,
        clock,
        fresh_db_url,
        feed_server,
        bad_items=3,
        refused_by=("candidates", "54000"),
        INGESTION_BACKPRESSURE_QUEUE_LIMIT="2",
    )

    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    assert await _urls(db, "articles") == {f"{base}/articles/good-0", f"{base}/articles/good-1"}
    assert await _urls(db, "candidates") == {
        f"{base}/articles/hostile-2",
        f"{base}/articles/hostile-3",
    }, report
    [refused] = report["writeErrors"]
    assert refused["url"] == f"{base}/articles/hostile-1" and "refused by the test" in str(refused)
    assert report["fetchErrors"] == []
    [bad] = await db.fetch("SELECT body_hash FROM news.sources WHERE name = 'Bad'")
    assert bad["body_hash"] is not None


async def test_a_hold_failure_that_is_no_items_fault_refetches_that_feed(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """Over the queue limit, 40001 (a serialization failure, nobody's item) while holding
    what waits: the feed's state is not saved, so the next run fetches it again and holds
    what it could not; the neighbour is written."""
    base = feed_server.url
    runtime, _ = await _good_and_bad(
        db,
        clock,
        fresh_db_url,
        feed_server,
        bad_items=2,
        refused_by=("candidates", "40001"),
        INGESTION_BACKPRESSURE_QUEUE_LIMIT="2",
    )

    first = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    assert await _urls(db, "articles") == {f"{base}/articles/good-0", f"{base}/articles/good-1"}
    assert await _urls(db, "candidates") == {f"{base}/articles/hostile-2"}
    assert [e["source"] for e in first["fetchErrors"]] == ["Bad"] and first["writeErrors"] == []
    [bad] = await db.fetch("SELECT body_hash FROM news.sources WHERE name = 'Bad'")
    assert bad["body_hash"] is None

    await db.execute("DROP TRIGGER refuse_one_url ON news.candidates")
    clock.advance(timedelta(hours=1))
    await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    assert [r.path for r in feed_server.requests if r.path == "/feeds/bad"] == ["/feeds/bad"] * 2
    assert {f"{base}/articles/hostile-1", f"{base}/articles/hostile-2"} <= await _urls(
        db, "articles"
    )


class _AlwaysAnswers:
    """A processed-URL set on "Redis" that keeps answering (nothing seen)."""

    backend = "redis"

    async def seen(self, urls: list[str]) -> set[str]:
        return set()

    async def add(self, urls: list[str]) -> None:
        return None


async def test_redis_failing_only_for_the_lease_copy_is_reported_as_redis_not_used(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """The processed set still answers, only the Redis copy of the shard lease fails (Redis
    refuses connections): the report must still say Redis was not used
    (``redisEnabled: false``), and the work goes on under PostgreSQL's lease."""
    import redis.asyncio as aioredis

    base = feed_server.url
    site(feed_server, {"/feeds/a": rss(base, 3)})
    await add_source(db, url=base + "/feeds/a", name="A", shard="s", now=NOW)
    runtime = await runtime_for(db, clock, fresh_db_url)
    nothing_there = aioredis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5, socket_timeout=1
    )
    try:
        deps = replace(deps_for(db, clock, http, redis=nothing_there), processed=_AlwaysAnswers())
        assert deps.redis_configured

        report = (await run_shard(replace(runtime, news=deps), clock, "s")).to_json()
    finally:
        await nothing_there.aclose()

    assert report["redisEnabled"] is False, report
    assert report["processedCount"] == 3 and report["deferredCount"] == 0, report
    assert len(await db.fetch("SELECT 1 FROM news.worker_reports")) == 1


def _ordinary_feed(base: str, name: str, items: int = 5) -> bytes:
    """About 40 KB in ``items`` items: over the size read on the event loop, so it is parsed
    in a worker like the hostile feeds beside it."""
    padding = "a fair and long description " * 280
    entries = "".join(
        f"<item><title>{name} story {n}</title><link>{base}/articles/{name}-{n}</link>"
        f"<description>{padding}</description></item>"
        for n in range(items)
    )
    return (
        f'<?xml version="1.0"?><rss version="2.0"><channel><title>{name}</title>{entries}'
        "</channel></rss>"
    ).encode()


async def test_hostile_feeds_that_use_their_whole_parse_budget_delay_no_ordinary_feed(
    db: Database,
    clock: FrozenClock,
    fresh_db_url: str,
    feed_server: RecordingServer,
    http: UntrustedHttp,
) -> None:
    """6 feeds of 100k linkless items, each running into its parse budget, beside 4 ordinary
    40 KB feeds that arrive after them: the ordinary feeds' articles are all written in the
    run and none of them fails (first come first served, they waited behind the hostile
    feeds' budgets and their own fetch budget ran out while they waited)."""
    from werkzeug import Request, Response

    from tests.integration.news.test_run import article_page
    from tests.integration.news.test_untrusted_bytes import linkless_feed

    base = feed_server.url
    heavy = linkless_feed(100_000)
    ordinary = {f"/feeds/o{n}": _ordinary_feed(base, f"o{n}") for n in range(4)}
    assert all(38_000 < len(body) < 48_000 for body in ordinary.values())

    def respond(request: Request) -> Response:
        if request.path.startswith("/feeds/h"):
            return Response(heavy, content_type="application/rss+xml")
        if request.path in ordinary:
            time.sleep(0.5)  # the hostile documents are queued for a parser first
            return Response(ordinary[request.path], content_type="application/rss+xml")
        if request.path.startswith("/articles/"):
            return article_page()
        return Response(status=404)

    feed_server.responder = respond
    for n in range(6):
        await add_source(db, url=f"{base}/feeds/h{n}", name=f"H{n}", shard="s", now=NOW)
    for path in ordinary:
        await add_source(db, url=base + path, name=path.rsplit("/", 1)[1], shard="s", now=NOW)
    runtime = await runtime_for(
        db, clock, fresh_db_url, NEWS_PARSE_BUDGET_SECONDS="2", NEWS_FETCH_BUDGET_SECONDS="5"
    )

    report = (
        await run_shard(replace(runtime, news=deps_for(db, clock, http)), clock, "s")
    ).to_json()

    written = {r["url"] for r in await db.fetch("SELECT url FROM news.articles")}
    expected = {f"{base}/articles/o{f}-{n}" for f in range(4) for n in range(5)}
    assert written == expected, report["fetchErrors"]
    failed = {e["source"] for e in report["fetchErrors"]}
    assert not failed & {"o0", "o1", "o2", "o3"}, report["fetchErrors"]
    counted = await db.fetch(
        "SELECT name, consecutive_failures FROM news.sources WHERE name LIKE 'o%%'"
    )
    assert {r["consecutive_failures"] for r in counted} == {0}, counted
