"""Benchmark: the overage escalation's scan and sweep at platform scale, on the platform
functions as spec 000 names them (`public.effective_cap(account uuid, resource text)`, a
per-account PL/pgSQL function).

    python -m bench.overage [--accounts 100000] [--episodes-per-account 20] [--runs 3]
                            [--slices 2]
    python -m bench.overage --growth      # the scan at 30k/100k/300k accounts, then at
                                          # 10/20/40 episodes per account; fitted exponents

Data: N billing accounts on a plan of 5 podcasts and 10 GB; 3 podcasts each; 20 episodes per
account of ~100 MB of enclosure, every fourth with a ~150 MB master (masters do not count
toward the escalation's storage); 1% of the accounts store ~1 GB enclosures and so sit over
their storage cap. Times, on this machine and real PostgreSQL:

* the scan as the sweep runs it (`overage.scan`: its slices at once on pooled connections),
  and one slice alone on one connection (the whole scan, serially);
* a full sweep that arms and warns the 1% (mail and feed cache recorded, not sent);
* the next day's sweep, which finds them armed with nothing due.

Target (issue 22): the scan under 2 s at 100,000 accounts / 2M episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

from bench._db import admin_url, drop, recreate
from nightcrew.adapters.billing import NoBilling
from nightcrew.adapters.feedcache import RecordingFeedCache
from nightcrew.adapters.mail import RecordingMailer
from nightcrew.adapters.queues import PostgresQueueProducer
from nightcrew.adapters.storage import open_store
from nightcrew.assembly import open_runtime
from nightcrew.clock import FrozenClock
from nightcrew.config import Settings
from nightcrew.db.database import Database
from nightcrew.db.migrate import migrate
from nightcrew.lifecycle import overage
from nightcrew.log import configure_logging
from nightcrew.runtime import Runtime

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
    "INSERT INTO public.episodes (podcast_id, title, status, audio_file_size_bytes,"
    " original_audio_file_size_bytes)"
    " SELECT p.id, 'E', 'published',"
    "  CASE WHEN p.account_n %% 100 = 0 THEN 1000000000 ELSE 100000000 END,"
    "  CASE WHEN g %% 4 = 0 THEN 150000000 END"
    " FROM generate_series(0, %(episodes)s - 1) g"
    " JOIN pods p ON p.n = 1 + g %% (%(accounts)s * 3)",
    "ALTER TABLE public.episodes ENABLE TRIGGER trigger_enforce_storage_account_cap",
]

SIGNATURE = (
    "SELECT p.oid::regprocedure::text || ' -> ' || pg_get_function_result(p.oid) AS sig,"
    " l.lanname AS lang FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
    " WHERE p.oid = 'public.effective_cap'::regproc"
)


def _runtime(
    db: Database, url: str, clock: FrozenClock, mailer: RecordingMailer, slices: int
) -> AbstractAsyncContextManager[Runtime]:
    return open_runtime(
        Settings.model_validate({"DATABASE_URL": url, "NIGHTCREW_OVERAGE_SCAN_SLICES": slices}),
        clock,
        db=db,
        queues=PostgresQueueProducer(db, clock),
        store=open_store("memory://"),
        feedcache=RecordingFeedCache(),
        billing=NoBilling(),
        mail=mailer,
    )


async def _timed(work: Callable[[], Awaitable[list[Any]]], runs: int) -> tuple[list[float], int]:
    times: list[float] = []
    found = 0
    for _ in range(runs):
        started = time.perf_counter()
        rows = await work()
        times.append(time.perf_counter() - started)
        found = len(rows)
    return times, found


def _ms(times: list[float]) -> str:
    each = ", ".join(f"{t * 1000:.0f}" for t in times)
    return f"median {statistics.median(times) * 1000:.0f} ms ({each})"


async def measure(
    admin: str, *, accounts: int, per_account: int, runs: int, sweeps: bool, slices: int
) -> dict[str, float]:
    """Load one platform, time its scans (and sweeps); the medians in seconds."""
    name = "nightcrew_bench_overage"
    url = recreate(admin, name)
    params = {"now": NOW, "accounts": accounts, "episodes": accounts * per_account}
    try:
        db = await Database.open(url)
        try:
            await migrate(db)
            started = time.perf_counter()
            async with db.transaction() as tx:
                for statement in LOAD:
                    await tx.execute(statement, params)
            await db.execute("VACUUM ANALYZE")
            loaded = time.perf_counter() - started
            sig = await db.fetch_one(SIGNATURE)
            assert sig is not None
            print(
                f"\n== {accounts:,} accounts, {accounts * 3:,} podcasts, "
                f"{accounts * per_account:,} episodes (loaded in {loaded:.0f} s); "
                f"caps from {sig['sig']} [{sig['lang']}]",
                flush=True,
            )
            clock = FrozenClock(NOW)
            mailer = RecordingMailer()
            async with _runtime(db, url, clock, mailer, slices) as runtime:
                sliced, found = await _timed(lambda: overage.scan(runtime), runs)
                serial, _ = await _timed(lambda: overage.scan_slice(runtime, 1, 0), runs)
                print(
                    f"   scan, {slices} slices at once: {_ms(sliced)}, "
                    f"{found:,} accounts selected → target < 2 s: "
                    f"{'met' if statistics.median(sliced) < 2 else 'MISSED'}"
                )
                print(f"   scan, one connection:       {_ms(serial)}")
                if sweeps:
                    started = time.perf_counter()
                    first = await overage.run_overage_escalation(runtime, clock)
                    first_s = time.perf_counter() - started
                    clock.set(NOW + timedelta(days=1))
                    started = time.perf_counter()
                    second = await overage.run_overage_escalation(runtime, clock)
                    second_s = time.perf_counter() - started
                    print(
                        f"   first sweep (arm + warn): {first_s:.2f} s — armed {first.armed:,},"
                        f" emails {first.emails_sent:,}, errors {len(first.errors)}"
                    )
                    print(
                        f"   next day's sweep (nothing due): {second_s:.2f} s — scanned "
                        f"{second.scanned:,}, emails {second.emails_sent}"
                    )
                    async with db.session(settings=overage.SCAN_SETTINGS) as session:
                        plan = await session.fetch(
                            "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) " + overage.SQL["scan"],
                            {"slices": slices, "slice": 0},
                        )
                    print(f"\n   -- EXPLAIN ANALYZE scan, slice 0 of {slices}")
                    for row in plan:
                        print("   " + row["QUERY PLAN"])
            return {
                "sliced": statistics.median(sliced),
                "serial": statistics.median(serial),
            }
        finally:
            await db.close()
    finally:
        drop(admin, name)


def _exponent(sizes: list[int], times: list[float]) -> float:
    """Least-squares slope of log(time) on log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in times]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


async def growth(admin: str, runs: int, slices: int) -> None:
    by_accounts = [30_000, 100_000, 300_000]
    a = [
        await measure(admin, accounts=n, per_account=20, runs=runs, sweeps=False, slices=slices)
        for n in by_accounts
    ]
    by_episodes = [10, 20, 40]
    e = [
        await measure(
            admin, accounts=100_000, per_account=k, runs=runs, sweeps=False, slices=slices
        )
        for k in by_episodes
    ]
    print("\n== growth of the scan (medians; exponent = slope of log time on log size)")
    for label, sizes, results in (
        ("accounts (20 episodes each)", by_accounts, a),
        ("episodes per account (100k accounts)", by_episodes, e),
    ):
        for key in ("sliced", "serial"):
            times = [r[key] for r in results]
            cells = ", ".join(f"{s:,}: {t:.2f} s" for s, t in zip(sizes, times, strict=True))
            print(f"   {label}, {key}: {cells} → exponent {_exponent(sizes, times):.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--episodes-per-account", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--slices", type=int, default=2, help="NIGHTCREW_OVERAGE_SCAN_SLICES for the sliced scan"
    )
    parser.add_argument("--growth", action="store_true", help="the scan at three sizes, twice")
    args = parser.parse_args()
    configure_logging("error")
    with admin_url() as admin:
        if args.growth:
            await growth(admin, args.runs, args.slices)
        else:
            await measure(
                admin,
                accounts=args.accounts,
                per_account=args.episodes_per_account,
                runs=args.runs,
                slices=args.slices,
                sweeps=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
