"""The dead letters: list, replay (once the cause is fixed), purge.

A dead letter is a message some stage gave up on — at once for a failure that would only
happen again, or after NEWS_MAX_DELIVERIES attempts — and its candidate waits as ``dead`` (a
fetch: its source counted one failure). Replaying queues the candidate again — at the stage it
waits for, its attempts counted from none — with a fresh message through the outbox, then
removes the letter; a letter whose candidate no longer waits (written or rejected meanwhile, a
source deleted) is removed and reported as dropped, not replayed. Purging rejects the
candidate with the letter's error and removes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from nightcrew.adapters.broker import DeadLetter
from nightcrew.clock import Clock
from nightcrew.db.database import Tx
from nightcrew.db.queries import load_queries
from nightcrew.log import event
from nightcrew.news.engines.pipeline import message_outbox
from nightcrew.news.engines.pipeline.messages import FetchSource, WorkOn, named_by
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Source:
    """A replayed fetch's source, its fetch queued again (``requeue_source``)."""

    id: int
    shard: str


@dataclass(frozen=True, kw_only=True, slots=True)
class _Candidate:
    """A replayed candidate, queued again at the stage it waits for (``requeue_candidate``)."""

    url: str
    shard: str
    stage: str


def _named(letter: DeadLetter) -> FetchSource | WorkOn | None:
    """The source or candidate a letter's message names (None: unreadable, it names none)."""
    fetch = named_by(FetchSource, letter.body)
    return fetch if fetch is not None else named_by(WorkOn, letter.body)


async def _requeue(
    tx: Tx, message: FetchSource | WorkOn, now: datetime
) -> list[message_outbox.Owed] | None:
    """``message``'s source or candidate queued again, its new message owed in ``tx``; None
    when it no longer waits (written or rejected meanwhile, a source deleted)."""
    if isinstance(message, FetchSource):
        source = await tx.fetch_one_as(
            _Source, SQL["requeue_source"], {"id": message.source_id, "now": now}
        )
        if source is None:
            return None
        return await message_outbox.enqueue_fetch(
            tx, source_id=source.id, shard=source.shard, now=now
        )
    candidate = await tx.fetch_one_as(
        _Candidate, SQL["requeue_candidate"], {"url": message.url, "now": now}
    )
    if candidate is None:
        return None
    return await message_outbox.enqueue(
        tx, stage=candidate.stage, url=candidate.url, shard=candidate.shard, now=now
    )


def _stages(stage: str | None) -> tuple[str, ...]:
    return STAGES if stage is None else (stage,)


async def list_dead(
    runtime: Runtime, stage: str | None = None, *, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters of ``stage`` (None: every stage), at most ``limit`` of each."""
    broker = message_outbox.broker_of(runtime)
    letters: list[DeadLetter] = []
    for name in _stages(stage):
        letters += await broker.dead_letters(name, limit=limit)
    return letters


@dataclass
class Replayed:
    """What a replay did: the letters whose candidate (or source) went back to work, and those
    removed because theirs no longer waits for anything."""

    replayed: list[DeadLetter] = field(default_factory=list)
    dropped: list[DeadLetter] = field(default_factory=list)
    kept: list[DeadLetter] = field(default_factory=list)  # nothing to replay: left for purge


async def replay(
    runtime: Runtime,
    clock: Clock,
    *,
    stage: str | None = None,
    message_id: str | None = None,
    limit: int | None = None,
) -> Replayed:
    """Replay the letter ``message_id`` (None: every letter) of ``stage`` (None: every stage);
    of each stage, only the first ``limit`` letters are looked at (None: all)."""
    broker, db = message_outbox.broker_of(runtime), runtime.db
    done = Replayed()

    async def take(letter: DeadLetter) -> bool:
        if message_id is not None and letter.message_id != message_id:
            return False
        message = _named(letter)
        if message is None:
            done.kept.append(letter)  # an unreadable body names nothing to replay
            return False
        async with db.transaction() as tx:
            owed = await _requeue(tx, message, clock.now())
        await message_outbox.send_owed(broker, db, owed or [])
        if owed is None:
            done.dropped.append(letter)
            event("news.dlq_dropped", stage=letter.stage, message_id=letter.message_id)
        else:
            done.replayed.append(letter)
            event("news.dlq_replayed", stage=letter.stage, message_id=letter.message_id)
        return True

    for name in _stages(stage):
        await broker.dead_letters(name, take, limit=limit)
    return done


async def purge(
    runtime: Runtime, clock: Clock, stage: str, *, message_id: str | None = None
) -> list[DeadLetter]:
    """Purge the letter ``message_id`` of ``stage`` (None: every letter of it)."""
    broker, db = message_outbox.broker_of(runtime), runtime.db
    purged: list[DeadLetter] = []

    async def take(letter: DeadLetter) -> bool:
        if message_id is not None and letter.message_id != message_id:
            return False
        message = _named(letter)
        if isinstance(message, FetchSource):
            await db.execute(SQL["purge_source"], {"id": message.source_id})
        elif message is not None:
            await db.execute(
                SQL["purge_candidate"],
                {
                    "url": message.url,
                    "stage": stage,
                    "reason": f"purged from {broker.dlq_name(stage)}: {letter.error}",
                    "now": clock.now(),
                },
            )
        purged.append(letter)
        event("news.dlq_purged", stage=stage, message_id=letter.message_id)
        return True

    await broker.dead_letters(stage, take)
    return purged
