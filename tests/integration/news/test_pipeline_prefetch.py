"""Per-stage prefetch on a real RabbitMQ: every stage a process consumes gets its own channel
and QoS, so `--stage all` can hold 1 review (a slow, costly model) and many writes at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from nightcrew.adapters.broker import Delivery, Outgoing
from nightcrew.clock import SystemClock
from nightcrew.db.database import Database
from nightcrew.news.engines.pipeline import message_outbox
from nightcrew.news.engines.pipeline.worker import Worker
from tests.integration.news.pipeline_support import (
    pipeline_env,
    pipeline_runtime,
    wait_for,
)
from tests.support.services import needs_rabbitmq
from tests.support.standins import ModelStandIn

pytestmark = needs_rabbitmq


async def test_each_stage_holds_at_most_its_own_prefetch_on_its_own_channel(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    env = pipeline_env(
        fresh_db_url, prefix, model, tmp_path, NEWS_STAGE_PREFETCH="review=1,write=3"
    )
    async with pipeline_runtime(env, db) as runtime:
        worker = Worker(runtime, SystemClock(), ["enrich", "review", "write"], 2)
        assert worker.prefetch == {"enrich": 2, "review": 1, "write": 3}

        broker = message_outbox.broker_of(runtime)
        held: Counter[str] = Counter()
        release = asyncio.Event()

        async def hold(delivery: Delivery) -> None:
            held[delivery.stage] += 1
            await release.wait()
            await delivery.ack()

        consumers = broker.consumers(
            {"enrich": hold, "review": hold, "write": hold}, worker.prefetch
        )
        await broker.publish(
            [
                Outgoing(message_id=f"{stage}-{n}", stage=stage, body={"n": n})
                for stage in ("enrich", "review", "write")
                for n in range(6)
            ]
        )
        stop = asyncio.Event()
        running = asyncio.create_task(consumers.run(stop, lambda name, detail: None))
        try:
            await wait_for(
                lambda: _holding(held, {"enrich": 2, "review": 1, "write": 3}),
                within=30,
                what="each stage holding its prefetch",
            )
            # nothing more arrives while those are held: the broker keeps the rest ready
            await asyncio.sleep(1.0)
            assert held == {"enrich": 2, "review": 1, "write": 3}
            assert [await broker.ready(s) for s in ("enrich", "review", "write")] == [4, 5, 3]
            release.set()
            await wait_for(
                lambda: _holding(held, {"enrich": 6, "review": 6, "write": 6}),
                within=30,
                what="every message handled once released",
            )
        finally:
            release.set()
            stop.set()
            await running
            await consumers.close()


async def _holding(held: Counter[str], expected: dict[str, int]) -> bool:
    return dict(held) == expected
