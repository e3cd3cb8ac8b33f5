"""A `news worker` for the review stage whose review of one poison URL kills its own process
(SIGKILL: no cleanup, no acknowledgement, no dead letter of its own) — a message that kills
every worker that takes it, which only the broker's delivery limit can stop.

``python -m tests.faults._poison_worker ENV_JSON POISON_URL``
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from nightcrew.assembly import open_runtime
from nightcrew.clock import SystemClock
from nightcrew.config import Settings
from nightcrew.news.engines.pipeline import stages
from nightcrew.news.engines.pipeline.attempts import Attempt
from nightcrew.news.engines.pipeline.worker import Worker


async def main(env: dict[str, str], poison: str) -> None:
    review = stages.HANDLERS["review"]

    async def deadly(
        ctx: stages.StageContext, attempt: Attempt, body: dict[str, Any]
    ) -> stages.Outcome:
        if body.get("url") == poison:
            print(f"killed by {poison}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return await review(ctx, attempt, body)

    stages.HANDLERS["review"] = deadly
    clock = SystemClock()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_runtime(Settings.model_validate(env), clock) as runtime:
        await Worker(runtime, clock, ["review"], 1).run(stop)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2]))
