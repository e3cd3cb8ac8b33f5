"""Benchmark: news at the model's speed — reviews with C calls in flight against the bound N·d/C.

    python -m bench.news_model [--articles 2000] [--delay 0.2] [--concurrency 1,4,16,64]
                               [--serial-articles 400] [--engines inline,pipeline] [--repeat 1]

N loopback articles (``--articles``; feeds of 100 items, thumbnails given, so no article page
is fetched) and an OpenAI-compatible model stand-in that answers each review after ``--delay``
seconds (d) and counts the calls in flight, both served by a child process (threaded HTTP
servers on 127.0.0.1), so the measured process's time and GIL are nightcrew's alone. For each
NEWS_AI_CONCURRENCY C, each on a fresh database:

* the inline run: one ``news run`` of the shard (the limits set above the workload, so one run
  takes everything), timed from its start to its report;
* one pipeline worker (``nightcrew news worker --stage all``, prefetch 2·C per stage): one pass,
  timed from the pass's start until every article is written.

Reported per run: seconds, articles per second, the bound N·d/C, the ratio to it, and the most
calls the stand-in saw in flight. At C = 1 the run reviews ``--serial-articles`` articles (the
serial bound for 2,000 would be 400 s); speeds are compared as articles per second. Targets
(issue 34): N = 2,000, d = 0.2 s, C = 16: <= 1.3x the bound in both engines; C = 64: >= 40x the
serial run's speed, or say where it saturates. ``--delay 1.5 --articles 500 --concurrency 16``:
a hosted model's latency. Needs PostgreSQL (``DATABASE_URL``, else pgserver) and, for the
pipeline, RabbitMQ on 127.0.0.1:5672 (``NIGHTCREW_BENCH_AMQP_URL``).
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

from bench._db import admin_url, drop
from bench.news_pipeline import _delete, _fresh, _settings, _written
from nightcrew.assembly import open_runtime
from nightcrew.clock import SystemClock
from nightcrew.config import Settings
from nightcrew.gc_tuning import tune_for_bursts
from nightcrew.log import configure_logging
from nightcrew.news.engines.inline import run_shard
from nightcrew.news.engines.pipeline.passes import run_pass

DB_NAME = "nightcrew_bench_model"
ITEMS_PER_FEED = 100


def _serve(articles: int, delay: float, pipe: Connection) -> None:
    """The feeds and the model, in their own process; asked over ``pipe``: ("feeds", n) → the
    first n/100 feeds' URLs, "reset" → counters zeroed, "stats" → (most in flight, calls),
    "done" → stop."""
    farm = FeedFarm(max(1, articles // ITEMS_PER_FEED), ITEMS_PER_FEED, thumbnails=True)
    model = ModelStandIn(delay)
    farm.start()
    model.start()
    pipe.send(model.base_url)
    while True:
        command = pipe.recv()
        if command == "done":
            break
        if command == "reset":
            with model.lock:
                model.calls.clear()
                model.most_in_flight = 0
            pipe.send(None)
        elif command == "stats":
            with model.lock:
                pipe.send((model.most_in_flight, len(model.calls)))
        else:
            _, n = command
            pipe.send(farm.feed_urls()[: max(1, n // ITEMS_PER_FEED)])
    farm.stop()
    model.stop()


@dataclass(frozen=True)
class Result:
    engine: str
    concurrency: int
    articles: int
    seconds: float
    delay: float
    most_in_flight: int

    @property
    def rate(self) -> float:
        return self.articles / self.seconds

    @property
    def bound(self) -> float:
        return self.articles * self.delay / self.concurrency

    def line(self) -> str:
        return (
            f"  {self.engine:<8} C={self.concurrency:<3} N={self.articles:<5}"
            f" {self.seconds:7.1f} s  {self.rate:7.1f} articles/s  bound {self.bound:6.1f} s"
            f"  {self.seconds / self.bound:5.2f}x the bound  {self.most_in_flight:>3} in flight"
        )


async def inline(
    admin: str, feeds: list[str], model: str, store: Path, total: int, conc: int
) -> float:
    url, db = await _fresh(admin, feeds, DB_NAME)
    try:
        env = _settings(url, model, "unused", store, total, "inline", conc)
        clock = SystemClock()
        async with open_runtime(Settings.model_validate(env), clock, db=db) as runtime:
            started = time.perf_counter()
            report = await run_shard(runtime, clock, "bench")
            seconds = time.perf_counter() - started
        if report.processed_count != total:
            raise SystemExit(f"inline: {report.processed_count} of {total} written")
        return seconds
    finally:
        await db.close()
        drop(admin, DB_NAME)


async def pipeline(
    admin: str, feeds: list[str], model: str, store: Path, total: int, conc: int
) -> float:
    url, db = await _fresh(admin, feeds, DB_NAME)
    prefix = f"bench-{uuid4().hex[:8]}"
    env = _settings(url, model, prefix, store, total, "rabbitmq", conc)
    nightcrew = str(Path(sys.executable).parent / "nightcrew")
    worker: asyncio.subprocess.Process | None = None
    try:
        clock = SystemClock()
        async with open_runtime(Settings.model_validate(env), clock, db=db) as runtime:
            await runtime.news_adapters().pipeline.connect()  # type: ignore[union-attr]
            worker = await asyncio.create_subprocess_exec(
                nightcrew,
                *("news", "worker", "--stage", "all", "--concurrency", str(max(4, 2 * conc))),
                env={**os.environ, **env},
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.sleep(2)  # the worker connects and starts consuming
            started = time.perf_counter()
            await run_pass(runtime, clock, "bench")
            while await _written(db) < total:  # noqa: ASYNC110 (another process writes them)
                await asyncio.sleep(0.05)
            seconds = time.perf_counter() - started
        return seconds
    finally:
        if worker is not None and worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
            await worker.wait()
        await db.close()
        drop(admin, DB_NAME)
        await _delete(prefix)


def _ask(pipe: Connection, command: Any) -> Any:
    pipe.send(command)
    return pipe.recv()


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning")
    tune_for_bursts()  # as the `news run` and `news worker` commands set up their processes
    levels = [int(c) for c in args.concurrency.split(",")]
    engines = args.engines.split(",")
    parent, child = multiprocessing.Pipe()
    servers = multiprocessing.Process(
        target=_serve, args=(args.articles, args.delay, child), daemon=True
    )
    servers.start()
    model = parent.recv()
    store = Path(tempfile.mkdtemp(prefix="nightcrew-bench-model-"))
    print(
        f"news at the model's speed: N = {args.articles} articles ({args.serial_articles} at"
        f" C = 1), model {args.delay * 1000:.0f} ms per review, {os.cpu_count()} cores;"
        f" medians of {args.repeat}"
    )
    results: dict[tuple[str, int], list[Result]] = {}
    began = time.perf_counter()
    try:
        with admin_url() as admin:
            for _ in range(args.repeat):
                for conc in levels:
                    total = args.serial_articles if conc == 1 else args.articles
                    feeds = _ask(parent, ("feeds", total))
                    total = len(feeds) * ITEMS_PER_FEED
                    for engine in engines:
                        _ask(parent, "reset")
                        run = inline if engine == "inline" else pipeline
                        seconds = await run(admin, feeds, model, store, total, conc)
                        most, _ = _ask(parent, "stats")
                        r = Result(engine, conc, total, seconds, args.delay, most)
                        results.setdefault((engine, conc), []).append(r)
                        print(r.line(), flush=True)
    finally:
        parent.send("done")
        servers.join(5)
        shutil.rmtree(store, ignore_errors=True)
    print(
        f"medians (of {args.repeat} runs each; the whole benchmark took"
        f" {time.perf_counter() - began:.0f} s):"
    )
    median: dict[tuple[str, int], Result] = {}
    for key, runs in results.items():
        seconds = statistics.median(r.seconds for r in runs)
        median[key] = Result(
            key[0],
            key[1],
            runs[0].articles,
            seconds,
            args.delay,
            max(r.most_in_flight for r in runs),
        )
        print(median[key].line())
    for engine in engines:
        at16 = median.get((engine, 16))
        if at16 is not None and at16.articles == 2000 and args.delay == 0.2:
            ratio = at16.seconds / at16.bound
            verdict = "met" if ratio <= 1.3 else "MISSED"
            print(f"  {engine}: C=16 at {ratio:.2f}x the bound (target <= 1.3x): {verdict}")
        serial, at64 = median.get((engine, 1)), median.get((engine, 64))
        if serial is not None and at64 is not None:
            speedup = at64.rate / serial.rate
            verdict = "met" if speedup >= 40 else "MISSED"
            print(f"  {engine}: C=64 {speedup:.1f}x the serial speed (target >= 40x): {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--articles", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--serial-articles", type=int, default=400)
    parser.add_argument("--engines", default="inline,pipeline")
    parser.add_argument("--repeat", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
