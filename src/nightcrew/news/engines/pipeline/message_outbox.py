"""The pipeline's outbox: PostgreSQL holds every candidate's stage and state
(``news.candidates``); a broker message only says "work on this now". Whatever owes a message
writes it to ``news.outbox`` in the same transaction as the state change that owes it; after
the commit it is published (confirmed) and deleted (``send_owed``), and the relay publishes
what a crash or an absent broker left behind (``relay``) — so nothing is lost between the
database and the broker, and a message sent twice finds its work done.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from nightcrew.adapters.broker import Outgoing, PipelineBroker
from nightcrew.db.database import Database, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import ConfigError, QueueError
from nightcrew.jsonable import JsonObject
from nightcrew.log import describe_error, event, warning
from nightcrew.news.engines.pipeline.messages import FetchSource, WorkOn
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

RELAY_GRACE = timedelta(seconds=10)  # the publisher's own fast path gets this long first
RELAY_BATCH = 500
RESEND_BATCH = 500


def broker_of(runtime: Runtime) -> PipelineBroker:
    broker = runtime.news_adapters().pipeline
    if broker is None:
        raise ConfigError("the news pipeline needs NEWS_PIPELINE=rabbitmq and QUEUE_URL=amqp://…")
    return broker


@dataclass(frozen=True, kw_only=True, slots=True)
class Owed:
    """A message owed to the broker: a row of ``news.outbox`` (every statement that writes one
    returns it so)."""

    id: int
    message_id: UUID
    stage: str
    body: JsonObject  # a FetchSource's or a WorkOn's JSON (``messages``)


def outgoing(rows: list[Owed]) -> list[Outgoing]:
    return [Outgoing(message_id=str(r.message_id), stage=r.stage, body=dict(r.body)) for r in rows]


async def send_owed(broker: PipelineBroker, db: Database, rows: list[Owed]) -> int:
    """Publish outbox rows just committed, then delete them. A broker that refuses leaves them
    for the relay: nothing is lost, the caller goes on. How many were sent (-1: refused)."""
    if not rows:
        return 0
    try:
        await broker.publish(outgoing(rows))
    except QueueError as exc:
        warning("news.outbox.publish_deferred", messages=len(rows), error=describe_error(exc))
        return -1
    await db.execute(SQL["delete_sent"], {"ids": [r.id for r in rows]})
    return len(rows)


async def relay(broker: PipelineBroker, db: Database, now: datetime) -> int:
    """Publish whatever the outbox still holds from before ``now - RELAY_GRACE`` (a crash
    between commit and publish, a broker that was away). Rows are locked while published, so
    relays on many workers share the work."""
    sent = 0
    while True:
        async with db.transaction() as tx:
            rows = await tx.fetch_as(
                Owed, SQL["unsent"], {"before": now - RELAY_GRACE, "limit": RELAY_BATCH}
            )
            if not rows:
                return sent
            await broker.publish(outgoing(rows))
            await tx.execute(SQL["delete_sent"], {"ids": [r.id for r in rows]})
        sent += len(rows)
        event("news.outbox.relayed", messages=len(rows))
        if len(rows) < RELAY_BATCH:
            return sent


# --- what was admitted, sent again ----------------------------------------------------------------
async def resend_due(db: Database, now: datetime, *, shard: str | None = None) -> list[Owed]:
    """Admitted candidates (of ``shard``, or of every shard) held for a backoff or a lease held
    elsewhere, whose wait is over, queued again with a fresh message — every worker's
    housekeeping does it, so a retry goes within seconds, and a pass for its shard. Admission is
    not asked again: they were admitted. The outbox rows to send."""
    owed: list[Owed] = []
    while True:
        rows = await db.fetch_as(
            Owed, SQL["resend_due"], {"now": now, "limit": RESEND_BATCH, "shard": shard}
        )
        owed += rows
        if len(rows) < RESEND_BATCH:
            return owed


async def enqueue(tx: Tx, *, stage: str, url: str, shard: str, now: datetime) -> list[Owed]:
    """One candidate's message to ``stage``, owed in ``tx``: the outbox rows to send once it
    commits."""
    return await _owe(tx, stage, WorkOn(url=url, shard=shard), now)


async def enqueue_fetch(tx: Tx, *, source_id: int, shard: str, now: datetime) -> list[Owed]:
    """One source's fetch message, owed in ``tx`` (a replayed letter's)."""
    return await _owe(tx, "fetch", FetchSource(source_id=source_id, shard=shard), now)


async def _owe(tx: Tx, stage: str, message: FetchSource | WorkOn, now: datetime) -> list[Owed]:
    body = json_param(message.to_json())
    return await tx.fetch_as(Owed, SQL["enqueue"], {"stage": stage, "body": body, "now": now})
