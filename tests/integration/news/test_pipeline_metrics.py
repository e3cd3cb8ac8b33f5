"""GET /metrics of the app, in pipeline mode, against a real RabbitMQ and PostgreSQL: the
per-stage gauges (ready, in flight, oldest age, held, dead letters) and the workers' totals
(processed, failed, dead-lettered) carry the values the queues and tables hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from nightcrew.adapters.broker import Outgoing
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.news.engines.pipeline.message_outbox import broker_of
from nightcrew.news.engines.pipeline.metrics import collect_metrics
from nightcrew.news.sources.registry import add_source
from tests.integration.news.pipeline_support import pipeline_env, pipeline_runtime
from tests.support.services import needs_rabbitmq
from tests.support.standins import ModelStandIn

pytestmark = needs_rabbitmq

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` → value, for every sample line of a Prometheus text page."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def _candidates(
    db: Database, source: int, stage: str, state: str, n: int, age: float
) -> None:
    for i in range(n):
        await db.execute(
            "INSERT INTO news.candidates (url, source_id, shard, title, summary, stage, state,"
            " reason, created_at, updated_at) VALUES (%(url)s, %(source)s, 's', 't', 's',"
            " %(stage)s, %(state)s, 'test', %(at)s, %(at)s)",
            {
                "url": f"http://127.0.0.1:1/{stage}-{state}-{i}",
                "source": source,
                "stage": stage,
                "state": state,
                # the oldest of them this old; the others younger
                "at": NOW - timedelta(seconds=age - i),
            },
        )


async def test_the_per_stage_gauges_and_totals_appear_in_metrics_with_their_values(
    db: Database, fresh_db_url: str, prefix: str, model: ModelStandIn, tmp_path: Path
) -> None:
    clock = FrozenClock(NOW)
    env = pipeline_env(fresh_db_url, prefix, model, tmp_path)
    source = await add_source(
        db, url="http://127.0.0.1:1/feed", name="F", shard="s", now=NOW - timedelta(hours=1)
    )
    await db.execute(
        "UPDATE news.sources SET fetch_queued_at = %(at)s WHERE id = %(id)s",
        {"at": NOW - timedelta(seconds=45), "id": source.id},
    )
    await _candidates(db, source.id, "review", "queued", 5, age=120)
    await _candidates(db, source.id, "review", "held", 2, age=600)
    await _candidates(db, source.id, "write", "queued", 1, age=30)
    await db.execute(
        "INSERT INTO news.stage_counters (stage, processed, failed, dead_lettered)"
        " VALUES ('review', 4, 0, 0), ('write', 7, 3, 1)"
    )
    async with pipeline_runtime(env, db, clock) as runtime:
        broker = broker_of(runtime)
        # 3 of the 5 queued reviews wait in the queue: the other 2 are in a worker's hands
        await broker.publish(
            [Outgoing(message_id=f"r{n}", stage="review", body={"url": n}) for n in range(3)]
        )
        await broker.publish(
            [Outgoing(message_id=f"d{n}", stage="write", body={"url": n}) for n in range(2)],
            dead=True,
        )
        app = create_app(
            runtime.metrics, ServiceParts(collect=lambda: collect_metrics(runtime, clock))
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://nc") as client:
            response = await client.get("/metrics")
    assert response.status_code == 200
    got = _samples(response.text)

    def sample(name: str, stage: str) -> float:
        return got[f'nightcrew_news_stage_{name}{{stage="{stage}"}}']

    assert [sample("ready", s) for s in ("fetch", "enrich", "review", "write")] == [0, 0, 3, 0]
    assert sample("queued", "review") == 5 and sample("in_flight", "review") == 2
    assert sample("queued", "write") == 1 and sample("in_flight", "write") == 1
    assert sample("queued", "fetch") == 1 and sample("in_flight", "fetch") == 1
    assert sample("held", "review") == 2 and sample("held", "write") == 0
    assert sample("oldest_age_seconds", "review") == 120  # the queued, not the held
    assert sample("oldest_age_seconds", "write") == 30
    assert sample("oldest_age_seconds", "fetch") == 45
    assert sample("oldest_age_seconds", "enrich") == 0
    assert sample("dead_letters", "write") == 2 and sample("dead_letters", "review") == 0
    assert sample("processed_total", "write") == 7 and sample("processed_total", "review") == 4
    assert sample("failed_total", "write") == 3 and sample("failed_total", "review") == 0
    assert sample("dead_lettered_total", "write") == 1
    assert sample("dead_lettered_total", "enrich") == 0
