"""The news pipeline's RabbitMQ: its topology, confirmed publishing, consuming and dead letters.

Topology (declared idempotently on first use; ``prefix`` is NEWS_QUEUE_PREFIX, ``news``):

* exchange ``{prefix}`` (direct, durable): a stage's messages are published with the stage's
  name as routing key and reach the quorum queue ``{prefix}.{stage}``;
* every stage queue is a **quorum** queue with ``x-delivery-limit`` = NEWS_MAX_DELIVERIES and
  dead-letters (at-least-once) to exchange ``{prefix}.dlx`` with the stage as routing key,
  which routes to ``{prefix}.{stage}.dlq`` (quorum as well). A consumer that fails a message
  for the last time publishes it there itself, with the error in ``x-last-error``; the broker's
  delivery limit catches what no consumer lives to report (a message that kills its worker).

Messages are persistent JSON, published with ``mandatory`` and publisher confirms: ``publish``
returns once the broker has every message, or raises QueueError. aio-pika's robust connection
reconnects, re-declares and re-consumes after a broker restart or a cut connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nightcrew.errors import ConfigError, QueueError, QueueUnavailableError

STAGES = ("fetch", "enrich", "review", "write")
PUBLISH_TIMEOUT_SECONDS = 10.0
DECLARE_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Outgoing:
    message_id: str
    stage: str
    body: dict[str, Any]
    headers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter:
    message_id: str
    stage: str
    body: dict[str, Any]
    error: str
    deliveries: int
    reason: str  # "failed" (a consumer gave up), "delivery_limit" (the broker did), …


class Delivery:
    """One message a consumer holds: settle it exactly once with ack / requeue."""

    def __init__(self, stage: str, message: Any) -> None:
        self.stage = stage
        self._message = message
        self.message_id: str = message.message_id or ""
        self.headers: dict[str, Any] = dict(message.headers or {})
        try:
            self.body: dict[str, Any] = json.loads(message.body)
        except ValueError:
            self.body = {"unreadable": message.body[:200].decode("utf-8", "replace")}

    @property
    def deliveries(self) -> int:
        """Which delivery this is, 1 for the first (quorum queues count the earlier ones)."""
        return int(self.headers.get("x-delivery-count", 0) or 0) + 1

    async def ack(self) -> bool:
        """False when the channel went away meanwhile: the broker redelivers the message."""
        return await self._settle(self._message.ack())

    async def requeue(self) -> bool:
        return await self._settle(self._message.nack(requeue=True))

    @staticmethod
    async def _settle(call: Awaitable[None]) -> bool:
        try:
            await call
        except Exception:  # a closed channel: settled by the broker's redelivery instead
            return False
        return True


Handler = Callable[[Delivery], Awaitable[None]]


class PipelineBroker:
    """One robust connection; a confirming channel to publish, one channel per consumed stage."""

    def __init__(self, url: str, *, prefix: str, max_deliveries: int) -> None:
        self._url = url
        self.prefix = prefix
        self.max_deliveries = max_deliveries
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None
        self._dlx: Any = None
        self._lock = asyncio.Lock()
        self._consumers: list[tuple[Any, str]] = []

    def queue_name(self, stage: str) -> str:
        return f"{self.prefix}.{stage}"

    def dlq_name(self, stage: str) -> str:
        return f"{self.prefix}.{stage}.dlq"

    def stage_arguments(self, stage: str) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.max_deliveries,
            "x-dead-letter-exchange": f"{self.prefix}.dlx",
            "x-dead-letter-routing-key": stage,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    async def connect(self) -> None:
        async with self._lock:
            if self._channel is not None:
                return
            import aio_pika

            where = self._url.split("@")[-1]
            try:
                async with asyncio.timeout(DECLARE_TIMEOUT_SECONDS):
                    self._connection = await aio_pika.connect_robust(self._url, timeout=10)
                    channel = await self._connection.channel(publisher_confirms=True)
            except Exception as exc:
                raise QueueUnavailableError(f"cannot reach RabbitMQ at {where}: {exc}") from exc
            try:
                await self._declare(channel)
            except aio_pika.exceptions.ChannelPreconditionFailed as exc:
                await self._connection.close()
                raise ConfigError(
                    f"RabbitMQ at {where}: a {self.prefix}.* queue exists with other arguments"
                    f" ({exc}); NEWS_MAX_DELIVERIES or NEWS_QUEUE_PREFIX changed? Drain and"
                    " delete the old queues, or keep the old setting"
                ) from exc
            self._channel = channel

    async def _declare(self, channel: Any) -> None:
        import aio_pika

        self._exchange = await channel.declare_exchange(
            self.prefix, aio_pika.ExchangeType.DIRECT, durable=True
        )
        self._dlx = await channel.declare_exchange(
            f"{self.prefix}.dlx", aio_pika.ExchangeType.DIRECT, durable=True
        )
        for stage in STAGES:
            queue = await channel.declare_queue(
                self.queue_name(stage), durable=True, arguments=self.stage_arguments(stage)
            )
            await queue.bind(self._exchange, routing_key=stage)
            dlq = await channel.declare_queue(
                self.dlq_name(stage), durable=True, arguments={"x-queue-type": "quorum"}
            )
            await dlq.bind(self._dlx, routing_key=stage)

    async def publish(self, messages: Sequence[Outgoing], *, dead: bool = False) -> None:
        """Every message confirmed by the broker, or QueueError (then some may have arrived:
        consumers are idempotent, so the caller simply publishes them all again)."""
        if not messages:
            return
        await self.connect()
        import aio_pika

        exchange = self._dlx if dead else self._exchange
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
                await asyncio.gather(
                    *(
                        exchange.publish(
                            aio_pika.Message(
                                json.dumps(m.body, separators=(",", ":"), default=str).encode(),
                                content_type="application/json",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                message_id=m.message_id,
                                headers=m.headers or None,
                            ),
                            routing_key=m.stage,
                            mandatory=True,
                        )
                        for m in messages
                    )
                )
        except TimeoutError as exc:
            raise QueueError(
                f"RabbitMQ did not confirm {len(messages)} message(s) within"
                f" {PUBLISH_TIMEOUT_SECONDS:g} s (unreachable or reconnecting)"
            ) from exc
        except Exception as exc:
            raise QueueError(f"could not publish to {self.prefix}: {exc}") from exc

    async def consume(self, stage: str, prefetch: int, handler: Handler) -> None:
        """Deliver ``stage``'s messages to ``handler``, at most ``prefetch`` at once."""
        await self.connect()
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue(
            self.queue_name(stage), durable=True, arguments=self.stage_arguments(stage)
        )

        async def on_message(message: Any) -> None:
            await handler(Delivery(stage, message))

        tag = await queue.consume(on_message, no_ack=False)
        self._consumers.append((queue, tag))

    async def stop_consuming(self) -> None:
        """Take no more messages; the ones held are still settled on their channels."""
        for queue, tag in self._consumers:
            try:
                await queue.cancel(tag)
            except Exception:  # the channel is gone: nothing more comes from it anyway
                pass
        self._consumers.clear()

    async def ready(self, stage: str, *, dlq: bool = False) -> int:
        """Messages waiting (not yet delivered) in a stage's queue, or in its dead letters."""
        await self.connect()
        name = self.dlq_name(stage) if dlq else self.queue_name(stage)
        try:
            channel = await self._connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                return int(queue.declaration_result.message_count)
            finally:
                await channel.close()
        except Exception as exc:
            raise QueueError(f"cannot read the depth of {name}: {exc}") from exc

    async def dead_letters(
        self, stage: str, take: Callable[[DeadLetter], Awaitable[bool]] | None = None
    ) -> list[DeadLetter]:
        """Every dead letter of ``stage``. With ``take``, each one for which it returns True
        is removed from the queue (after ``take`` did its work); the others stay."""
        await self.connect()
        channel = await self._connection.channel()
        found: list[DeadLetter] = []
        try:
            queue = await channel.declare_queue(self.dlq_name(stage), passive=True)
            # every message is held (unacked) until the channel closes, so each is seen once
            while (message := await queue.get(no_ack=False, fail=False, timeout=5)) is not None:
                letter = _dead_letter(stage, Delivery(stage, message))
                found.append(letter)
                if take is not None and await take(letter):
                    await message.ack()
        finally:
            await channel.close()  # returns what was not taken to the queue
        return found

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = self._channel = None


def _dead_letter(stage: str, delivery: Delivery) -> DeadLetter:
    headers = delivery.headers
    deaths = headers.get("x-death") or []
    death = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
    reason = str(headers.get("x-dead-reason") or death.get("reason") or "unknown")
    error = headers.get("x-last-error")
    if error is None:
        error = f"dead-lettered by the broker ({reason}): a worker died handling it each time"
    return DeadLetter(
        message_id=delivery.message_id,
        stage=stage,
        body=delivery.body,
        error=str(error),
        deliveries=int(headers.get("x-deliveries") or headers.get("x-delivery-count") or 0),
        reason=reason,
    )
