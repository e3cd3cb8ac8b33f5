"""Run the pipeline's fetch stage for one source, then a pass, in a process of its own, and die
(``os._exit``, no cleanup, as a SIGKILL would) at the first publish — that is, right after the
transaction in which the pass admitted the candidates, with their outgoing messages, committed,
before the broker has any.

``python -m tests.faults._fetch_then_crash ENV_JSON SOURCE_ID``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.assembly import open_runtime
from nightcrew.clock import SystemClock
from nightcrew.config import Settings
from nightcrew.news.engines.pipeline import stages
from nightcrew.news.engines.pipeline.attempts import Attempt
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.passes import run_pass


async def _die(self: PipelineBroker, messages: Any, *, dead: bool = False) -> None:
    print(f"crashing before publishing {len(messages)} message(s)", flush=True)
    os._exit(137)


async def main(env: dict[str, str], source_id: int) -> None:
    PipelineBroker.publish = _die  # type: ignore[method-assign]
    clock = SystemClock()
    async with open_runtime(Settings.model_validate(env), clock) as runtime:
        ctx = stages.StageContext(runtime=runtime, clock=clock, broker=broker_of(runtime))
        # the fetch holds what is new for the pass (it publishes nothing); the pass admits it,
        # committing the candidates queued with their messages owed, and dies publishing them
        await stages.fetch(ctx, Attempt(), {"source_id": source_id, "shard": "s"})
        await run_pass(runtime, clock, "s")
    print("admitted without publishing anything", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), int(sys.argv[2])))
