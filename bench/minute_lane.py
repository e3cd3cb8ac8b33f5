"""Benchmark: one idle minute-lane tick at 1k and at 1M rows.

    python -m bench.minute_lane [--sizes 1000,1000000] [--ticks 15] [--keep]

Data per size N (N = import_items): N/10 podcast_imports (97% completed, 1% failed, 1% canceled,
0.5% running, 0.5% fresh hosting-migration previews), N import_items (95% completed, 2% failed,
3% pending — all fresh, so the tick finds nothing to do), N episodes (1% with an external link,
0.1% of those pending and not yet due), N/10 media_jobs (99% completed, the rest fresh). The
tick is the real one (`run_lane`, run history included) against real PostgreSQL; each sweep's
time comes from the lane report. Prints medians and each claim query's EXPLAIN ANALYZE plan.
Target (issue 2): an idle tick under 50 ms at 1M rows, and 1M/1k under 2.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from bench._db import admin_url, drop, recreate
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle import watchdogs as wd
from nightcrew.lifecycle.lanes import run_lane
from nightcrew.log import configure_logging

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)

POPULATE = [
    # podcasts: enough that every fresh preview can sit on its own podcast (unique index).
    """INSERT INTO public.podcasts (slug, title, hosting_type, created_at, updated_at)
       SELECT 'show-' || g, 'Show ' || g,
              CASE WHEN g % 10 = 0 THEN 'external' ELSE 'podcasterplus' END, %(now)s, %(now)s
         FROM generate_series(1, %(podcasts)s) g""",
    """CREATE TEMP TABLE pods AS
       SELECT id, row_number() OVER (ORDER BY id) AS n FROM public.podcasts""",
    """INSERT INTO public.podcast_imports (podcast_id, status, is_hosting_migration, started_at,
                                          dispatch_end_at, created_at, updated_at)
       SELECT p.id,
              CASE WHEN g % 200 = 0 THEN 'running' WHEN g % 200 = 1 THEN 'preview'
                   WHEN g % 100 = 2 THEN 'failed' WHEN g % 100 = 3 THEN 'canceled'
                   ELSE 'completed' END,
              g % 200 = 1,
              CASE WHEN g % 200 = 1 THEN NULL ELSE %(now)s - interval '1 hour' END,
              %(now)s + interval '5 minutes',
              CASE WHEN g % 200 = 1 THEN %(now)s - interval '1 minute'
                   ELSE %(now)s - interval '2 hours' END,
              %(now)s - interval '1 hour'
         FROM generate_series(1, %(imports)s) g
         -- a preview's podcast is (g-1)/200: distinct per preview, as the unique index wants
         JOIN pods p ON p.n = 1 + CASE WHEN g % 200 = 1 THEN (g - 1) / 200
                                       ELSE (g - 1) %% %(podcasts)s END""",
    """CREATE TEMP TABLE imps AS
       SELECT id, row_number() OVER (ORDER BY id) AS n FROM public.podcast_imports""",
    """INSERT INTO public.import_items (import_id, status, attempts, created_at, updated_at)
       SELECT i.id,
              CASE WHEN g % 100 < 95 THEN 'completed' WHEN g % 100 < 97 THEN 'failed'
                   ELSE 'pending' END,
              CASE WHEN g % 100 < 97 THEN 1 ELSE 0 END,
              %(now)s - interval '1 hour',
              CASE WHEN g % 100 < 97 THEN %(now)s - interval '1 hour'
                   ELSE %(now)s - interval '5 seconds' END
         FROM generate_series(1, %(items)s) g
         JOIN imps i ON i.n = 1 + (g - 1) %% %(imports)s""",
    """INSERT INTO public.episodes (podcast_id, title, status, published_at, external_link_status,
                                   external_link_next_attempt_at, created_at, updated_at)
       SELECT p.id, 'Episode ' || g, 'published', %(now)s - interval '1 day',
              CASE WHEN g % 1000 = 0 THEN 'pending' WHEN g % 100 = 0 THEN 'linked' END,
              CASE WHEN g % 100 = 0 THEN %(now)s + interval '1 minute' END,
              %(now)s - interval '1 day', %(now)s - interval '1 day'
         FROM generate_series(1, %(episodes)s) g
         JOIN pods p ON p.n = 1 + (g - 1) %% %(podcasts)s""",
    """INSERT INTO public.media_jobs (episode_id, type, status, created_at, updated_at)
       SELECT e.id, 'normalize', CASE WHEN row_number() OVER () %% 100 = 0 THEN 'running'
                                      ELSE 'completed' END,
              %(now)s - interval '10 minutes', %(now)s - interval '10 minutes'
         FROM (SELECT id FROM public.episodes LIMIT %(media)s) e""",
]

EXPLAINED = {
    "sweepStalledImports (rescue)": (
        "rescue_stalled_processing_items",
        {"processing_threshold_seconds": 600, "limit": 500},
    ),
    "sweepStalledImports (pending)": (
        "claim_stalled_pending_items",
        {
            "cooldown_seconds": 60,
            "dispatch_grace_seconds": 30,
            "legacy_seconds": 1500,
            "attempt_thresholds": [67, 85, 160, 410],
            "cap_seconds": 600,
            "limit": 500,
        },
    ),
    "sweepStalledExternalLinks": (
        "claim_stalled_external_links",
        {"grace_seconds": 90, "cooldown_seconds": 90, "limit": 500},
    ),
    "sweepStuckHostingMigrationPreviews": (
        "cancel_stuck_hosting_migration_previews",
        {"threshold_seconds": 900, "limit": 50},
    ),
    "sweepWedgedMediaJobs": (
        "fail_wedged_media_jobs",
        {"threshold_seconds": 10800, "limit": 500, "error": "bench"},
    ),
}


def _sql(n: int) -> dict[str, Any]:
    # `%` inside the literal SQL above is doubled only where psycopg sees a parameter.
    return {
        "now": NOW,
        "items": n,
        "imports": max(10, n // 10),
        "episodes": n,
        "podcasts": max(10, n // 100),
        "media": max(10, n // 10),
    }


async def populate(db: Database, n: int) -> float:
    started = time.perf_counter()
    params = _sql(n)
    async with db.transaction() as tx:
        for statement in POPULATE:
            await tx.execute(statement.replace("g % ", "g %% "), params)
    await db.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


async def explain(db: Database) -> dict[str, str]:
    plans: dict[str, str] = {}
    for label, (query, params) in EXPLAINED.items():
        async with db.session() as conn:
            await conn.execute("BEGIN")
            rows = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON) " + wd.SQL[query],
                {"now": NOW, **params},
            )
            await conn.execute("ROLLBACK")
        plans[label] = "\n".join(r["QUERY PLAN"] for r in rows)
    return plans


async def measure(url: str, n: int, ticks: int) -> dict[str, Any]:
    db = await Database.open(url)
    try:
        await migrate(db)
        load_s = await populate(db, n)
        clock = FrozenClock(NOW)
        async with open_runtime(
            Settings.model_validate({"DATABASE_URL": url}),
            clock,
            db=db,
            queues=PostgresQueueProducer(db, clock),
            store=open_store("memory://"),
            feedcache=RecordingFeedCache(),
            billing=NoBilling(),
        ) as runtime:
            for _ in range(3):  # warm the pool, the plan cache and shared buffers
                await run_lane(runtime, clock, "minute")
            totals: list[float] = []
            per_sweep: dict[str, list[float]] = {}
            for _ in range(ticks):
                started = time.perf_counter()
                report = await run_lane(runtime, clock, "minute")
                totals.append((time.perf_counter() - started) * 1000)
                assert report is not None and not report.errors, report
                assert report.total("items_requeued") == 0, "the benchmark tick must be idle"
                for sweep in report.jobs:
                    per_sweep.setdefault(sweep.name, []).append(sweep.duration_ms)
            plans = await explain(db)
            counts = await db.fetch_one(
                "SELECT (SELECT count(*) FROM public.import_items) AS import_items,"
                " (SELECT count(*) FROM public.episodes) AS episodes,"
                " (SELECT count(*) FROM public.podcast_imports) AS podcast_imports,"
                " (SELECT count(*) FROM public.media_jobs) AS media_jobs"
            )
    finally:
        await db.close()
    return {
        "n": n,
        "load_seconds": round(load_s, 1),
        "counts": counts,
        "tick_ms": statistics.median(totals),
        "sweeps_ms": {k: statistics.median(v) for k, v in per_sweep.items()},
        "plans": plans,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,1000000")
    parser.add_argument("--ticks", type=int, default=15)
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    args = parser.parse_args()
    configure_logging("warning")  # the ticks' events would drown the figures
    sizes = [int(s) for s in args.sizes.split(",")]

    results = []
    with admin_url() as admin:
        for n in sizes:
            name = f"nightcrew_bench_minute_{n}"
            url = recreate(admin, name)
            print(f"\n== {n:,} import_items: loading…", flush=True)
            try:
                result = await measure(url, n, args.ticks)
            finally:
                if not args.keep:
                    drop(admin, name)
            results.append(result)
            print(f"   rows: {result['counts']}  (loaded in {result['load_seconds']} s)")
            print(f"   idle tick (run_lane, median of {args.ticks}): {result['tick_ms']:.2f} ms")
            for sweep, ms in result["sweeps_ms"].items():
                print(f"     {sweep:<36} {ms:7.2f} ms")
            for label, plan in result["plans"].items():
                print(
                    f"\n   -- EXPLAIN ANALYZE {label}\n"
                    + "\n".join("   " + line for line in plan.splitlines())
                )

    if len(results) >= 2:
        small, large = results[0], results[-1]
        ratio = large["tick_ms"] / small["tick_ms"]
        print("\n== summary")
        print(
            f"   idle tick: {small['tick_ms']:.2f} ms at {small['n']:,} → "
            f"{large['tick_ms']:.2f} ms at {large['n']:,} (ratio {ratio:.2f})"
        )
        print(
            f"   target: < 50 ms at 1M → {'met' if large['tick_ms'] < 50 else 'MISSED'}; "
            f"ratio < 2 → {'met' if ratio < 2 else 'MISSED'}"
        )


if __name__ == "__main__":
    asyncio.run(main())
