"""Run the daily lane in a process of its own and SIGKILL it at the first delivery of an effect:
after the transaction that changed the state and recorded the effect committed, before the
effect is claimed — so before anything is sent.

``python -m tests.faults._commit_then_crash DATABASE_URL STRIPE_API_BASE``

Prints ``killed before claiming effects [ids]`` (JSON list) just before the kill, so the test
can tell that the kill landed in that window and not somewhere else.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime

from nightcrew.adapters.billing import StripeBilling
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.lifecycle.lanes import run_lane
from tests.conftest import NOW, make_runtime

MARKER = "killed before claiming effects "
_claim_ids = outbox.claim_ids


async def _kill_at_the_claim(
    db: Database, ids: Sequence[int], now: datetime
) -> list[outbox.Effect]:
    # deliver_now's first step after the caller's commit: nothing was claimed or sent yet.
    if not ids:
        return await _claim_ids(db, ids, now)
    print(MARKER + json.dumps(sorted(ids)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(60)  # never reached: SIGKILL cannot be caught
    raise AssertionError("still alive after SIGKILL")


async def main(url: str, stripe_api_base: str) -> None:
    outbox.claim_ids = _kill_at_the_claim
    clock = FrozenClock(NOW)
    db = await Database.open(url)
    billing = StripeBilling("sk_test_fault", api_base=stripe_api_base, max_network_retries=0)
    try:
        await run_lane(await make_runtime(db, clock, url, billing=billing), clock, "daily")
    finally:
        await billing.close()
        await db.close()
    print("the daily run owed no effect", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
