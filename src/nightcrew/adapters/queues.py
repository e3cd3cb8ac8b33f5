"""Queue producers: ``send(queue, body, delay_seconds=0)`` behind one interface.

``postgres`` (the default) appends to ``nightcrew.queue_messages``; the message becomes visible
to consumers at ``now + delay``. ``amqp://…`` publishes to RabbitMQ: a durable queue named
like the spec's queue, persistent messages, publisher confirms (a send returns only once the
broker has the message). A delay goes through ``{queue}.delay.{ms}``, a queue whose messages
expire after that long into the real queue (one delay queue per delay, so no message waits
behind a longer one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from nightcrew.clock import Clock
from nightcrew.db.database import Database, QueryError, json_param
from nightcrew.errors import (
    DatabaseUnavailableError,
    NightcrewError,
    QueueError,
    QueueMisconfiguredError,
    QueueUnavailableError,
)

# The queues spec 000 produces to.
RSS_INVALIDATION = "rss-invalidation"
PODCAST_IMPORTS = "podcast-imports"
EXTERNAL_EPISODE_LINK = "external-episode-link"
PUBLIC_API_INVALIDATION = "public-api-invalidation"


class QueueProducer(Protocol):
    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:
        """Enqueue one JSON message; raises QueueError when the backend did not accept it."""
        ...


def _validate(queue: str, body: Mapping[str, Any], delay_seconds: int) -> str:
    if not queue:
        raise QueueError("queue name is empty")
    if delay_seconds < 0:
        raise QueueError(f"delay_seconds must be >= 0, got {delay_seconds}")
    try:
        return json.dumps(body, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise QueueError(f"message for {queue} is not JSON-serialisable: {exc}") from exc


class PostgresQueueProducer:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:
        _validate(queue, body, delay_seconds)
        visible_at = self._clock.now() + timedelta(seconds=delay_seconds)
        try:
            await self._db.execute(
                "INSERT INTO nightcrew.queue_messages (queue, body, visible_at)"
                " VALUES (%(queue)s, %(body)s, %(visible_at)s)",
                {"queue": queue, "body": json_param(dict(body)), "visible_at": visible_at},
            )
        except DatabaseUnavailableError:
            raise  # the database itself is gone: not a queue failure to log per message
        except QueryError as exc:  # a refused statement
            if exc.sqlstate in MISCONFIGURED_SQLSTATES:
                raise QueueMisconfiguredError(
                    f"cannot enqueue to {queue}: {exc} (run `nightcrew db migrate`?)"
                ) from exc
            raise QueueError(f"could not enqueue to {queue}: {exc}") from exc
        except NightcrewError as exc:
            raise QueueError(f"could not enqueue to {queue}: {exc}") from exc


@dataclass(frozen=True, kw_only=True, slots=True)
class SentMessage:
    queue: str
    body: dict[str, Any]
    visible_at: datetime


class MemoryQueueProducer:
    """An in-process producer for unit tests: records what was sent, can be told to fail."""

    def __init__(self, clock: Clock, *, failing_queues: frozenset[str] = frozenset()) -> None:
        self._clock = clock
        self.failing_queues = failing_queues
        self.sent: list[SentMessage] = []

    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:
        payload = _validate(queue, body, delay_seconds)
        if queue in self.failing_queues:
            raise QueueError(f"queue {queue} is refusing messages")
        self.sent.append(
            SentMessage(
                queue=queue,
                body=json.loads(payload),
                visible_at=self._clock.now() + timedelta(seconds=delay_seconds),
            )
        )


# The in-database queue's table missing (undefined_table), or not ours to write
# (insufficient_privilege): a configuration to fix, not a send to retry.
MISCONFIGURED_SQLSTATES = frozenset({"42P01", "42501"})

# aio-pika's robust channel makes a publish wait for the reconnection while the broker is away,
# however long that takes: a send is bounded, and a timeout is an ordinary (retried) failure.
SEND_TIMEOUT_SECONDS = 10.0


class RabbitQueueProducer:
    """RabbitMQ through aio-pika: one robust connection, one confirming channel."""

    def __init__(self, channel: Any, connection: Any) -> None:
        self._channel = channel
        self._connection = connection
        self._declared: set[str] = set()

    @classmethod
    async def connect(cls, url: str) -> RabbitQueueProducer:
        import aio_pika

        connection = None
        try:
            connection = await aio_pika.connect_robust(url, timeout=10)
            channel = await connection.channel(publisher_confirms=True)
        except Exception as exc:
            if connection is not None:  # its channel failed: closed here, not by the collector
                with contextlib.suppress(Exception):
                    await connection.close()
            where = url.split("@")[-1]
            raise QueueUnavailableError(f"cannot reach RabbitMQ at {where}: {exc}") from exc
        return cls(channel, connection)

    async def _declare(self, name: str, arguments: dict[str, Any] | None = None) -> None:
        """Declared once per queue, on a channel of its own, closed at once: a broker that
        refuses the queue closes the channel the refusal came on, and that must be neither the
        publishing channel nor another queue's (the minute lane's sweeps send side by side)."""
        if name in self._declared:
            return
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            await channel.declare_queue(name, durable=True, arguments=arguments)
        finally:
            # closed by us, so a robust channel the broker closed is not reopened (and leaked)
            with contextlib.suppress(Exception):
                await channel.close()
        self._declared.add(name)

    async def send(self, queue: str, body: Mapping[str, Any], delay_seconds: int = 0) -> None:

        payload = _validate(queue, body, delay_seconds)
        try:
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                await self._publish(queue, payload, delay_seconds)
        except TimeoutError as exc:
            raise QueueError(
                f"could not publish to {queue}: no confirm within {SEND_TIMEOUT_SECONDS:g} s"
                " (the broker is unreachable or reconnecting)"
            ) from exc

    async def _publish(self, queue: str, payload: str, delay_seconds: int) -> None:
        import aio_pika

        try:
            await self._declare(queue)
            target = queue
            if delay_seconds > 0:
                ms = delay_seconds * 1000
                target = f"{queue}.delay.{ms}"
                await self._declare(
                    target,
                    {
                        "x-message-ttl": ms,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": queue,
                    },
                )
            await self._channel.default_exchange.publish(
                aio_pika.Message(
                    payload.encode(),
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=target,
            )
        except QueueError:
            raise
        except Exception as exc:
            from aiormq.exceptions import (
                ChannelAccessRefused,
                ChannelNotFoundEntity,
                ChannelPreconditionFailed,
            )

            refused = (ChannelAccessRefused, ChannelNotFoundEntity, ChannelPreconditionFailed)
            if isinstance(exc, refused):
                if self._channel.is_closed:  # refused on the publishing channel itself
                    await self._reopen()
                raise QueueMisconfiguredError(f"cannot publish to {queue}: {exc}") from exc
            raise QueueError(f"could not publish to {queue}: {exc}") from exc

    async def _reopen(self) -> None:
        """A new publishing channel, the closed one closed for good (a robust channel would
        otherwise come back on its own, one more left open each time)."""
        with contextlib.suppress(Exception):
            await self._channel.close()
        self._declared.clear()
        with contextlib.suppress(Exception):
            self._channel = await self._connection.channel(publisher_confirms=True)

    async def close(self) -> None:
        await self._connection.close()
