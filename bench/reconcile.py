"""Benchmark: the storage reconciler over 1,000,000 episodes and 1,000,000 local objects.

    python -m bench.reconcile [--n 1000000] [--keep-files DIR] [--apply]

Data: N/1000 podcasts; N episodes; one object per episode except the 1% whose object is
missing; 1% of the recorded sizes wrong; plus N/100 orphan objects (1%) that no episode
references — N objects in all, as sparse files in a local store (real sizes, no disk blocks),
two days old. Then it times, on this machine:

* ``rclone lsf -R --format pst`` over the same folder (the listing a dedicated tool manages);
* the reconciler's dry run (the real ``run_reconcile``), with its store requests (list pages,
  HEADs) and peak RSS (VmHWM, reset just before through /proc/self/clear_refs);
* with ``--apply``, an apply run (sizes written, orphans deleted, outbox drained).

Targets (issue 4): dry run within 2x of the rclone listing; peak RSS <= 256 MB; requests about
N/1000 + candidates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._db import admin_url, drop, proc_kib, recreate, reset_peak_rss
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock, SystemClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle.reconcile.core import ReconcileOptions
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.log import configure_logging
from nightcrew.runtime import open_runtime

BASE = "https://media.bench"


def size_of(i: int) -> int:
    return 1_000_000 + (i % 1000) * 1000  # 1-2 MB, like short audio


def make_files(root: Path, podcasts: list[str], n: int) -> int:
    """Sparse files: the listing sees real sizes, the disk stores no blocks."""
    old = time.time() - 2 * 86400
    written = 0
    for i in range(n):
        if i % 100 == 0:
            continue  # this episode's object is missing
        d = root / "podcasts" / podcasts[i // 1000] / "e" / f"ep{i}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "a.mp3"
        with path.open("wb") as fh:
            fh.truncate(size_of(i))
        os.utime(path, (old, old))
        written += 1
    for j in range(n // 100):  # orphans: nobody references them
        d = root / "podcasts" / podcasts[j % len(podcasts)] / "e" / f"orphan{j}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "a.mp3"
        with path.open("wb") as fh:
            fh.truncate(size_of(j))
        os.utime(path, (old, old))
        written += 1
    return written


async def load_db(db: Database, n: int) -> list[str]:
    await migrate(db)
    rows = await db.fetch(
        "INSERT INTO public.podcasts (slug, title) SELECT 'bench-' || g, 'Bench ' || g"
        " FROM generate_series(0, %(p)s - 1) g RETURNING id",
        {"p": max(1, n // 1000)},
    )
    podcasts = [str(r["id"]) for r in rows]
    async with db.transaction() as tx:
        await tx.execute("CREATE TEMP TABLE pods (n int, id uuid) ON COMMIT DROP")
        await tx.execute(
            "INSERT INTO pods SELECT ord - 1, id::uuid FROM unnest(%(ids)s::text[])"
            " WITH ORDINALITY AS t(id, ord)",
            {"ids": podcasts},
        )
        await tx.execute(
            "INSERT INTO public.episodes (podcast_id, title, status, published_at, audio_url,"
            " audio_file_size_bytes)"
            " SELECT p.id, 'E' || g, 'published', %(now)s,"
            "  %(base)s || '/podcasts/' || p.id::text || '/e/ep' || g || '/a.mp3',"
            "  1000000 + (g %% 1000) * 1000 + CASE WHEN g %% 100 = 1 THEN 7 ELSE 0 END"
            " FROM generate_series(0, %(n)s - 1) g JOIN pods p ON p.n = g / 1000",
            {"n": n, "base": BASE, "now": datetime.now(UTC)},
        )
    await db.execute("VACUUM ANALYZE public.episodes")
    return podcasts


def time_rclone(root: Path) -> float:
    rclone = shutil.which("rclone") or str(Path(os.sys.executable).parent / "rclone")
    started = time.perf_counter()
    subprocess.run(
        [rclone, "lsf", "-R", "--format", "pst", str(root)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


async def reconcile_once(url: str, root: Path, options: ReconcileOptions) -> dict[str, Any]:
    db = await Database.open(url)
    try:
        clock = FrozenClock(SystemClock().now())
        store = open_store(f"file://{root}")
        async with open_runtime(
            Settings.model_validate({"DATABASE_URL": url, "R2_PUBLIC_URL": BASE}),
            clock,
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=store,
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
        ) as runtime:
            reset_peak_rss()
            started = time.perf_counter()
            report = await run_reconcile(runtime, clock, options)
            wall = time.perf_counter() - started
            peak = proc_kib("VmHWM") / 1024
    finally:
        await db.close()
    return {"wall_s": wall, "peak_rss_mib": peak, "stats": store.stats, "report": report}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--apply", action="store_true", help="also time an apply run")
    args = parser.parse_args()
    configure_logging("warning")
    n = args.n

    root = Path(tempfile.mkdtemp(prefix="nightcrew-bench-reconcile-"))
    with admin_url() as admin:
        name = "nightcrew_bench_reconcile"
        url = recreate(admin, name)
        try:
            db = await Database.open(url)
            try:
                started = time.perf_counter()
                podcasts = await load_db(db, n)
                print(f"loaded {n:,} episodes in {time.perf_counter() - started:.0f} s", flush=True)
            finally:
                await db.close()
            started = time.perf_counter()
            objects = make_files(root, podcasts, n)
            print(f"wrote {objects:,} objects in {time.perf_counter() - started:.0f} s", flush=True)

            rclone = [time_rclone(root) for _ in range(args.runs)]
            dry = [await reconcile_once(url, root, ReconcileOptions()) for _ in range(args.runs)]
            last = dry[-1]
            r, stats = last["report"], last["stats"]
            print(f"\n== {n:,} episodes, {objects:,} objects (local store, sparse files)")
            print(
                f"   rclone lsf -R --format pst: median {statistics.median(rclone):.2f} s "
                f"({', '.join(f'{t:.2f}' for t in rclone)})"
            )
            walls = [d["wall_s"] for d in dry]
            print(
                f"   reconcile dry run:          median {statistics.median(walls):.2f} s "
                f"({', '.join(f'{t:.2f}' for t in walls)})"
            )
            ratio = statistics.median(walls) / statistics.median(rclone)
            print(
                f"   ratio to rclone: {ratio:.2f} (target <= 2: "
                f"{'met' if ratio <= 2 else 'MISSED'})"
            )
            peak = max(d["peak_rss_mib"] for d in dry)
            print(
                f"   peak RSS: {peak:.0f} MiB (target <= 256: {'met' if peak <= 256 else 'MISSED'})"
            )
            # what the data holds, not what the run did: one list page per 1,000 objects, one
            # HEAD per episode whose object was seeded missing
            seeded_missing = len(range(0, n, 100))
            expected = -(-objects // 1000) + seeded_missing
            verdict = "met" if stats.requests <= expected * 1.01 else "MISSED"
            print(
                f"   store requests: {stats.list_pages:,} list pages + {stats.heads:,} HEADs "
                f"= {stats.requests:,}; expected from the data: {-(-objects // 1000):,} pages "
                f"(objects/1000) + {seeded_missing:,} seeded missing = {expected:,} "
                f"(target: within 1%: {verdict})"
            )
            print(
                f"   found: {r.size_backfill['mismatched']:,} wrong sizes, "
                f"{r.missing['count']:,} missing, {r.orphans.found:,} orphans "
                f"({r.orphans.eligible:,} eligible)"
            )
            if args.apply:
                applied = await reconcile_once(url, root, ReconcileOptions(mode="apply"))
                a, st = applied["report"], applied["stats"]
                print(
                    f"   apply run: {applied['wall_s']:.2f} s, peak RSS "
                    f"{applied['peak_rss_mib']:.0f} MiB; {a.size_backfill['written']:,} sizes "
                    f"written, {a.orphans.deleted:,} orphans deleted in "
                    f"{st.delete_requests} delete requests"
                )
        finally:
            drop(admin, name)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
