"""The news pipeline's RabbitMQ: its topology, confirmed publishing, consuming and dead letters.

Topology (declared idempotently on first use; ``prefix`` is NEWS_QUEUE_PREFIX, ``news``):

* exchange ``{prefix}`` (direct, durable): a stage's messages are published with the stage's
  name as routing key and reach the quorum queue ``{prefix}.{stage}``;
* every stage queue is a **quorum** queue with ``x-delivery-limit`` = NEWS_MAX_DELIVERIES and
  dead-letters (at-least-once) to exchange ``{prefix}.dlx`` with the stage as routing key,
  which routes to ``{prefix}.{stage}.dlq`` (classic, durable). A consumer that fails a message
  for the last time publishes it there itself, with the error in ``x-last-error``; the broker's
  delivery limit catches what no consumer lives to report (a message that kills its worker).

Messages are persistent JSON, published with ``mandatory`` and publisher confirms: ``publish``
returns once the broker has every message, or raises QueueError (the next publish connects
again). Consumers (``StageConsumers``) consume each stage on a channel of its own, so each
stage has its own prefetch (NEWS_STAGE_PREFETCH, else the worker's --concurrency), and
reconnect with backoff after a broker restart or a cut connection — explicitly, not through
aio-pika's robust connection, whose channel restoration cannot be relied on after a reset.

Every return of a message to a quorum queue counts toward its delivery limit: a reject or nack
with requeue, and the unacknowledged messages of a channel or connection that closes (measured
on RabbitMQ 3.10: x-delivery-count 1, 2, … then dead-lettered, whichever way it came back). So
a stopping worker does not return what it holds: it cancels its consumers, lets the work in
hand finish, and hands back the rest as fresh copies (``Delivery.handed_back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from nightcrew.errors import ConfigError, QueueError, QueueUnavailableError
from nightcrew.jsonable import Jsonable, JsonObject, named
from nightcrew.setting_parsers import STAGES

PUBLISH_TIMEOUT_SECONDS = 10.0
DECLARE_TIMEOUT_SECONDS = 10.0
# what a graceful stop carries over when it hands a message back as a fresh copy: the
# deliveries the original had spent, so a failing message still dead-letters on time
PRIOR_DELIVERIES_HEADER = "x-prior-deliveries"


@dataclass(frozen=True, kw_only=True, slots=True)
class Outgoing:
    message_id: str
    stage: str
    body: JsonObject  # the message (the pipeline's records say what each kind holds)
    headers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter(Jsonable):
    """A dead letter as `news dlq list --json` shows it (``id``: its message id)."""

    message_id: str = named("id")
    stage: str
    deliveries: int
    reason: str  # "failed" (a consumer gave up), "delivery_limit" (the broker did), …
    error: str
    body: JsonObject


class Delivery:
    """One message a consumer holds: settle it exactly once with ack / requeue."""

    def __init__(self, stage: str, message: Any) -> None:
        self.stage = stage
        self._message = message
        self.settled = False
        self.message_id: str = message.message_id or ""
        self.headers: dict[str, Any] = dict(message.headers or {})
        self.readable = True
        try:
            self.body: JsonObject = json.loads(message.body)
        except ValueError:
            self.readable = False
            self.body = {"unreadable": message.body[:200].decode("utf-8", "replace")}

    @property
    def channel_open(self) -> bool:
        """False once the channel it came on has closed: the broker has then returned the
        message by itself, and a copy handed back would be a second one."""
        return not self._message.channel.is_closed

    @property
    def deliveries(self) -> int:
        """Which delivery this is, 1 for the first (quorum queues count the earlier ones; a
        copy handed back at a graceful stop carries its original's count in a header)."""
        counted = int(self.headers.get("x-delivery-count", 0) or 0)
        return counted + int(self.headers.get(PRIOR_DELIVERIES_HEADER, 0) or 0) + 1

    def handed_back(self) -> Outgoing:
        """This message as a fresh copy, to publish before acknowledging the original: a
        stopping worker's way to return a message without spending one of its deliveries (a
        quorum queue counts every return toward x-delivery-limit — a reject, a nack, and the
        unacknowledged messages of a closed channel alike — so plain returns at every restart
        would dead-letter healthy messages). The deliveries it had spent go along."""
        headers = {
            k: v
            for k, v in self.headers.items()
            if k != "x-delivery-count" and not k.startswith(("x-death", "x-first-death"))
        }
        headers[PRIOR_DELIVERIES_HEADER] = self.deliveries - 1
        return Outgoing(
            message_id=self.message_id, stage=self.stage, body=self.body, headers=headers
        )

    async def ack(self) -> bool:
        """False when the channel went away meanwhile (the broker redelivers the message), or
        when the message was settled already (handed back by a stopping worker)."""
        return await self._settle(lambda: self._message.ack())

    async def requeue(self) -> bool:
        # reject, not nack: from RabbitMQ 4.3 a nack no longer counts toward the delivery limit
        return await self._settle(lambda: self._message.reject(requeue=True))

    async def _settle(self, call: Callable[[], Awaitable[None]]) -> bool:
        if self.settled:
            return False
        self.settled = True
        try:
            await call()
        except Exception:  # a closed channel: settled by the broker's redelivery instead
            return False
        return True


Handler = Callable[[Delivery], Awaitable[None]]


# AMQP heartbeats: the client declares the broker gone after three missed ones (aiormq's
# grace), so a broker that goes silent — accepting, never answering — is noticed in ~30 s. The
# broker's default (60 s) would take three minutes. A URL that names its own keeps it.
AMQP_HEARTBEAT_SECONDS = 10


def with_heartbeat(url: str) -> str:
    """``url`` with ``heartbeat=AMQP_HEARTBEAT_SECONDS`` unless it sets one."""
    parts = urlsplit(url)
    if any(key == "heartbeat" for key, _ in parse_qsl(parts.query, keep_blank_values=True)):
        return url
    query = "&".join(q for q in (parts.query, f"heartbeat={AMQP_HEARTBEAT_SECONDS}") if q)
    return urlunsplit(parts._replace(query=query))


class PipelineBroker:
    """One robust connection; a confirming channel to publish, one channel per consumed stage."""

    def __init__(self, url: str, *, prefix: str, max_deliveries: int) -> None:
        self.url = with_heartbeat(url)
        self.prefix = prefix
        self.max_deliveries = max_deliveries
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None
        self._dlx: Any = None
        self._lock = asyncio.Lock()

    def queue_name(self, stage: str) -> str:
        return f"{self.prefix}.{stage}"

    def dlq_name(self, stage: str) -> str:
        return f"{self.prefix}.{stage}.dlq"

    def stage_arguments(self, stage: str) -> dict[str, str | int]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.max_deliveries,
            "x-dead-letter-exchange": f"{self.prefix}.dlx",
            "x-dead-letter-routing-key": stage,
            "x-dead-letter-strategy": "at-least-once",
            # not a length bound (the queue has none: admission bounds the work in PostgreSQL);
            # RabbitMQ keeps at-least-once dead-lettering only with reject-publish overflow,
            # and quietly falls back to at-most-once under the default drop-head
            "x-overflow": "reject-publish",
        }

    async def connect(self) -> None:
        """Connect (again, if the connection was lost) and declare the topology."""
        async with self._lock:
            connection = self._connection
            if (
                self._channel is not None
                and not self._channel.is_closed
                and connection is not None
                and connection.connected.is_set()
            ):
                return
            await self._drop()
            import aio_pika

            where = self.url.split("@")[-1]
            connection = None
            try:
                async with asyncio.timeout(DECLARE_TIMEOUT_SECONDS):
                    connection = await aio_pika.connect(self.url, timeout=10)
                    channel = await connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
            except Exception as exc:
                # a connection whose channel failed is closed here, not left to the collector
                await _close_quietly(connection)
                raise QueueUnavailableError(f"cannot reach RabbitMQ at {where}: {exc}") from exc
            self._connection = connection
            try:
                await self._declare(channel)
            except aio_pika.exceptions.ChannelPreconditionFailed as exc:
                await self._drop()
                raise ConfigError(
                    f"RabbitMQ at {where}: a {self.prefix}.* queue exists with other arguments"
                    f" ({exc}); NEWS_MAX_DELIVERIES or NEWS_QUEUE_PREFIX changed? Drain and"
                    " delete the old queues, or keep the old setting"
                ) from exc
            except Exception as exc:
                await self._drop()
                raise QueueUnavailableError(f"RabbitMQ at {where}: {exc}") from exc
            self._channel = channel

    async def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        await _close_quietly(connection)

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
            # classic and durable: a letter is returned to it each time it is listed, and a
            # quorum queue's delivery limit (20 by default since RabbitMQ 4) would drop it
            dlq = await channel.declare_queue(self.dlq_name(stage), durable=True)
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
            await self._drop()  # the next publish connects afresh
            raise QueueError(
                f"RabbitMQ did not confirm {len(messages)} message(s) within"
                f" {PUBLISH_TIMEOUT_SECONDS:g} s (unreachable or reconnecting)"
            ) from exc
        except Exception as exc:
            await self._drop()
            raise QueueError(f"could not publish to {self.prefix}: {exc}") from exc

    def consumers(self, handlers: dict[str, Handler], prefetch: dict[str, int]) -> StageConsumers:
        """Consumers of ``handlers``' stages, each stage on its own channel with its own
        ``prefetch`` (RabbitMQ's QoS is per channel)."""
        return StageConsumers(self, handlers, prefetch)

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
        self,
        stage: str,
        take: Callable[[DeadLetter], Awaitable[bool]] | None = None,
        *,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """Every dead letter of ``stage`` (the first ``limit``: a page lists and acts on a
        bounded number). With ``take``, each one for which it returns True is removed from the
        queue (after ``take`` did its work); the others stay."""
        await self.connect()
        channel = await self._connection.channel()
        found: list[DeadLetter] = []
        try:
            queue = await channel.declare_queue(self.dlq_name(stage), passive=True)
            # every message is held (unacked) until the channel closes, so each is seen once
            while (limit is None or len(found) < limit) and (
                message := await queue.get(no_ack=False, fail=False, timeout=5)
            ) is not None:
                letter = _dead_letter(stage, Delivery(stage, message))
                found.append(letter)
                if take is not None and await take(letter):
                    await message.ack()
        finally:
            await channel.close()  # returns what was not taken to the queue
        return found

    async def delete_topology(self) -> None:
        """Delete every queue and exchange of this prefix, messages and all (tests and
        benchmarks clean up with it; an operator retiring a prefix could too)."""
        import aio_pika

        await self._drop()
        # a connection of its own, declaring nothing: the queues may carry other arguments
        connection = await aio_pika.connect(self.url, timeout=10)
        try:
            channel = await connection.channel()
            for stage in STAGES:
                await channel.queue_delete(self.queue_name(stage))
                await channel.queue_delete(self.dlq_name(stage))
            await channel.exchange_delete(self.prefix)
            await channel.exchange_delete(f"{self.prefix}.dlx")
        finally:
            await connection.close()

    async def close(self) -> None:
        await self._drop()


class StageConsumers:
    """Consume stages on a connection of their own, one channel (and prefetch) per stage, and
    connect again (with backoff) whenever it is lost — a broker restart, a cut connection —
    until told to stop. Messages held when the connection went are redelivered by the broker;
    their late acks fail harmlessly."""

    def __init__(
        self, broker: PipelineBroker, handlers: dict[str, Handler], prefetch: dict[str, int]
    ):
        missing = sorted(set(handlers) - set(prefetch))
        if missing:
            raise ValueError(f"no prefetch for stage(s) {missing}")
        self._broker = broker
        self._handlers = handlers
        self._prefetch = prefetch
        self._connection: Any = None
        self._consuming: list[tuple[Any, str]] = []
        self.connections = 0  # how many times it (re)connected

    async def run(self, stop: asyncio.Event, on_event: Callable[[str, str], None]) -> None:
        """Until ``stop``: then every consumer is cancelled (basic.cancel: the broker sends
        no more), and the connection stays open so the messages in hand can still be
        acknowledged (``close`` ends it, returning what is still unacknowledged)."""
        backoff = 1.0
        while not stop.is_set():
            try:
                await self._connect()
            except Exception as exc:
                on_event("news.broker_unavailable", f"{exc}; retrying in {backoff:g} s")
                await _wait(stop, backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            on_event("news.broker_connected", f"consuming {sorted(self._handlers)}")
            while not stop.is_set() and self._alive():
                await _wait(stop, 0.5)
            if not stop.is_set():
                on_event("news.broker_connection_lost", "reconnecting")
        for queue, tag in self._consuming:
            try:
                await queue.cancel(tag)
            except Exception:  # the channel is gone: nothing more comes from it anyway
                pass
        self._consuming.clear()

    def _alive(self) -> bool:
        # ``is_closed`` only turns on an explicit close; a lost transport clears ``connected``
        # and a channel the broker closed (a consumer ack timeout) is a reason to start over
        connection = self._connection
        return (
            connection is not None
            and connection.connected.is_set()
            and not connection.is_closed
            and not any(queue.channel.is_closed for queue, _ in self._consuming)
        )

    async def _connect(self) -> None:
        import aio_pika

        await self.close()
        await self._broker.connect()  # the topology exists before anyone consumes it
        self._connection = await aio_pika.connect(self._broker.url, timeout=10)
        self.connections += 1
        for stage, handler in self._handlers.items():
            channel = await self._connection.channel()
            await channel.set_qos(prefetch_count=self._prefetch[stage])
            queue = await channel.declare_queue(
                self._broker.queue_name(stage),
                durable=True,
                arguments=self._broker.stage_arguments(stage),
            )
            tag = await queue.consume(_deliver(stage, handler), no_ack=False)
            self._consuming.append((queue, tag))

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._consuming.clear()
        await _close_quietly(connection)


async def _close_quietly(connection: Any) -> None:
    """Close a connection being dropped, most often because it broke: its own failure to close
    is no news."""
    if connection is not None and not connection.is_closed:
        with contextlib.suppress(Exception):
            await connection.close()


def _deliver(stage: str, handler: Handler) -> Callable[[Any], Awaitable[None]]:
    async def on_message(message: Any) -> None:
        await handler(Delivery(stage, message))

    return on_message


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


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
