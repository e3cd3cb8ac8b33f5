"""Run the daily lane's hard deletions in a process of its own, and SIGKILL that process right
after the store's answer to its ``kill_after``-th delete — before the page's count is written:
the window a crash used to lose a page of ``objects_deleted`` in.

``python -m tests.faults._delete_then_crash DATABASE_URL STORAGE_URL KILL_AFTER``
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from nightcrew.adapters.storage import DeleteOutcome, ObstoreStore, open_store
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.lifecycle.deletions import hard_delete_expired_podcasts
from tests.conftest import NOW, make_runtime


async def main(url: str, storage_url: str, kill_after: int) -> None:
    deliver = ObstoreStore.delete
    calls = 0

    async def delete_then_die(self: ObstoreStore, keys: Sequence[str]) -> DeleteOutcome:
        nonlocal calls
        outcome = await deliver(self, keys)
        calls += 1
        if calls == kill_after:
            print(f"killed after delete {calls} ({outcome.deleted} deleted)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return outcome

    ObstoreStore.delete = delete_then_die  # type: ignore[method-assign]
    clock = FrozenClock(NOW)
    db = await Database.open(url)
    try:
        runtime = await make_runtime(db, clock, url, store=open_store(storage_url))
        await hard_delete_expired_podcasts(runtime, clock)
    finally:
        await db.close()
    print("finished without being killed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
