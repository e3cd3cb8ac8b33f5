"""Benchmark: hard-deleting one podcast with 10,000 objects and 2,000 episodes.

    python -m bench.hard_delete [--objects 10000] [--episodes 2000] [--stores file,s3]

For each store — local files, and S3 through a moto server on loopback — it loads the podcast,
then times ``hard_delete_expired_podcasts`` (the real daily-lane job: the cascading DELETE, the
storage cleanup, the invalidation message) and reports:

* wall time of the job;
* store requests: for S3, the HTTP requests moto's server actually logged during the job
  (counted from its request log, by method); for local files, the adapter's operations;
* peak memory during the job: Python allocations (tracemalloc) and the process's peak RSS
  (VmHWM, reset just before the job through /proc/self/clear_refs).

Target (issue 3): requests <= objects/1000 + list pages + 2.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._db import admin_url, drop, proc_kib, recreate, reset_peak_rss
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import ObjectStore, open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts
from nightcrew.log import configure_logging

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
REQUEST_LINE = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) ')


class MotoServer:
    """moto's S3 server as a subprocess whose request log we can count."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        import httpx

        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/moto-api/", timeout=0.5)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("moto server did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> dict[str, int]:
        time.sleep(0.3)  # let the server flush its log
        counts: dict[str, int] = {}
        for line in self.log.read_text().splitlines():
            match = REQUEST_LINE.search(line)
            if match:
                counts[match[1]] = counts.get(match[1], 0) + 1
        return counts

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)


async def _load(db: Database, store: ObjectStore, objects: int, episodes: int) -> str:
    podcast = str(uuid.uuid4())
    await db.execute(
        "INSERT INTO public.podcasts (id, slug, title, status, deletion_scheduled_at)"
        " VALUES (%(id)s, %(slug)s, 'Bench', 'pending_deletion', %(due)s)",
        {"id": podcast, "slug": f"bench-{podcast[:8]}", "due": NOW - timedelta(days=1)},
    )
    rows = await db.fetch(
        "INSERT INTO public.episodes (podcast_id, title, status)"
        " SELECT %(p)s, 'Episode ' || g, 'published' FROM generate_series(1, %(n)s) g"
        " RETURNING id",
        {"p": podcast, "n": episodes},
    )
    ids = [str(r["id"]) for r in rows]
    gate = asyncio.Semaphore(64)

    async def put(n: int) -> None:
        async with gate:
            episode = ids[n % len(ids)]
            await store.put(f"podcasts/{podcast}/e/{episode}/audio-{n}.mp3", b"\x00" * 256)

    await asyncio.gather(*(put(n) for n in range(objects)))
    return podcast


async def measure(
    url: str, store: ObjectStore, objects: int, episodes: int, moto: MotoServer | None
) -> dict[str, Any]:
    db = await Database.open(url)
    try:
        await migrate(db)
        await _load(db, store, objects, episodes)
        clock = FrozenClock(NOW)
        async with open_runtime(
            Settings.model_validate({"DATABASE_URL": url}),
            clock,
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=store,
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
        ) as runtime:
            before_http = moto.requests() if moto else {}
            store.stats.list_pages = store.stats.delete_requests = store.stats.heads = 0
            store.stats.puts = 0
            rss_before = proc_kib("VmRSS")
            rss_reset = reset_peak_rss()
            tracemalloc.start()
            started = time.perf_counter()
            report = await hard_delete_expired_podcasts(runtime, clock)
            wall = time.perf_counter() - started
            _, py_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            hwm = proc_kib("VmHWM")
            after_http = moto.requests() if moto else {}
    finally:
        await db.close()
    assert report.counts()["objects_deleted"] == objects and not report.errors, report
    http = {k: after_http.get(k, 0) - before_http.get(k, 0) for k in after_http}
    pages = -(-objects // 1000)
    return {
        "wall_s": wall,
        "adapter": {
            "list_pages": store.stats.list_pages,
            "delete_requests": store.stats.delete_requests,
        },
        "http": {k: v for k, v in http.items() if v},
        "requests": sum(http.values()) if moto else store.stats.requests,
        "target": objects // 1000 + pages + 2,
        "py_peak_mib": py_peak / 2**20,
        "rss_peak_mib": hwm / 1024 if rss_reset else None,
        "rss_before_mib": rss_before / 1024,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--episodes", type=int, default=2_000)
    parser.add_argument("--stores", default="file,s3")
    args = parser.parse_args()
    configure_logging("warning")

    with admin_url() as admin:
        for kind in args.stores.split(","):
            name = f"nightcrew_bench_delete_{kind}"
            url = recreate(admin, name)
            moto = None
            try:
                if kind == "s3":
                    moto = MotoServer()
                    import boto3

                    boto3.client(
                        "s3",
                        endpoint_url=moto.endpoint,
                        aws_access_key_id="x",
                        aws_secret_access_key="x",
                        region_name="us-east-1",
                    ).create_bucket(Bucket="media")
                    store = open_store(
                        f"s3://media?endpoint={moto.endpoint}&region=us-east-1",
                        credentials={"access_key_id": "x", "secret_access_key": "x"},
                    )
                else:
                    store = open_store(f"file://{tempfile.mkdtemp(prefix='nightcrew-bench-')}")
                print(
                    f"\n== {kind}: {args.objects:,} objects, {args.episodes:,} episodes", flush=True
                )
                r = await measure(url, store, args.objects, args.episodes, moto)
            finally:
                if moto:
                    moto.stop()
                drop(admin, name)
            print(f"   job wall time:   {r['wall_s']:.2f} s")
            what = (
                f"HTTP requests seen by moto {r['http']}"
                if kind == "s3"
                else f"adapter operations {r['adapter']}"
            )
            print(f"   store requests:  {r['requests']}  ({what})")
            print(
                f"   target:          <= {r['target']} (objects/1000 + list pages + 2) → "
                f"{'met' if r['requests'] <= r['target'] else 'MISSED'}"
            )
            rss = f"{r['rss_peak_mib']:.1f} MiB" if r["rss_peak_mib"] is not None else "n/a"
            print(
                f"   peak memory:     Python allocations {r['py_peak_mib']:.1f} MiB, "
                f"process RSS {rss} (RSS before the job: {r['rss_before_mib']:.1f} MiB)"
            )


if __name__ == "__main__":
    asyncio.run(main())
