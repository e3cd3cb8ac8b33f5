"""Benchmark: the size backfill's write statement, four ways (issue 26).

    python -m bench.reconcile_writes [--episodes 200000] [--writes 10000] [--runs 3]

The reconciler's apply run writes every wrong size it finds (10,000 at 1M episodes in
bench.reconcile). This times writing ``--writes`` sizes, scattered over ``--episodes`` episodes
of the reference schema (its storage cap trigger and every other trigger firing), each row
guarded as the reconciler guards it (same audio_url, same recorded size):

* ``per-row``: one transaction per row, as the apply path wrote them before;
* ``unnest``: one ``UPDATE … FROM unnest(arrays)`` per batch, in its own transaction (what
  queries.sql's write_sizes does), at several batch sizes;
* ``values``: one ``UPDATE … FROM (VALUES (…), …)`` per batch, its text built per batch size;
* ``copy``: per batch, COPY into a temp table (ON COMMIT DROP), then one UPDATE from it.

Each method writes new sizes (the previous run's + 1), so every run changes every row. Medians
of ``--runs``, each listed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bench._db import admin_url, drop, recreate
from nightcrew.db.database import Database, Tx
from nightcrew.db.migrate import migrate

BASE = "https://media.bench"
GUARD = (
    " WHERE e.id = v.id AND e.audio_url = v.audio_url"
    " AND e.audio_file_size_bytes IS NOT DISTINCT FROM v.recorded"
)
SET = "UPDATE public.episodes e SET audio_file_size_bytes = v.actual, updated_at = %(now)s"
UNNEST = (
    SET + " FROM unnest(%(ids)s::uuid[], %(urls)s::text[], %(recorded)s::bigint[],"
    " %(actual)s::bigint[]) AS v (id, audio_url, recorded, actual)" + GUARD
)

Row = tuple[Any, str, int, int]  # id, audio_url, recorded, actual
Writer = Callable[[Database, list[Row], datetime], Awaitable[int]]


async def load(db: Database, episodes: int) -> None:
    await migrate(db)
    await db.execute(
        "INSERT INTO public.podcasts (slug, title) SELECT 'bench-' || g, 'Bench ' || g"
        " FROM generate_series(0, %(p)s - 1) g",
        {"p": max(1, episodes // 1000)},
    )
    await db.execute(
        "INSERT INTO public.episodes (podcast_id, title, status, audio_url, audio_file_size_bytes)"
        " SELECT p.id, 'E' || g, 'published', %(base)s || '/podcasts/' || p.id || '/e' || g,"
        "        1000000 + g"
        "   FROM generate_series(0, %(n)s - 1) g"
        "   JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM public.podcasts) p"
        "     ON p.n = g / 1000",
        {"n": episodes, "base": BASE},
    )
    await db.execute("VACUUM ANALYZE public.episodes")


async def targets(db: Database, writes: int) -> list[Row]:
    rows = await db.fetch(
        "SELECT id, audio_url, audio_file_size_bytes AS recorded FROM public.episodes"
        " ORDER BY random() LIMIT %(w)s",
        {"w": writes},
    )
    return sorted((r["id"], r["audio_url"], r["recorded"], r["recorded"] + 1) for r in rows)


async def per_row(db: Database, rows: list[Row], now: datetime) -> int:
    written = 0
    for id_, url, recorded, actual in rows:
        async with db.transaction() as tx:
            written += await tx.execute(
                "UPDATE public.episodes SET audio_file_size_bytes = %(actual)s,"
                " updated_at = %(now)s WHERE id = %(id)s AND audio_url = %(url)s"
                " AND audio_file_size_bytes IS NOT DISTINCT FROM %(recorded)s",
                {"id": id_, "url": url, "recorded": recorded, "actual": actual, "now": now},
            )
    return written


def batched(size: int, one: Callable[[Tx, list[Row], datetime], Awaitable[int]]) -> Writer:
    async def write(db: Database, rows: list[Row], now: datetime) -> int:
        written = 0
        for start in range(0, len(rows), size):
            async with db.transaction() as tx:
                written += await one(tx, rows[start : start + size], now)
        return written

    return write


async def unnest(tx: Tx, rows: list[Row], now: datetime) -> int:
    ids, urls, recorded, actual = (list(c) for c in zip(*rows, strict=True))
    return await tx.execute(
        UNNEST, {"ids": ids, "urls": urls, "recorded": recorded, "actual": actual, "now": now}
    )


async def values(tx: Tx, rows: list[Row], now: datetime) -> int:
    params: dict[str, Any] = {"now": now}
    tuples = []
    for i, (id_, url, recorded, actual) in enumerate(rows):
        tuples.append(f"(%(i{i})s::uuid, %(u{i})s::text, %(r{i})s::bigint, %(a{i})s::bigint)")
        params |= {f"i{i}": id_, f"u{i}": url, f"r{i}": recorded, f"a{i}": actual}
    query = SET + " FROM (VALUES " + ", ".join(tuples) + ") AS v (id, audio_url, recorded, actual)"
    return await tx.execute(query + GUARD, params)


async def copy(tx: Tx, rows: list[Row], now: datetime) -> int:
    await tx.execute(
        "CREATE TEMP TABLE size_writes (id uuid, audio_url text, recorded bigint, actual bigint)"
        " ON COMMIT DROP"
    )

    async def one_batch() -> Any:
        yield rows

    await tx.copy_in_batches(
        "COPY size_writes (id, audio_url, recorded, actual) FROM STDIN", one_batch()
    )
    return await tx.execute(SET + " FROM size_writes v" + GUARD, {"now": now})


async def bench(url: str, writes: int, runs: int) -> None:
    db = await Database.open(url)
    methods: list[tuple[str, Writer]] = [
        ("per-row (one transaction each)", per_row),
        *((f"unnest, batches of {b}", batched(b, unnest)) for b in (100, 500, 1000)),
        ("values, batches of 500", batched(500, values)),
        ("copy + temp table, batches of 500", batched(500, copy)),
    ]
    try:
        rows = await targets(db, writes)
        print(f"\n== {len(rows):,} size writes (medians of {runs})")
        bump = 0
        for name, write in methods:
            times = []
            for _ in range(runs):
                batch = [(i, u, r + bump, a + bump) for i, u, r, a in rows]
                bump += 1
                started = time.perf_counter()
                written = await write(db, batch, datetime.now(UTC))
                times.append(time.perf_counter() - started)
                assert written == len(rows), (name, written)
            print(
                f"   {name:36} {statistics.median(times):7.3f} s"
                f"  ({', '.join(f'{t:.3f}' for t in times)})"
            )
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200_000)
    parser.add_argument("--writes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with admin_url() as admin:
        name = f"nightcrew_bench_reconcile_writes_{os.getpid()}"  # beside other bench runs
        url = recreate(admin, name)
        try:

            async def prepare() -> None:
                db = await Database.open(url)
                try:
                    await load(db, args.episodes)
                finally:
                    await db.close()

            asyncio.run(prepare())
            asyncio.run(bench(url, args.writes, args.runs))
        finally:
            drop(admin, name)


if __name__ == "__main__":
    main()
