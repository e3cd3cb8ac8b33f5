"""Queue producers: ``send(queue, body, delay_seconds=0)`` behind one interface.

``postgres`` (the default) appends to ``nightcrew.queue_messages``; the message becomes visible
to consumers at ``now + delay``. A RabbitMQ producer drops in behind the same Protocol.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from nightcrew.clock import Clock
from nightcrew.db.database import Database, json_param
from nightcrew.errors import NightcrewError, QueueError

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
        except NightcrewError as exc:  # a refused statement, or the database gone
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
