"""A `news worker` for the review stage whose model call for one poison URL kills its own
process: the request reaches the model (the stand-in counts it), then SIGKILL — mid-call, with
the review lease taken and the candidate's attempt counted, nothing acknowledged or released.
Every other article is reviewed as usual, one message at a time.

``python -m tests.faults._poison_model_worker ENV_JSON POISON_URL``
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from nightcrew.adapters.model_reviewer import ChatReviewer
from nightcrew.adapters.reviewer import Article, CallScope, Verdict
from nightcrew.assembly import open_runtime
from nightcrew.clock import SystemClock
from nightcrew.config import Settings
from nightcrew.news.engines.pipeline.worker import Worker

ASKED_SECONDS = 0.3  # the request is at the model by then (its stand-in answers after longer)


async def main(env: dict[str, str], poison: str) -> None:
    review = ChatReviewer.review

    async def deadly(
        self: ChatReviewer, article: Article, scope: CallScope | None = None
    ) -> Verdict:
        if article.url != poison:
            return await review(self, article, scope)
        call = asyncio.create_task(review(self, article, scope))
        await asyncio.sleep(ASKED_SECONDS)
        print(f"killed mid-call by {poison}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return await call  # never reached

    ChatReviewer.review = deadly  # type: ignore[method-assign]
    clock = SystemClock()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_runtime(Settings.model_validate(env), clock) as runtime:
        await Worker(runtime, clock, ["review"], 1).run(stop, grace=5)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2]))
