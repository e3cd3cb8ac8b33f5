"""Queue effects through the production backend: a real RabbitMQ behind a TCP proxy that goes
away and comes back (skipped when NIGHTCREW_TEST_AMQP_URL is off or does not answer)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

from nightcrew.adapters.queues import RabbitQueueProducer
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.effects.deliver import deliver_effects, deliver_now
from tests.conftest import NOW, make_runtime
from tests.support.proxy import TcpProxy
from tests.support.services import AMQP_URL, host_port, needs_rabbitmq, with_port

pytestmark = needs_rabbitmq


async def test_a_message_refused_while_the_broker_is_away_is_published_once_it_is_back(
    db: Database, clock: FrozenClock, fresh_db_url: str
) -> None:
    import aio_pika

    queue = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    broker_host, broker_port = host_port(AMQP_URL)
    proxy = TcpProxy(broker_port, broker_host)
    await proxy.start()
    producer = await RabbitQueueProducer.connect(with_port(AMQP_URL, proxy.port))
    reader = await aio_pika.connect_robust(AMQP_URL)
    try:
        runtime = await make_runtime(db, clock, fresh_db_url, queues=producer)
        async with db.transaction() as tx:
            effect = await outbox.record(
                tx,
                key=f"{queue}:1",
                payload=outbox.QueuePayload(
                    queue=queue, body={"type": "podcast.deleted", "podcast_id": "p"}
                ),
                now=NOW,
            )
        await proxy.cut()  # the broker goes away between the commit and the first send
        [first] = await deliver_now(runtime, clock, [effect])
        assert first.status == "transient"

        await proxy.start()  # back; aio-pika's robust connection reconnects within seconds
        for _ in range(40):
            clock.advance(timedelta(minutes=1))
            if (await deliver_effects(runtime, clock)).delivered:
                break
            await asyncio.sleep(0.5)
        delivered = await outbox.get(db, effect.id)
        assert delivered is not None and delivered.delivered_at is not None

        clock.advance(timedelta(hours=1))
        assert (await deliver_effects(runtime, clock)).delivered == 0
        channel = await reader.channel()
        q = await channel.declare_queue(queue, durable=True)
        bodies = []
        while (message := await q.get(no_ack=True, fail=False)) is not None:
            bodies.append(json.loads(message.body))
        assert bodies == [{"type": "podcast.deleted", "podcast_id": "p", "effect_id": effect.id}]
        await q.delete(if_unused=False, if_empty=False)
    finally:
        await producer.close()
        await reader.close()
        await proxy.cut()
