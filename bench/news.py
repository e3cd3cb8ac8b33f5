"""Benchmark: a full news run over 200 feeds x 50 items on loopback, offline reviewer.

    python -m bench.news [--feeds 200] [--items 50] [--repeat 3] [--profile]

Feeds are served from memory by a threaded HTTP server on 127.0.0.1, in its own process (so the
measured process's time and GIL are nightcrew's alone, as with other people's feed servers),
allowed by an ``AddressPolicy``. It sends no ETag or Last-Modified: an unchanged feed is known
by its body's SHA-256. Every item carries its own media:thumbnail, so no article page is
fetched. Each repetition takes a fresh database and runs the shard twice: once with everything
new, then an hour later (every source due again) with the feeds unchanged. Reported, as
medians of ``--repeat`` repetitions:

* bare ``feedparser.parse`` of the same bytes, items per second — the baseline (parsing alone,
  with the parser nightcrew used before issue 10); bare ``feedparser_rs.parse`` for reference;
* the first run — fetch, parse (``news/steps/parse.py``: feedparser-rs, feedparser as fallback),
  de-dupe, hold, count, review, fenced writes, snapshot, report — and its throughput over the
  baseline's; how much of it ``parse_feed`` and ``entries._items`` took (timed, not profiled);
* the second run — every body unchanged: fetched, hashed, not parsed, nothing held — as a
  fraction of the bare feedparser time.

The process's collector is set up as the ``nightcrew`` command sets its own
(``gc_tuning.py``), before either side is timed.

Targets (issue 10): first-run throughput >= 2.0x bare feedparser; the second run's time
<= 0.2x bare feedparser's. ``--profile`` adds one repetition whose runs go under cProfile (not
counted in the medians): the parser's share of the first run, its top 25 functions by
cumulative and by own time, and the second run's top 25 by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import multiprocessing
import pstats
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

import feedparser
import feedparser_rs

from bench._db import admin_url, drop, recreate
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.gc_tuning import tune_for_bursts
from nightcrew.log import configure_logging
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.report import NewsReport
from nightcrew.news.sources.registry import add_source
from nightcrew.news.steps import entries as news_entries
from nightcrew.news.steps import fetch as news_fetch
from nightcrew.news.steps.parse import parse_feed

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
DB_NAME = "nightcrew_bench_news"
FIRST_RUN_TARGET = 2.0  # first-run items/s over bare feedparser items/s, at least
SECOND_RUN_TARGET = 0.2  # second-run time over bare feedparser time, at most
TOP = 25


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


def feed_paths(feeds: int) -> list[str]:
    return [f"/feeds/{f}" for f in range(feeds)]


class _FeedHTTPServer(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: eight connections opened at once overflow it
    # and the kernel drops a SYN, which the client re-sends a whole second later
    request_queue_size = 128
    daemon_threads = True


def _serve(conn: Connection, feeds: int, items: int) -> None:
    """The feed server's process: GET /feeds/N from memory, no ETag or Last-Modified."""
    bodies = {path: feed_bytes(f, items) for f, path in enumerate(feed_paths(feeds))}
    served = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive
        disable_nagle_algorithm = True  # no delayed-ACK stall between headers and body

        def do_GET(self) -> None:
            if self.path == "/stats":
                body = str(served[0]).encode()
            else:
                body = bodies.get(self.path, b"")
                with lock:
                    served[0] += 1
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/rss+xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = _FeedHTTPServer(("127.0.0.1", 0), Handler)
    conn.send(server.server_address[1])
    server.serve_forever()


class FeedServer:
    """The feeds on 127.0.0.1, served by another process: the measured process's time (and
    its GIL) is nightcrew's alone, as it is when the feeds are other people's servers."""

    def __init__(self, feeds: int, items: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, feeds, items), daemon=True)
        self._proc.start()
        child.close()  # so that a server that dies before answering is an EOF, not a wait
        if not parent.poll(60):
            raise RuntimeError("the feed server did not start")
        self.port: int = parent.recv()
        self.base = f"http://127.0.0.1:{self.port}"

    def served(self) -> int:
        """How many feed GETs it has answered."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/stats")
            return int(conn.getresponse().read())
        finally:
            conn.close()

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.join(timeout=10)


def time_parser(parse: Callable[[bytes], Any], bodies: list[bytes], total: int) -> float:
    started = time.perf_counter()
    parsed = sum(len(parse(body).entries) for body in bodies)
    elapsed = time.perf_counter() - started
    assert parsed == total, f"{parsed} entries parsed, {total} expected"
    return elapsed


class Stopwatch:
    """Wall time spent inside some synchronous functions of the fetch step (wrapped where they
    are looked up: ``parse_fast_only`` in ``steps.fetch``, ``_items`` in ``steps.entries``), so
    the parser's share of a run is known without a profiler's distortion. Disabled, it wraps
    nothing (a profile shows the code as it is)."""

    # a small feed is parsed in place by parse_fast_only; others in a worker, not timed here
    TARGETS = ((news_fetch, "parse_fast_only"), (news_entries, "_items"))
    NAMES = tuple(name for _, name in TARGETS)

    def __init__(self, *, enabled: bool = True) -> None:
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self._originals = (
            {(module, name): getattr(module, name) for module, name in self.TARGETS}
            if enabled
            else {}
        )

    def __enter__(self) -> Stopwatch:
        for (module, name), original in self._originals.items():
            setattr(module, name, self._timed(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for (module, name), original in self._originals.items():
            setattr(module, name, original)

    def _timed(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return timed


@dataclass(frozen=True)
class Repetition:
    first_s: float
    second_s: float
    first: NewsReport
    second: NewsReport
    inside: dict[str, float]  # Stopwatch seconds during the first run
    profiles: tuple[cProfile.Profile, cProfile.Profile] | None


async def timed_run(
    run: Awaitable[NewsReport], profiler: cProfile.Profile | None
) -> tuple[NewsReport, float]:
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    try:
        report = await run
    finally:
        if profiler is not None:
            profiler.disable()
    return report, time.perf_counter() - started


async def repetition(
    admin: str, server: FeedServer, paths: list[str], total: int, *, profile: bool = False
) -> Repetition:
    """A fresh database, the first run, the second run (each under cProfile if ``profile``)."""
    profiles = (cProfile.Profile(), cProfile.Profile()) if profile else None
    url = recreate(admin, DB_NAME)
    try:
        db = await Database.open(url)
        try:
            await migrate(db)
            for path in paths:
                await add_source(db, url=server.base + path, name=path, shard="bench", now=NOW)
            clock = FrozenClock(NOW)
            settings = Settings.model_validate(
                {
                    "DATABASE_URL": url,
                    "STORAGE_URL": "memory://",
                    "NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
                    "INGESTION_BACKPRESSURE_QUEUE_LIMIT": total,
                    "INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT": total * 10,
                    "MAX_AI_REVIEWS": total,
                }
            )
            # the service's own assembly: PostgreSQL leases (no REDIS_URL), the offline
            # reviewer (no model configured), the policy client allowing the loopback server
            async with open_runtime(settings, clock) as runtime:
                served = server.served()
                with Stopwatch(enabled=not profile) as inside:
                    first, first_s = await timed_run(
                        run_shard(runtime, clock, "bench"), profiles and profiles[0]
                    )
                first_gets = server.served() - served
                hashed = await db.fetch_one(
                    "SELECT count(*) AS n FROM news.sources WHERE body_hash IS NOT NULL"
                )
                clock.advance(timedelta(hours=1))  # every source is due again
                second, second_s = await timed_run(
                    run_shard(runtime, clock, "bench"), profiles and profiles[1]
                )
                second_gets = server.served() - served - first_gets
        finally:
            await db.close()
    finally:
        drop(admin, DB_NAME)
    # the figures only mean something if the runs did what they are meant to
    assert not first.fetch_errors and not first.write_errors, first.to_json()
    assert first.processed_count == total, f"first run processed {first.processed_count}"
    assert hashed is not None and hashed["n"] == len(paths), f"body hashes kept: {hashed}"
    # the second run fetched every feed again (none skipped as not yet due) and held nothing
    assert first_gets == second_gets == len(paths), f"GETs: {first_gets}, {second_gets}"
    assert not second.fetch_errors, second.to_json()
    assert second.queued_count == 0 and second.processed_count == 0, second.to_json()
    return Repetition(
        first_s=first_s,
        second_s=second_s,
        first=first,
        second=second,
        inside=inside.seconds,
        profiles=profiles,
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_profile(rep: Repetition) -> None:
    assert rep.profiles is not None
    first, second = (pstats.Stats(p) for p in rep.profiles)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = first.stats  # type: ignore[attr-defined]
    total_tt: float = first.total_tt  # type: ignore[attr-defined]

    def cumulative(match: Callable[[str, str], bool]) -> float:
        return sum(ct for (file, _, name), (_, _, _, ct, _) in raw.items() if match(file, name))

    idle = cumulative(lambda f, n: f == "~" and n.startswith("<method 'poll' of 'select."))
    shares = {
        "news/steps/parse.py:parse_feed (the whole parser step)": cumulative(
            lambda f, n: f.endswith("news/steps/parse.py") and n == "parse_feed"
        ),
        "  feedparser_rs.parse (Rust, and building its Python objects)": cumulative(
            lambda f, n: f == "~" and "feedparser_rs" in n and n.endswith(".parse>")
        ),
        "  news/steps/parse.py:_from_result (reduction to RawEntry)": cumulative(
            lambda f, n: f.endswith("news/steps/parse.py") and n == "_from_result"
        ),
        "  feedparser.parse (the fallback)": cumulative(
            lambda f, n: f.endswith("feedparser/api.py") and n == "parse"
        ),
        "news/steps/entries.py:_items (sanitise, normalise, image policy)": cumulative(
            lambda f, n: f.endswith("news/steps/entries.py") and n == "_items"
        ),
        "event loop idle (waiting on sockets: PostgreSQL, the feed server)": idle,
    }
    print(
        f"\n== cProfile of one first run: {rep.first_s:.2f} s wall under the profiler, "
        f"{total_tt:.2f} s profiled (main thread; PostgreSQL and the feed server are other "
        "processes); share of the profiled time:"
    )
    for label, seconds in shares.items():
        print(f"   {label:<68} {seconds:6.2f} s  {seconds / total_tt:6.1%}")
    for key in ("cumulative", "tottime"):
        print(f"\n-- first run: top {TOP} by {key}")
        first.sort_stats(key).print_stats(TOP)
    print(f"\n-- first run: nightcrew's own functions, top {TOP} by cumulative")
    first.sort_stats("cumulative").print_stats("src/nightcrew", TOP)
    print(f"\n-- second run ({rep.second_s:.2f} s under the profiler): top {TOP} by tottime")
    second.sort_stats("tottime").print_stats(TOP)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--feeds", type=int, default=200)
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians reported")
    parser.add_argument(
        "--profile", action="store_true", help="one more repetition, its runs under cProfile"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    configure_logging("error")
    tune_for_bursts()  # the process set up as the nightcrew command sets itself (both sides)
    paths = feed_paths(args.feeds)
    bodies = [feed_bytes(f, args.items) for f in range(args.feeds)]
    total = args.feeds * args.items
    chosen = parse_feed(bodies[0], "http://127.0.0.1/feeds/0").parser

    reps: list[Repetition] = []
    fp_times: list[float] = []
    rs_times: list[float] = []
    server = FeedServer(args.feeds, args.items)
    try:
        with admin_url() as admin:
            for n in range(args.repeat):
                fp_times.append(time_parser(feedparser.parse, bodies, total))
                rs_times.append(time_parser(feedparser_rs.parse, bodies, total))
                reps.append(await repetition(admin, server, paths, total))
                r = reps[-1]
                print(
                    f"   repetition {n + 1}/{args.repeat}: feedparser {fp_times[-1]:.3f} s, "
                    f"feedparser-rs {rs_times[-1]:.3f} s, first run {r.first_s:.3f} s, "
                    f"second run {r.second_s:.3f} s",
                    flush=True,
                )
            if args.profile:
                profiled = await repetition(admin, server, paths, total, profile=True)
    finally:
        server.stop()

    fp_s, rs_s = statistics.median(fp_times), statistics.median(rs_times)
    first_s = statistics.median(r.first_s for r in reps)
    second_s = statistics.median(r.second_s for r in reps)
    fp_rate, rs_rate, first_rate = total / fp_s, total / rs_s, total / first_s
    ratio, fraction = first_rate / fp_rate, second_s / fp_s
    first, second = reps[-1].first, reps[-1].second
    print(
        f"\n== {args.feeds} feeds x {args.items} items = {total:,} items "
        f"(loopback, offline reviewer; medians of {args.repeat}; parse_feed picks {chosen})"
    )
    print(f"   bare feedparser.parse:     {fp_s:7.3f} s  ({fp_rate:>9,.0f} items/s)  baseline")
    print(
        f"   bare feedparser_rs.parse:  {rs_s:7.3f} s  ({rs_rate:>9,.0f} items/s)  "
        f"reference: {fp_s / rs_s:.1f}x feedparser"
    )
    print(
        f"   first run:                 {first_s:7.3f} s  ({first_rate:>9,.0f} items/s)  "
        f"{ratio:.2f}x bare feedparser (target >= {FIRST_RUN_TARGET}x: "
        f"{verdict(ratio >= FIRST_RUN_TARGET)}) — processed {first.processed_count:,}, "
        f"accepted {first.accepted_count:,}"
    )
    print(
        f"   second run (unchanged):    {second_s:7.3f} s  "
        f"{fraction:.3f}x the bare feedparser time (target <= {SECOND_RUN_TARGET}x: "
        f"{verdict(fraction <= SECOND_RUN_TARGET)}) — queued {second.queued_count}, "
        f"processed {second.processed_count}, reviewed {second.ai_reviewed_count}"
    )
    parse_s = statistics.median(r.inside["parse_fast_only"] for r in reps)
    items_s = statistics.median(r.inside["_items"] for r in reps)
    print(
        f"   inside the first run:      parse_fast_only {parse_s:.3f} s ({parse_s / first_s:.1%}), "
        f"items from entries (entries._items) {items_s:.3f} s ({items_s / first_s:.1%})"
    )
    if args.profile:
        print_profile(profiled)


if __name__ == "__main__":
    asyncio.run(main())
