"""Benchmark: the dashboard's pages over a big history.

    python -m bench.dashboard [--runs 1000000] [--deletions 100000] [--repeat 21]

Data (one INSERT … SELECT generate_series each, on real PostgreSQL): ``--runs`` rows of
``nightcrew.runs`` over the last ~2 years — 96 % minute-lane runs one minute apart with a
minute-lane report, 1 % daily, 3 % news shards (a tenth of those skipped), 0.5 % failed with an
error — ``--deletions`` hard deletions (1 % with leftovers), 100k delivered effects plus a few
hundred dead ones, 50k news reports on 4 shards, 200 parked sources, 100 accounts on the
overage clock. Then ANALYZE, as autovacuum would.

Each page is requested ``--repeat`` times through the real app in-process (httpx's ASGI
transport: no socket, so the figure is the server's time: queries, template, response),
median and p95 printed; the deep pages are the ones a "older →" link chain reaches after 200
pages. Target (issue 15): every page < 100 ms server time at 1M runs and 100k deletions.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from datetime import UTC, datetime

import httpx

from bench._db import admin_url, drop, recreate
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.http import ServiceParts, create_app
from nightcrew.log import configure_logging
from nightcrew.metrics import Metrics
from nightcrew.web.access import Access
from nightcrew.web.context import DashboardContext

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
TARGET_MS = 100.0

SEED = [
    # runs: minute lane one per minute back from now, with the others interleaved
    """
    INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, finished_at, heartbeat_at,
                                status, report)
    SELECT lane, 'scheduled', at, at, at + interval '800 ms', at, status,
           CASE WHEN status = 'failed'
                THEN jsonb_build_object('error', 'DatabaseUnavailableError: lost PostgreSQL',
                                        'retry', true)
                WHEN lane = 'minute'
                THEN jsonb_build_object('lane', 'minute', 'items_requeued', g %% 3,
                        'links_requeued', g %% 2, 'previews_canceled', 0,
                        'media_jobs_flagged', 0, 'effects_retried', 0, 'errors', '[]'::jsonb,
                        'duration_ms', 42.5, 'jobs', jsonb_build_object(
                           'sweepStalledImports', jsonb_build_object('items_requeued', g %% 3),
                           'sweepStalledExternalLinks',
                           jsonb_build_object('links_requeued', g %% 2)))
                WHEN lane = 'daily'
                THEN jsonb_build_object('lane', 'daily', 'podcasts_deleted', 3,
                        'errors', '[]'::jsonb, 'duration_ms', 5300.0, 'jobs',
                        jsonb_build_object('runOverageEscalation', jsonb_build_object(
                            'restored', jsonb_build_array(jsonb_build_object(
                                'account_id', gen_random_uuid(), 'since', at,
                                'podcasts', jsonb_build_array('a-show'))))))
                ELSE jsonb_build_object('shard', lane, 'skipped', (g / 100) %% 10 = 0,
                        'queuedCount', g %% 20, 'processedCount', g %% 20)
           END
      FROM (SELECT g,
                   %(now)s - g * interval '1 minute' AS at,
                   CASE WHEN g %% 100 = 7 THEN 'daily'
                        WHEN g %% 100 IN (3, 33, 63) THEN 'news:' || (g %% 4)
                        ELSE 'minute' END AS lane,
                   CASE WHEN g %% 200 IN (11, 107) THEN 'failed' ELSE 'completed' END AS status
              FROM generate_series(1, %(runs)s) g) s
    """,
    """
    INSERT INTO nightcrew.podcast_deletions (podcast_id, slug, deleted_at, storage_cleaned_at,
        objects_deleted, bytes_deleted, objects_left, invalidated_at, attempts, last_error)
    SELECT gen_random_uuid(), 'show-' || g, %(now)s - g * interval '7 minutes',
           CASE WHEN g %% 100 = 5 THEN NULL ELSE %(now)s - g * interval '7 minutes' END,
           g %% 500, (g %% 500) * 1000000, CASE WHEN g %% 100 = 5 THEN 3 ELSE 0 END,
           %(now)s - g * interval '7 minutes', 1,
           CASE WHEN g %% 100 = 5 THEN 'S3: SlowDown' END
      FROM generate_series(1, %(deletions)s) g
    """,
    """
    INSERT INTO nightcrew.effects (kind, key, payload, created_at, next_attempt_at, expires_at,
        attempts, last_attempt_at, delivered_at, dead_at, dead_reason, last_error)
    SELECT 'mail', 'bench:' || g, '{}', %(now)s - g * interval '1 second',
           %(now)s - g * interval '1 second', %(now)s + interval '1 day', 1,
           %(now)s - g * interval '1 second',
           CASE WHEN g %% 500 IN (1, 2) THEN NULL ELSE %(now)s - g * interval '1 second' END,
           CASE WHEN g %% 500 = 1 THEN %(now)s - g * interval '1 second' END,
           CASE WHEN g %% 500 = 1 THEN 'permanent' END,
           CASE WHEN g %% 500 IN (1, 2) THEN 'Resend answered 422' END
      FROM generate_series(1, 100000) g
    """,
    """
    INSERT INTO news.sources (name, feed_url, shard, consecutive_failures, last_error,
                              parked_at)
    SELECT 'Feed ' || g, 'https://feeds.example/' || g || '.xml', 'news:' || (g %% 4),
           CASE WHEN g <= 200 THEN 5 ELSE 0 END,
           CASE WHEN g <= 200 THEN 'HTTP 410' END,
           CASE WHEN g <= 200 THEN %(now)s - g * interval '1 hour' END
      FROM generate_series(1, 5000) g
    """,
    """
    INSERT INTO news.worker_reports (shard, trigger, started_at, report)
    SELECT 'news:' || (g %% 4), 'scheduled', %(now)s - g * interval '1 minute',
           jsonb_build_object('queuedCount', g %% 30, 'deferredCount', g %% 7,
                              'processedCount', g %% 30, 'acceptedCount', g %% 25)
      FROM generate_series(1, 50000) g
    """,
    """
    INSERT INTO public.billing_accounts (plan, content_overage_since, content_overage_deadline,
                                         content_overage_nag_stage)
    SELECT 'free', %(now)s - (g %% 30) * interval '1 day',
           %(now)s + (30 - g %% 30) * interval '1 day', 0
      FROM generate_series(1, 100) g
    """,
]


async def timed(client: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, float, int]:
    samples, status = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        response = await client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        status = response.status_code
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return statistics.median(samples), p95, status


async def deep(client: httpx.AsyncClient, path: str, pages: int) -> str:
    """The URL that following "older →" ``pages`` times reaches."""
    url = path
    for _ in range(pages):
        html = (await client.get(url)).text
        found = re.search(r'href="([^"]*before=[^"]*)" rel="next"', html)
        if found is None:
            break
        url = found.group(1).replace("&amp;", "&")
    return url


async def main(runs: int, deletions: int, repeat: int) -> None:
    configure_logging("warning", [])
    with admin_url() as admin:
        url = recreate(admin, "nightcrew_bench_dashboard")
        try:
            db = await Database.open(url)
            try:
                await migrate(db)
                started = time.perf_counter()
                for statement in SEED:
                    await db.execute(statement, {"now": NOW, "runs": runs, "deletions": deletions})
                await db.execute("ANALYZE")
                print(
                    f"seeded {runs:,} runs, {deletions:,} deletions, 100,000 effects, "
                    f"50,000 news reports in {time.perf_counter() - started:.1f} s"
                )
                app = create_app(
                    Metrics(),
                    ServiceParts(
                        dashboard=DashboardContext(
                            db=db, clock=FrozenClock(NOW), access=Access.for_bind("127.0.0.1", None)
                        )
                    ),
                )
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://127.0.0.1:8787"
                ) as client:
                    a_run = await db.fetch_one(
                        "SELECT id FROM nightcrew.runs WHERE lane = 'daily' LIMIT 1"
                    )
                    deep_runs = await deep(client, "/runs", 200)
                    deep_minute = await deep(client, "/runs?lane=minute", 200)
                    deep_deletions = await deep(client, "/deletions", 200)
                    labels = {
                        deep_runs: "/runs (200 pages deep)",
                        deep_minute: "/runs?lane=minute (200 pages deep)",
                        deep_deletions: "/deletions (200 pages deep)",
                    }
                    pages = [
                        "/",
                        "/runs",
                        "/runs?lane=minute",
                        "/runs?lane=daily",
                        "/runs?status=failed",
                        "/runs?lane=news%3A1&status=skipped",
                        "/runs?status=skipped",
                        "/runs?lane=daily&status=failed",
                        "/runs?date=2025-06-01",
                        "/runs?lane=minute&status=completed&date=2025-01-10",
                        "/runs?status=completed&date=2024-01-01",  # before the history
                        deep_runs,
                        deep_minute,
                        f"/runs/{a_run['id'] if a_run else 1}",
                        "/deletions",
                        deep_deletions,
                        "/overage",
                        "/watchdogs",
                        "/effects",
                        "/news",
                    ]
                    print(f"\n{'page':<58} {'median':>9} {'p95':>9}  status")
                    worst = 0.0
                    for path in pages:
                        await client.get(path)  # warm: plans cached, pages in shared buffers
                        median, p95, status = await timed(client, path, repeat)
                        worst = max(worst, median)
                        label = labels.get(path, path)
                        print(f"{label:<58} {median:>7.1f}ms {p95:>7.1f}ms  {status}")
                verdict = "met" if worst < TARGET_MS else "MISSED"
                print(
                    f"\nslowest page median {worst:.1f} ms — target < {TARGET_MS:.0f} ms: "
                    f"{verdict} ({runs:,} runs, {deletions:,} deletions, {repeat} requests each)"
                )
            finally:
                await db.close()
        finally:
            drop(admin, "nightcrew_bench_dashboard")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--deletions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.deletions, args.repeat))
