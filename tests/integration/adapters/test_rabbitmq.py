"""The RabbitMQ queue producer against a real broker (NIGHTCREW_TEST_AMQP_URL; those tests are
skipped when it is off or does not answer)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid

import pytest

from nightcrew.adapters.queues import RabbitQueueProducer
from nightcrew.errors import QueueUnavailableError
from tests.support.rabbitmq_vhosts import open_channels, rabbitmq_vhost, vhost_url
from tests.support.services import AMQP_URL as URL
from tests.support.services import needs_rabbitmq


async def _get(channel: object, queue: str) -> dict[str, object] | None:
    q = await channel.declare_queue(queue, durable=True)  # type: ignore[attr-defined]
    message = await q.get(fail=False, no_ack=True)
    return None if message is None else json.loads(message.body)


@needs_rabbitmq
async def test_send_publishes_a_persistent_json_message() -> None:
    import aio_pika

    queue = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    producer = await RabbitQueueProducer.connect(URL)
    connection = await aio_pika.connect_robust(URL)
    try:
        await producer.send(queue, {"import_id": "i", "import_item_id": "t", "podcast_id": "p"})
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True)
        message = await q.get(no_ack=True)
        assert json.loads(message.body) == {
            "import_id": "i",
            "import_item_id": "t",
            "podcast_id": "p",
        }
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        await q.delete(if_unused=False, if_empty=False)
    finally:
        await producer.close()
        await connection.close()


@needs_rabbitmq
async def test_a_delayed_message_surfaces_only_after_its_delay() -> None:
    import aio_pika

    queue = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    producer = await RabbitQueueProducer.connect(URL)
    connection = await aio_pika.connect_robust(URL)
    try:
        await producer.send(queue, {"n": 1}, delay_seconds=1)
        channel = await connection.channel()
        assert await _get(channel, queue) is None  # not yet
        await asyncio.sleep(1.6)
        assert await _get(channel, queue) == {"n": 1}
        for name in (queue, f"{queue}.delay.1000"):
            q = await channel.declare_queue(name, durable=True, passive=True)
            await q.delete(if_unused=False, if_empty=False)
    finally:
        await producer.close()
        await connection.close()


async def test_an_unreachable_broker_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(QueueUnavailableError, match=f"cannot reach RabbitMQ at 127.0.0.1:{port}"):
        await RabbitQueueProducer.connect(f"amqp://guest:guest@127.0.0.1:{port}/")


@needs_rabbitmq
async def test_a_queue_the_broker_refuses_is_misconfigured_not_a_retry() -> None:
    """The queue exists on the broker declared otherwise (here: not durable, as another tool
    made it): the broker refuses our declare (406 PRECONDITION_FAILED) — a configuration to
    fix, QueueMisconfiguredError, not a send to retry; the producer goes on for other queues."""
    import aio_pika

    from nightcrew.errors import QueueMisconfiguredError

    queue = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    other = f"{queue}-other"
    connection = await aio_pika.connect_robust(URL)
    producer = await RabbitQueueProducer.connect(URL)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=False, auto_delete=False)
        with pytest.raises(QueueMisconfiguredError, match="PRECONDITION_FAILED"):
            await producer.send(queue, {"n": 1})
        await producer.send(other, {"n": 2})  # the channel recovers for the next queue
        assert await _get(channel, other) == {"n": 2}
    finally:
        channel = await connection.channel()
        for name in (queue, other):
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
        await producer.close()
        await connection.close()


@needs_rabbitmq
async def test_a_refused_queue_fails_alone_beside_concurrent_sends_and_leaks_no_channel() -> None:
    """The minute lane's sweeps send side by side. A vhost where the user may not declare
    `podcast-imports`: 20 rounds of one import and one link send at once. Every import is
    refused as misconfigured; every link is published and confirmed (the refusal closes only
    the channel it came on, never the publishing one); and the connection's open channels stay
    as they were (a refused channel is closed for good, not reopened by the robust client)."""
    import aio_pika

    from nightcrew.adapters.queues import EXTERNAL_EPISODE_LINK, PODCAST_IMPORTS
    from nightcrew.errors import QueueMisconfiguredError

    vhost = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    with rabbitmq_vhost(vhost, configure=f"^{EXTERNAL_EPISODE_LINK}$"):
        producer = await RabbitQueueProducer.connect(vhost_url(vhost))
        try:
            await producer.send(EXTERNAL_EPISODE_LINK, {"round": -1})
            before = open_channels(vhost)
            for n in range(20):
                imports, links = await asyncio.gather(
                    producer.send(PODCAST_IMPORTS, {"round": n}),
                    producer.send(EXTERNAL_EPISODE_LINK, {"round": n}),
                    return_exceptions=True,
                )
                assert isinstance(imports, QueueMisconfiguredError), imports
                assert "ACCESS_REFUSED" in str(imports)
                assert links is None, links
            after = open_channels(vhost)
        finally:
            await producer.close()
        connection = await aio_pika.connect_robust(vhost_url(vhost))
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(EXTERNAL_EPISODE_LINK, passive=True)
            assert queue.declaration_result.message_count == 21
        finally:
            await connection.close()
    assert after <= before, (before, after)
