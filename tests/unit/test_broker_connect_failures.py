"""A RabbitMQ connection whose channel cannot be opened is closed at once, by us: left to the
garbage collector, aio_pika's ``__del__`` schedules a close that nobody awaits (a
``RuntimeWarning``, and a socket held until then). The broker is a stand-in here: a real one
opens channels whenever it accepts the connection."""

from __future__ import annotations

from typing import Any

import aio_pika
import pytest

from nightcrew.adapters.broker import PipelineBroker
from nightcrew.adapters.queues import RabbitQueueProducer
from nightcrew.errors import QueueUnavailableError


class _ChannelRefused(Exception):
    pass


class _Connection:
    """Accepted, then refuses every channel."""

    def __init__(self) -> None:
        self.is_closed = False
        self.closes = 0

    async def channel(self, **_: Any) -> None:
        raise _ChannelRefused("channel refused")

    async def close(self) -> None:
        self.closes += 1
        self.is_closed = True


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[_Connection]:
    made: list[_Connection] = []

    async def connect(*_: Any, **__: Any) -> _Connection:
        made.append(_Connection())
        return made[-1]

    monkeypatch.setattr(aio_pika, "connect", connect)
    monkeypatch.setattr(aio_pika, "connect_robust", connect)
    return made


async def test_the_pipeline_broker_closes_a_connection_whose_channel_failed(
    opened: list[_Connection],
) -> None:
    broker = PipelineBroker("amqp://guest:guest@127.0.0.1:5672/", prefix="t", max_deliveries=3)
    with pytest.raises(QueueUnavailableError, match=r"cannot reach RabbitMQ at 127\.0\.0\.1:5672/"):
        await broker.connect()
    assert [c.closes for c in opened] == [1]


async def test_the_queue_producer_closes_a_connection_whose_channel_failed(
    opened: list[_Connection],
) -> None:
    with pytest.raises(QueueUnavailableError, match="channel refused"):
        await RabbitQueueProducer.connect("amqp://guest:guest@127.0.0.1:5672/")
    assert [c.closes for c in opened] == [1]
