"""The reconciler's joins at scale, explained: EXPLAIN (ANALYZE, BUFFERS) of each at N rows.

    python -m bench.reconcile_plans [--n 1000000]
        [--config "work_mem=4MB" --config "temp_buffers=512MB;enable_nestloop=off" ...]

Loads N episodes as ``bench.reconcile`` does, fills the listing's temp table straight from
SQL (the same keys, sizes and kinds a store listing would give: 1% missing, 1% wrong sizes,
N/100 orphans, N/100 transcription-prep chunks, half of them expired) and derives the
episodes' keys (reconcile_refs) as a run does while it lists, then runs each of
the reconciler's comparison queries under EXPLAIN ANALYZE under each ``--config`` (settings
applied first thing in a fresh session, as temp_buffers must be), printing the timing and the
plan's top lines.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench._db import admin_url, drop, recreate
from bench.reconcile import BASE, load_db
from nightcrew.db.database import Database
from nightcrew.lifecycle.reconcile.core import PREP_TTL_DAYS, public_prefix
from nightcrew.lifecycle.reconcile.queries import SQL

FILL = """
INSERT INTO reconcile_objects (key, kind, size, last_modified)
SELECT substr(e.audio_url, length(%(prefix)s) + 1), 'audio',
       1000000 + (t.g %% 1000) * 1000, %(old)s
  FROM public.episodes e CROSS JOIN LATERAL (SELECT substr(e.title, 2)::int AS g) t
 WHERE t.g %% 100 <> 0
UNION ALL
SELECT 'podcasts/' || p.id || '/e/orphan' || j || '/a.mp3', 'audio', 1000000, %(old)s
  FROM generate_series(0, %(n)s / 100 - 1) j
  JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS r, count(*) OVER () AS c
          FROM public.podcasts) p ON p.r = j %% p.c
UNION ALL
-- N/100 transcription-prep chunks, every other one past its TTL
SELECT 'podcasts/' || p.id || '/e/ep' || j || '/transcribe-prep/c.wav', 'prep', 1000,
       %(old)s - make_interval(days => 10 * (j %% 2))
  FROM generate_series(0, %(n)s / 100 - 1) j
  JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS r, count(*) OVER () AS c
          FROM public.podcasts) p ON p.r = j %% p.c
"""

QUERIES: dict[str, tuple[str, dict[str, Any]]] = {
    "size backfill (size_candidates)": ("size_candidates", {}),
    "missing (missing_candidates)": ("missing_candidates", {}),
    "orphan audio (unreferenced_audio)": ("unreferenced_audio", {}),
    "episode images (unreferenced_episode_images)": ("unreferenced_episode_images", {}),
    "expired prep (expired_prep)": ("expired_prep", {"ttl_days": PREP_TTL_DAYS}),
}


async def main(n: int, configs: list[str]) -> None:
    with admin_url() as admin:
        url = recreate(admin, "nightcrew_bench_plans")
        try:
            db = await Database.open(url)
            try:
                await load_db(db, n)
            finally:
                await db.close()
            prefix = public_prefix(BASE)
            for config in configs:
                fresh = await Database.open(url)  # temp_buffers: before any temp table
                try:
                    await explain(fresh, n, prefix, config)
                finally:
                    await fresh.close()
        finally:
            drop(admin, "nightcrew_bench_plans")


async def explain(db: Database, n: int, prefix: str, config: str) -> None:
    settings = [c.split("=", 1) for c in config.split(";") if c.strip()]
    async with db.session(statement_timeout=0) as conn:
        for name, value in settings:
            await conn.execute(f"SET {name.strip()} = '{value.strip()}'")
        await conn.execute(SQL["drop_listing"])
        await conn.execute(SQL["drop_refs"])
        await conn.execute(SQL["create_listing"])
        try:
            started = time.perf_counter()
            old = datetime.now(UTC) - timedelta(days=2)
            await conn.execute(FILL, {"n": n, "prefix": prefix, "old": old})
            await conn.execute(SQL["index_listing"])
            await conn.execute(SQL["analyze_listing"])
            filled = time.perf_counter() - started
            started = time.perf_counter()
            # the episodes' keys, as a run derives them while its listing streams in
            await conn.execute(SQL["create_refs"], {"prefix": prefix})
            await conn.execute(SQL["index_refs"])
            await conn.execute(SQL["analyze_refs"])
            print(
                f"\n== {config or 'defaults'}: listing table filled in {filled:.1f} s;"
                f" episode keys derived in {time.perf_counter() - started:.1f} s"
            )
            for label, (name, extra) in QUERIES.items():
                plan = await conn.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS) " + SQL[name],
                    {"prefix": prefix, "now": datetime.now(UTC), **extra},
                )
                lines = [next(iter(r.values())) for r in plan]
                total = [ln for ln in lines if ln.startswith("Execution Time")]
                print(f"-- {label}: {total[0] if total else '?'}")
                for line in lines[:12]:
                    print("   " + line)
        finally:
            await conn.execute(SQL["drop_refs"])
            await conn.execute(SQL["drop_listing"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--config", action="append", default=[])
    args = parser.parse_args()
    asyncio.run(main(args.n, args.config or [""]))
