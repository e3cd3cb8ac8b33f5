"""A RabbitMQ that goes silent (accepting, never answering) is noticed by its AMQP heartbeats
within ~30 s: the stage consumers report the connection lost and reconnect. Real
RabbitMQ behind a TCP proxy that the test blackholes."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from nightcrew.adapters.broker import AMQP_HEARTBEAT_SECONDS, PipelineBroker, with_heartbeat
from tests.support.proxy import TcpProxy
from tests.support.services import AMQP_URL, needs_rabbitmq


def test_the_heartbeat_is_added_unless_the_url_sets_one() -> None:
    assert with_heartbeat("amqp://g:g@127.0.0.1:5672/") == (
        f"amqp://g:g@127.0.0.1:5672/?heartbeat={AMQP_HEARTBEAT_SECONDS}"
    )
    assert with_heartbeat("amqp://g:g@h/vh?heartbeat=5") == "amqp://g:g@h/vh?heartbeat=5"
    assert with_heartbeat("amqp://u:p%40x@h/%2F?name=a") == (
        f"amqp://u:p%40x@h/%2F?name=a&heartbeat={AMQP_HEARTBEAT_SECONDS}"
    )


@needs_rabbitmq
@pytest.mark.slow
async def test_a_silent_broker_is_noticed_within_about_30_seconds() -> None:
    target = urlsplit(AMQP_URL)
    proxy = TcpProxy(target.port or 5672, target.hostname or "127.0.0.1")
    await proxy.start()
    via_proxy = urlunsplit(
        target._replace(netloc=f"{target.netloc.rsplit('@', 1)[0]}@127.0.0.1:{proxy.port}")
    )
    prefix = f"nightcrew-test-{uuid.uuid4().hex[:8]}"
    broker = PipelineBroker(via_proxy, prefix=prefix, max_deliveries=5)
    direct = PipelineBroker(AMQP_URL, prefix=prefix, max_deliveries=5)
    seen: dict[str, list[float]] = {}
    changed = asyncio.Event()
    stop = asyncio.Event()

    def on_event(name: str, _detail: str) -> None:
        seen.setdefault(name, []).append(time.monotonic())
        changed.set()

    async def until(name: str, count: int = 1) -> float:
        while len(seen.get(name, [])) < count:
            changed.clear()
            await changed.wait()
        return seen[name][count - 1]

    async def handler(_: object) -> None:
        return None

    consumers = broker.consumers({"fetch": handler}, {"fetch": 1})
    running = asyncio.create_task(consumers.run(stop, on_event))
    try:
        async with asyncio.timeout(30):
            await until("news.broker_connected")
        proxy.blackhole()
        silent_at = time.monotonic()
        async with asyncio.timeout(60):
            lost_at = await until("news.broker_connection_lost")
        noticed = lost_at - silent_at
        # three missed heartbeats of 10 s, and the 0.5 s liveness poll
        assert noticed <= 3 * AMQP_HEARTBEAT_SECONDS + 6, noticed
        await proxy.restore()
        async with asyncio.timeout(60):  # and it comes back by itself
            await until("news.broker_connected", 2)
    finally:
        stop.set()
        await proxy.restore()
        await asyncio.wait_for(running, 30)
        await consumers.close()
        await broker.close()
        await direct.delete_topology()
        await direct.close()
        await proxy.cut()
