"""Claim and run the daily lane's 04:00 slot as a scheduled run, in a process of its own.

``python -m tests.faults._daily_claim DATABASE_URL STRIPE_API_BASE``: with a paused podcast whose
pause expired and a Stripe that never answers, the run sits inside the billing resume (a
``running`` row in nightcrew.runs) until the test SIGKILLs this process.
"""

from __future__ import annotations

import asyncio
import sys

from nightcrew.adapters.billing import StripeBilling
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.lanes import run_lane
from tests.conftest import NOW, make_runtime


async def main(url: str, stripe_api_base: str) -> None:
    clock = FrozenClock(NOW)
    db = await Database.open(url)
    try:
        runtime = await make_runtime(
            db, clock, url, billing=StripeBilling("sk_test_fault", api_base=stripe_api_base)
        )
        await run_lane(runtime, clock, "daily", trigger="scheduled", slot=NOW)
    finally:
        await db.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
