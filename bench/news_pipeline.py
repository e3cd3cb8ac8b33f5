"""Benchmark: the news pipeline on RabbitMQ against the inline run, with a model that is slow.

    python -m bench.news_pipeline [--feeds 200] [--items 50] [--delay 0.1]
                                  [--workers 1,2,4] [--concurrency 1] [--repeat 1] [--no-inline]

``--feeds`` loopback RSS feeds of ``--items`` items each (no thumbnails: every article's page is
fetched for its og:image) and an OpenAI-compatible model stand-in that answers each review after
``--delay`` seconds, both served by a child process (threaded HTTP servers on 127.0.0.1), so the
measured processes' time and GIL are nightcrew's alone. Then, each on a fresh database:

* the inline run: ``news run`` of the shard, repeated until every article is written (one run
  takes everything: ``MAX_AI_REVIEWS`` and the backpressure limits are set above the workload);
* the pipeline with 1, 2 and 4 ``nightcrew news worker --stage all --concurrency C`` processes:
  one pass (it waits for its fetches, then admits everything), the workers until every article
  is written — and another pass should the workers finish with articles fetched after the
  first pass stopped waiting for them.

The inline run and each worker have the same model calls in flight (``NEWS_AI_CONCURRENCY`` =
``--concurrency``), as before the inline run reviewed concurrently. Reported: seconds and
articles per second for each, the speed-up of N workers over one, and one
worker against the inline run. Targets (issue 13): 4 workers >= 3x one worker; one worker within
1.2x the inline run (articles per second >= inline / 1.2). Needs RabbitMQ on 127.0.0.1:5672
(``NIGHTCREW_BENCH_AMQP_URL``) and PostgreSQL (``DATABASE_URL``, else pgserver).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from uuid import uuid4

from tests.support.standins import FeedFarm, ModelStandIn

from bench._db import admin_url, drop, recreate
from nightcrew.adapters.broker import PipelineBroker
from nightcrew.assembly import open_runtime
from nightcrew.clock import SystemClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.gc_tuning import tune_for_bursts
from nightcrew.log import configure_logging
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline.passes import run_pass
from nightcrew.news.sources.registry import add_source

AMQP_URL = os.environ.get("NIGHTCREW_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DB_NAME = "nightcrew_bench_pipeline"


def _serve(feeds: int, items: int, delay: float, pipe: Connection) -> None:
    farm, model = FeedFarm(feeds, items), ModelStandIn(delay)
    farm.start()
    model.start()
    pipe.send((farm.feed_urls(), model.base_url))
    pipe.recv()  # until the benchmark is done
    farm.stop()
    model.stop()


@dataclass(frozen=True)
class Result:
    label: str
    seconds: float
    articles: int

    @property
    def rate(self) -> float:
        return self.articles / self.seconds


def _settings(
    url: str, model: str, prefix: str, store: Path, total: int, pipeline: str, calls: int
) -> Any:
    return {
        "DATABASE_URL": url,
        "QUEUE_URL": AMQP_URL,
        "NEWS_PIPELINE": pipeline,
        "NEWS_QUEUE_PREFIX": prefix,
        "NEWS_ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
        "NEWS_AI_BASE_URL": model,
        "NEWS_AI_MODEL": "stand-in",
        "STORAGE_URL": f"file://{store}",
        "INGESTION_BACKPRESSURE_QUEUE_LIMIT": str(total * 2),
        "INGESTION_BACKPRESSURE_DB_ARTICLE_LIMIT": str(total * 10),
        "MAX_AI_REVIEWS": str(total * 2),
        # like for like: the inline run and each worker with the same calls in flight (a
        # worker's are bounded by its prefetch, --concurrency, too); bench.news_model measures
        # what more calls in flight buy
        "NEWS_AI_CONCURRENCY": str(calls),
        "NIGHTCREW_LOG_LEVEL": "warning",
    }


async def _fresh(admin: str, feeds: list[str], name: str = DB_NAME) -> tuple[str, Database]:
    """A new database ``name`` (migrated), ``feeds`` its shard "bench"'s sources."""
    url = recreate(admin, name)
    db = await Database.open(url)
    await migrate(db)
    now = SystemClock().now()
    for n, feed in enumerate(feeds):
        await add_source(db, url=feed, name=f"feed {n}", shard="bench", now=now)
    return url, db


async def _written(db: Database) -> int:
    row = await db.fetch_one("SELECT count(*) AS n FROM news.articles")
    return int(row["n"]) if row else 0


async def _in_flight(db: Database) -> int:
    """What the workers still have to do of what the passes sent: fetches, admitted articles."""
    row = await db.fetch_one(
        "SELECT (SELECT count(*) FROM news.sources WHERE fetch_queued_at IS NOT NULL)"
        " + (SELECT count(*) FROM news.candidates WHERE admitted_at IS NOT NULL"
        "    AND state IN ('queued', 'held')) AS n"
    )
    return int(row["n"]) if row else 0


async def inline(
    admin: str, feeds: list[str], model: str, total: int, store: Path, conc: int
) -> Result:
    url, db = await _fresh(admin, feeds)
    try:
        env = _settings(url, model, "unused", store, total, "inline", conc)
        clock = SystemClock()
        async with open_runtime(Settings.model_validate(env), clock, db=db) as runtime:
            started = time.perf_counter()
            while await _written(db) < total:
                await run_shard(runtime, clock, "bench")
            seconds = time.perf_counter() - started
        return Result("inline run", seconds, await _written(db))
    finally:
        await db.close()
        drop(admin, DB_NAME)


async def pipeline(
    admin: str, feeds: list[str], model: str, total: int, store: Path, workers: int, conc: int
) -> Result:
    url, db = await _fresh(admin, feeds)
    prefix = f"bench-{uuid4().hex[:8]}"
    env = _settings(url, model, prefix, store, total, "rabbitmq", conc)
    nightcrew = str(Path(sys.executable).parent / "nightcrew")
    procs: list[asyncio.subprocess.Process] = []
    try:
        clock = SystemClock()
        async with open_runtime(Settings.model_validate(env), clock, db=db) as runtime:
            await runtime.news_adapters().pipeline.connect()  # type: ignore[union-attr]
            for _ in range(workers):
                procs.append(
                    await asyncio.create_subprocess_exec(
                        nightcrew,
                        *("news", "worker", "--stage", "all", "--concurrency", str(conc)),
                        env={**os.environ, **env},
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.DEVNULL,
                    )
                )
            await asyncio.sleep(2)  # the workers connect and start consuming
            started = time.perf_counter()
            await run_pass(runtime, clock, "bench")
            while await _written(db) < total:
                if not await _in_flight(db):  # a pass whose fetches outlasted its wait: another
                    await run_pass(runtime, clock, "bench")
                await asyncio.sleep(0.1)
            seconds = time.perf_counter() - started
        label = f"pipeline, {workers} worker{'s' if workers > 1 else ''} x concurrency {conc}"
        return Result(label, seconds, await _written(db))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await proc.wait()
        await db.close()
        drop(admin, DB_NAME)
        await _delete(prefix)


async def _delete(prefix: str) -> None:
    broker = PipelineBroker(AMQP_URL, prefix=prefix, max_deliveries=5)
    try:
        await broker.delete_topology()
    finally:
        await broker.close()


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning")  # the passes' and inline runs' info events would drown the table
    tune_for_bursts()  # the inline runs here in a process set up as the workers' command is
    counts = [int(n) for n in args.workers.split(",")]
    total = args.feeds * args.items
    parent, child = multiprocessing.Pipe()
    servers = multiprocessing.Process(
        target=_serve, args=(args.feeds, args.items, args.delay, child), daemon=True
    )
    servers.start()
    feeds, model = parent.recv()
    store = Path(tempfile.mkdtemp(prefix="nightcrew-bench-pipeline-"))
    print(
        f"news pipeline: {args.feeds} feeds x {args.items} items = {total} articles, model"
        f" {args.delay * 1000:.0f} ms per review, {os.cpu_count()} cores; medians of"
        f" {args.repeat}"
    )
    began = time.perf_counter()
    results: dict[str, list[Result]] = {}
    try:
        with admin_url() as admin:
            for _ in range(args.repeat):
                if not args.no_inline:
                    r = await inline(admin, feeds, model, total, store, args.concurrency)
                    results.setdefault("inline", []).append(r)
                    print(f"  {r.label:<42} {r.seconds:8.1f} s  {r.rate:7.1f} articles/s")
                for n in counts:
                    r = await pipeline(admin, feeds, model, total, store, n, args.concurrency)
                    results.setdefault(str(n), []).append(r)
                    print(f"  {r.label:<42} {r.seconds:8.1f} s  {r.rate:7.1f} articles/s")
    finally:
        parent.send("done")
        servers.join(5)
        shutil.rmtree(store, ignore_errors=True)
    rate = {k: statistics.median(r.rate for r in v) for k, v in results.items()}
    print(
        f"medians (of {args.repeat} runs each; the whole benchmark took"
        f" {time.perf_counter() - began:.0f} s):"
    )
    for key, value in rate.items():
        print(f"  {results[key][0].label:<42} {value:7.1f} articles/s")
    if "1" in rate:
        for n in counts[1:]:
            print(f"  {n} workers over 1: {rate[str(n)] / rate['1']:.2f}x")
        if "4" in rate:
            verdict = "met" if rate["4"] / rate["1"] >= 3 else "MISSED"
            print(f"  target 4 workers >= 3x one worker: {verdict}")
        if "inline" in rate:
            ratio = rate["inline"] / rate["1"]
            verdict = "met" if ratio <= 1.2 else "MISSED"
            print(f"  inline / one worker: {ratio:.2f}x (target <= 1.2x): {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feeds", type=int, default=200)
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-inline", action="store_true")
    asyncio.run(main(parser.parse_args()))
