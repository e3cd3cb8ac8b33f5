"""Benchmark: the overage escalation's scan and sweep at platform scale.

    python -m bench.overage [--accounts 100000] [--runs 3]

Data: 100,000 billing accounts on a plan of 5 podcasts and 10 GB; 300,000 podcasts (3 each);
2,000,000 episodes of ~100 MB; 1% of the accounts store ~1 GB episodes and so sit over their
storage cap. Times, on this machine and real PostgreSQL:

* the scan — the one query that selects the accounts needing work (one round trip);
* a full sweep that arms and warns the 1% (mail and feed cache recorded, not sent);
* the next day's sweep, which finds them armed with nothing due.

Target (issue 5): the scan is one round trip and under 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from bench._db import admin_url, drop, recreate
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle import overage
from nightcrew.log import configure_logging
from nightcrew.runtime import open_runtime

NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)

LOAD = [
    "ALTER TABLE public.episodes DISABLE TRIGGER trigger_enforce_storage_account_cap",
    "INSERT INTO public.plan_limits VALUES ('basic', 'podcasts_per_account', 5),"
    " ('basic', 'storage_gb_per_account', 10)",
    "INSERT INTO public.billing_accounts (plan, created_at)"
    " SELECT 'basic', %(now)s FROM generate_series(1, %(accounts)s)",
    "CREATE TEMP TABLE accts AS SELECT id, row_number() OVER (ORDER BY id) AS n"
    " FROM public.billing_accounts",
    "CREATE TEMP TABLE owners AS SELECT a.id AS account_id, gen_random_uuid() AS user_id, a.n"
    " FROM accts a",
    "INSERT INTO auth.users (id, email) SELECT user_id, 'owner' || n || '@bench.test' FROM owners",
    "INSERT INTO public.user_profiles (id, email, billing_account_id)"
    " SELECT user_id, 'owner' || n || '@bench.test', account_id FROM owners",
    "UPDATE public.billing_accounts b SET owner_user_id = o.user_id FROM owners o"
    " WHERE o.account_id = b.id",
    "INSERT INTO public.podcasts (billing_account_id, slug, title, created_at)"
    " SELECT a.id, 'p-' || a.n || '-' || k, 'Podcast', %(now)s"
    " FROM accts a CROSS JOIN generate_series(1, 3) k",
    "CREATE TEMP TABLE pods AS SELECT p.id, row_number() OVER (ORDER BY p.id) AS n,"
    " a.n AS account_n FROM public.podcasts p JOIN accts a ON a.id = p.billing_account_id",
    "INSERT INTO public.episodes (podcast_id, title, status, audio_file_size_bytes)"
    " SELECT p.id, 'E', 'published',"
    "  CASE WHEN p.account_n %% 100 = 0 THEN 1000000000 ELSE 100000000 END"
    " FROM generate_series(0, %(episodes)s - 1) g"
    " JOIN pods p ON p.n = 1 + g %% (%(accounts)s * 3)",
    "ALTER TABLE public.episodes ENABLE TRIGGER trigger_enforce_storage_account_cap",
]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    configure_logging("error")
    params = {"now": NOW, "accounts": args.accounts, "episodes": args.accounts * 20}

    with admin_url() as admin:
        name = "nightcrew_bench_overage"
        url = recreate(admin, name)
        try:
            db = await Database.open(url)
            try:
                await migrate(db)
                started = time.perf_counter()
                async with db.transaction() as tx:
                    for statement in LOAD:
                        await tx.execute(statement, params)
                await db.execute("VACUUM ANALYZE")
                counts = await db.fetch_one(
                    "SELECT (SELECT count(*) FROM public.billing_accounts) AS accounts,"
                    " (SELECT count(*) FROM public.podcasts) AS podcasts,"
                    " (SELECT count(*) FROM public.episodes) AS episodes"
                )
                print(f"loaded {counts} in {time.perf_counter() - started:.0f} s", flush=True)

                scans: list[float] = []
                found = 0
                for _ in range(args.runs):
                    started = time.perf_counter()
                    rows = await db.fetch(overage.SQL["scan"])
                    scans.append(time.perf_counter() - started)
                    found = len(rows)
                plan = await db.fetch(
                    "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) " + overage.SQL["scan"],
                    {"now": NOW, "account_id": None},
                )

                clock = FrozenClock(NOW)
                mailer = RecordingMailer()
                async with open_runtime(
                    Settings.model_validate({"DATABASE_URL": url}),
                    clock,
                    db=db,
                    queues=PostgresQueueProducer(db, clock),
                    store=open_store("memory://"),
                    feedcache=RecordingFeedCache(),
                    billing=NoBilling(),
                    mail=mailer,
                ) as runtime:
                    started = time.perf_counter()
                    first = await overage.run_overage_escalation(runtime, clock)
                    first_s = time.perf_counter() - started
                    clock.set(NOW + timedelta(days=1))
                    started = time.perf_counter()
                    second = await overage.run_overage_escalation(runtime, clock)
                    second_s = time.perf_counter() - started
            finally:
                await db.close()
        finally:
            drop(admin, name)

    median = statistics.median(scans)
    print(f"\n== {args.accounts:,} accounts, 1% over their storage cap")
    print(
        f"   scan (one query, one round trip): median {median * 1000:.0f} ms "
        f"({', '.join(f'{s * 1000:.0f}' for s in scans)}), {found:,} accounts selected "
        f"→ target < 2 s: {'met' if median < 2 else 'MISSED'}"
    )
    print(
        f"   first sweep (arm + warn): {first_s:.2f} s — armed {first.armed:,}, "
        f"emails {first.emails_sent:,}, errors {len(first.errors)}"
    )
    print(
        f"   next day's sweep (nothing due): {second_s:.2f} s — scanned {second.scanned:,}, "
        f"emails {second.emails_sent}"
    )
    print("\n   -- EXPLAIN ANALYZE scan")
    for row in plan:
        print("   " + row["QUERY PLAN"])


if __name__ == "__main__":
    asyncio.run(main())
