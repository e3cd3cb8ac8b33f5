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
from typing import Any

from nightcrew.adapters.broker import DeadLetter
from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.log import event
from nightcrew.news.engines.pipeline import outbox
from nightcrew.runtime import Runtime
from nightcrew.setting_parsers import STAGES

SQL = load_queries(__file__)


def _stages(stage: str | None) -> tuple[str, ...]:
    return STAGES if stage is None else (stage,)


async def list_dead(
    runtime: Runtime, stage: str | None = None, *, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters of ``stage`` (None: every stage), at most ``limit`` of each."""
    broker = outbox.broker_of(runtime)
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
    broker, db = outbox.broker_of(runtime), runtime.db
    done = Replayed()

    async def take(letter: DeadLetter) -> bool:
        if message_id is not None and letter.message_id != message_id:
            return False
        if "source_id" not in letter.body and "url" not in letter.body:
            done.kept.append(letter)  # an unreadable body names nothing to replay
            return False
        now = clock.now()
        owed: list[dict[str, Any]] = []
        row: dict[str, Any] | None = None
        async with db.transaction() as tx:
            if "source_id" in letter.body:
                row = await tx.fetch_one(
                    SQL["requeue_source"], {"id": int(letter.body["source_id"]), "now": now}
                )
                if row is not None:
                    owed = await tx.fetch(
                        outbox.SQL["enqueue_fetch"],
                        {"source_id": row["id"], "shard": row["shard"], "now": now},
                    )
            elif "url" in letter.body:
                row = await tx.fetch_one(
                    SQL["requeue_candidate"], {"url": str(letter.body["url"]), "now": now}
                )
                if row is not None:  # else: written or rejected meanwhile, nothing owed
                    owed = await outbox.enqueue(
                        tx, stage=row["stage"], url=row["url"], shard=row["shard"], now=now
                    )
        await outbox.send_owed(broker, db, owed)
        if row is None:
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
    broker, db = outbox.broker_of(runtime), runtime.db
    purged: list[DeadLetter] = []

    async def take(letter: DeadLetter) -> bool:
        if message_id is not None and letter.message_id != message_id:
            return False
        if "source_id" in letter.body:
            await db.execute(SQL["purge_source"], {"id": int(letter.body["source_id"])})
        elif "url" in letter.body:
            await db.execute(
                SQL["purge_candidate"],
                {
                    "url": str(letter.body["url"]),
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
