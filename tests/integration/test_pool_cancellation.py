"""A caller cancelled while it waits for a pooled connection costs the pool nothing: the wait
goes on in a task of its own and what it gets goes straight back (``Database._checkout``;
psycopg_pool 3.3 can lose a connection handed to a waiter as it is cancelled)."""

from __future__ import annotations

import asyncio
import time

from nightcrew.db.database import Database


async def test_callers_cancelled_while_waiting_leave_every_connection_in_the_pool(
    fresh_db_url: str,
) -> None:
    db = await Database.open(fresh_db_url, max_size=2)
    try:
        for _ in range(20):  # waves of callers that give up at every moment of their wait

            async def impatient(seconds: float) -> None:
                try:
                    async with asyncio.timeout(seconds):
                        await db.fetch("SELECT pg_sleep(0.002)")
                except TimeoutError:
                    pass

            await asyncio.gather(*(impatient(0.0005 * n) for n in range(60)))
        deadline = time.monotonic() + 5
        stats = db._pool.get_stats()
        while time.monotonic() < deadline:
            stats = db._pool.get_stats()
            if (
                stats.get("requests_waiting", 0) == 0
                and stats["pool_available"] == stats["pool_size"]
            ):
                break
            await asyncio.sleep(0.05)
        assert stats.get("requests_waiting", 0) == 0, stats
        assert stats["pool_available"] == stats["pool_size"] == 2, stats
        # and both connections serve at once
        started = time.monotonic()
        await asyncio.gather(db.fetch("SELECT pg_sleep(0.2)"), db.fetch("SELECT pg_sleep(0.2)"))
        assert time.monotonic() - started < 0.39
    finally:
        await db.close()
