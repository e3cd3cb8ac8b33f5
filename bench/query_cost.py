"""Benchmark: what one query costs, layer by layer, from the socket to a record.

    python -m bench.query_cost [--queries 2000] [--repeat 7]

Each line is the median of ``--repeat`` rounds of ``--queries`` queries, one after another, on
real PostgreSQL: ``SELECT 1`` on one psycopg connection of its own; the same through
psycopg_pool without and with the pool's check of the connection it hands out; the same through
``Database.fetch`` (nightcrew's pool: the check, a statement deadline, a checkout and return that
a cancelled caller cannot lose); and a 50-row, 13-column page of the run history's rows as
dict rows (``Database.fetch``) and as records (``Database.fetch_as``). No target: it says where
a pooled query's time goes (docs/benchmarks.md, "Before and after the records and rooms").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from bench._db import admin_url
from nightcrew.db.database import Database
from nightcrew.web.pages.runs import RunRow

# a run history page's shape (its RunRow): 50 rows of 13 columns
PAGE = """
SELECT g AS id, 'minute' AS lane, 'scheduled' AS trigger, now() AS slot, now() AS started_at,
       now() AS finished_at, 'completed' AS status, 1 AS attempts, NULL::text AS error,
       0 AS failures, '{"items_requeued": 1}'::jsonb AS headline, '42.5' AS duration_ms,
       NULL::text AS requested_by
  FROM generate_series(1, 50) AS g
"""


async def _median_us(query: Callable[[], Awaitable[object]], queries: int, repeat: int) -> float:
    for _ in range(min(200, queries)):  # warm: prepared statements, the pool's connection
        await query()
    rounds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(queries):
            await query()
        rounds.append((time.perf_counter() - started) / queries * 1e6)
    return statistics.median(rounds)


async def main(queries: int, repeat: int) -> None:
    with admin_url() as url:
        lines: list[tuple[str, float]] = []

        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
        try:

            async def alone() -> object:
                return await (await conn.execute("SELECT 1 AS n")).fetchall()

            lines.append(
                ("SELECT 1, one connection of its own", await _median_us(alone, queries, repeat))
            )
        finally:
            await conn.close()

        for label, check in (
            ("SELECT 1, psycopg_pool without a check", None),
            ("SELECT 1, psycopg_pool with its check", AsyncConnectionPool.check_connection),
        ):
            pool: AsyncConnectionPool[psycopg.AsyncConnection[dict[str, object]]] = (
                AsyncConnectionPool(
                    url,
                    min_size=1,
                    max_size=2,
                    open=False,
                    check=check,
                    kwargs={"autocommit": True, "row_factory": dict_row},
                )
            )
            await pool.open(wait=True)
            try:

                async def pooled(
                    pool: AsyncConnectionPool[psycopg.AsyncConnection[dict[str, object]]] = pool,
                ) -> object:
                    async with pool.connection() as c:
                        return await (await c.execute("SELECT 1 AS n")).fetchall()

                lines.append((label, await _median_us(pooled, queries, repeat)))
            finally:
                await pool.close()

        db = await Database.open(url)
        try:
            lines.append(
                (
                    "SELECT 1, Database.fetch",
                    await _median_us(lambda: db.fetch("SELECT 1 AS n"), queries, repeat),
                )
            )
            lines.append(
                (
                    "a 50-row page, Database.fetch (dict rows)",
                    await _median_us(lambda: db.fetch(PAGE), queries, repeat),
                )
            )
            lines.append(
                (
                    "a 50-row page, Database.fetch_as (records)",
                    await _median_us(lambda: db.fetch_as(RunRow, PAGE), queries, repeat),
                )
            )
        finally:
            await db.close()

    print(f"\n== one query, medians of {repeat} rounds of {queries:,} queries")
    for label, us in lines:
        print(f"   {label:<48} {us:7.0f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.queries, args.repeat))
