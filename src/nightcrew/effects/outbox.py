"""The effects outbox: record an effect in the caller's transaction, claim it, settle it.

An effect is owed the moment the state change that owes it commits, so it is written in that
same transaction: a crash between the commit and the send loses nothing. Claims are
conditional and leased (``next_attempt_at`` moves past the delivery's time limit), so across
any number of replicas one effect has at most one delivery in flight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Literal, TypeVar

from nightcrew.db.database import Database, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import Jsonable, JsonObject, named

SQL = load_queries(__file__)

# An effect's kind names its payload record and the handler that delivers it: ``queue`` and
# ``mail`` are built in (deliver.py), the domains register theirs at assembly (assembly.py).
Kind = str

# Retries: 30 s doubling to a cap of 30 min, each delay scaled by a jitter in [0.8, 1.2).
RETRY_BASE_SECONDS = 30
RETRY_CAP_SECONDS = 30 * 60
# An effect not confirmed within its kind's maximum age (its payload's ``max_age``) is given
# up (dead, 'expired'). Emails and Stripe calls stop inside the 24-hour window in which Resend
# and Stripe honour an idempotency key, so a retry is never a second email or a second billing
# change. Queue messages (consumers drop a duplicate by its effect_id) and feed invalidations
# (idempotent) are bound by no such window: they keep trying for a week.
EFFECT_MAX_AGE = timedelta(hours=20)
IDEMPOTENT_EFFECT_MAX_AGE = timedelta(days=7)
# A claim's lease: longer than a claim can stay in flight (a delivery starts within the drain's
# or the first attempt's time budget and takes at most DELIVERY_TIMEOUT_SECONDS, see
# deliver.py), so no second delivery starts while one is in flight. It is also how long an
# attempt cut short by a crash waits before the drain takes it again.
CLAIM_LEASE = timedelta(minutes=5)


# --- payloads: what an effect of each kind carries ----------------------------------------------
class EffectPayload(Jsonable):
    """An effect's payload as its kind's record: ``kind`` and ``max_age`` say which effects it
    is and how long they are tried. The stored members are snake_case (they always were, and
    the drain reads payloads stored by earlier builds), so a two-word field names itself with
    ``named``."""

    __slots__ = ()
    kind: ClassVar[Kind]
    max_age: ClassVar[timedelta]

    def to_json(self) -> JsonObject:
        # An optional member left unset is not written: no payload ever carried one as null.
        return {name: value for name, value in super().to_json().items() if value is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class QueuePayload(EffectPayload):
    """A message: ``body`` (with ``effect_id`` added) sent on ``queue``; ``fallback_invalidate``
    is the podcast whose feed the feed worker's endpoint invalidates when the queue refuses."""

    kind: ClassVar[Kind] = "queue"
    max_age: ClassVar[timedelta] = IDEMPOTENT_EFFECT_MAX_AGE
    queue: str
    body: JsonObject  # the message as its consumer reads it (PodcastInvalidation, …)
    delay_seconds: int | None = named("delay_seconds", default=None)
    fallback_invalidate: str | None = named("fallback_invalidate", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class MailPayload(EffectPayload):
    """An email, sent with the effect's key as its Idempotency-Key."""

    kind: ClassVar[Kind] = "mail"
    max_age: ClassVar[timedelta] = EFFECT_MAX_AGE
    to: str
    subject: str
    text: str
    html: str


P = TypeVar("P", bound=EffectPayload)


@dataclass(frozen=True, kw_only=True, slots=True)
class Effect:
    """A row of nightcrew.effects."""

    id: int
    kind: Kind
    key: str
    payload: JsonObject  # as stored; ``read`` gives its kind's record
    created_at: datetime
    expires_at: datetime
    attempts: int = 0
    last_error: str | None = None
    delivered_at: datetime | None = None
    dead_at: datetime | None = None
    dead_reason: str | None = None
    claimed_until: datetime | None = None

    @property
    def settled(self) -> bool:
        return self.delivered_at is not None or self.dead_at is not None

    @property
    def expired(self) -> bool:
        """Given up only because it was not confirmed in time (not because it cannot work)."""
        return self.dead_reason == "expired"

    def read(self, payload: type[P]) -> P:
        """The payload as ``payload``, the record of this effect's kind."""
        if payload.kind != self.kind:
            raise TypeError(f"effect {self.id} is a {self.kind} effect, not a {payload.kind} one")
        return payload.from_json(self.payload)

    def to_json(self) -> JsonObject:
        # `effects list --json`: the columns as they are named, times as ISO 8601 text, and no
        # claim (a lease is not the operator's business)
        return {
            "id": self.id,
            "kind": self.kind,
            "key": self.key,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "delivered_at": self.delivered_at.isoformat() if self.delivered_at else None,
            "dead_at": self.dead_at.isoformat() if self.dead_at else None,
            "dead_reason": self.dead_reason,
        }


async def record(
    tx: Database | Tx,
    *,
    key: str,
    payload: EffectPayload,
    now: datetime,
    held_until: datetime | None = None,
) -> Effect:
    """Owe an effect of the payload's kind, inside the caller's transaction. The same (kind,
    key) twice is one effect: the second call returns the first one's row, delivered or not.
    ``held_until``: not due before then unless ``release``d sooner (what must wait for other
    work first)."""
    due = held_until or now
    effect = await tx.fetch_one_as(
        Effect,
        SQL["record"],
        {
            "kind": payload.kind,
            "key": key,
            "payload": json_param(payload.to_json()),
            "now": now,
            "due": due,
            "expires_at": due + payload.max_age,
        },
    )
    if effect is None:
        effect = await tx.fetch_one_as(Effect, SQL["by_key"], {"kind": payload.kind, "key": key})
        assert effect is not None  # the conflicting row exists: it is what stopped the insert
    return effect


async def release(db: Database | Tx, ids: Sequence[int], now: datetime) -> list[Effect]:
    """Held effects among ``ids`` made due now; those released (one in flight, settled or
    already due is left as it is)."""
    if not ids:
        return []
    return await db.fetch_as(Effect, SQL["release"], {"ids": list(ids), "now": now})


async def claim_due(
    db: Database, now: datetime, *, limit: int, kinds: Sequence[str] | None = None
) -> list[Effect]:
    return await db.fetch_as(
        Effect,
        SQL["claim_due"],
        {
            "now": now,
            "lease_until": now + CLAIM_LEASE,
            "limit": limit,
            "kinds": list(kinds) if kinds is not None else None,
        },
    )


async def claim_ids(db: Database, ids: Sequence[int], now: datetime) -> list[Effect]:
    if not ids:
        return []
    return await db.fetch_as(
        Effect,
        SQL["claim_ids"],
        {"ids": list(ids), "now": now, "lease_until": now + CLAIM_LEASE},
    )


Settlement = Literal["delivered", "retry", "permanent", "expired", "released"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Settle:
    effect_id: int
    claimed_until: datetime | None  # the claim that made the attempt
    outcome: Settlement
    next_attempt_at: datetime | None = None
    error: str | None = None
    # settled without a send (its window closed while it waited): the claim's attempt is not one
    unsent: bool = False


async def settle(db: Database, settles: Sequence[Settle], now: datetime) -> None:
    """Record a batch of outcomes in one statement."""
    if not settles:
        return
    await db.execute(
        SQL["settle"],
        {
            "now": now,
            "ids": [s.effect_id for s in settles],
            "outcomes": [s.outcome for s in settles],
            "next_at": [s.next_attempt_at for s in settles],
            "errors": [s.error for s in settles],
            "claims": [s.claimed_until for s in settles],
            "unsent": [s.unsent for s in settles],
        },
    )


def retry_delay(effect_id: int, attempts: int) -> timedelta:
    """Backoff after ``attempts`` failed attempts: 30 s, 60 s, 120 s, … capped at 30 min, with
    a jitter derived from the effect and the attempt, so replicas and effects that failed
    together spread out, and a test can predict it."""
    base = min(RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0), RETRY_CAP_SECONDS)
    digest = hashlib.blake2b(f"{effect_id}:{attempts}".encode(), digest_size=2).digest()
    jitter = 0.8 + 0.4 * int.from_bytes(digest, "big") / 65536
    return timedelta(seconds=base * jitter)


@dataclass(frozen=True, kw_only=True, slots=True)
class _KindCounts:
    kind: str
    pending: int
    dead: int


async def counts(db: Database, kinds: Iterable[Kind]) -> dict[str, dict[str, int]]:
    """``{kind: {"pending": n, "dead": m}}`` for every kind of ``kinds``, zeros included (and
    any other kind the table holds)."""
    out: dict[str, dict[str, int]] = {kind: {"pending": 0, "dead": 0} for kind in kinds}
    async with db.transaction() as tx:
        # Right after a large backlog is drained, and until autoanalyze catches up, the planner
        # still believes most rows undelivered and scans the whole table (20-60 ms at 1M rows,
        # bench.effects); the partial index is always the right plan for this query.
        await tx.execute("SET LOCAL enable_seqscan = off")
        found = await tx.fetch_as(_KindCounts, SQL["counts"])
    for one in found:
        out[one.kind] = {"pending": int(one.pending), "dead": int(one.dead)}
    return out


async def list_undelivered(
    db: Database, *, kind: str | None = None, dead: bool | None = None, limit: int = 1000
) -> list[Effect]:
    return await db.fetch_as(Effect, SQL["list"], {"kind": kind, "dead": dead, "limit": limit})


async def get(db: Database, effect_id: int) -> Effect | None:
    return await db.fetch_one_as(Effect, SQL["get"], {"id": effect_id})


async def retry(
    db: Database,
    now: datetime,
    *,
    ids: Sequence[int] = (),
    all_dead: bool = False,
    kind: str | None = None,
    limit: int | None = None,
) -> list[Effect]:
    """Make undelivered effects due now, with a fresh maximum age; returns what was re-driven
    (at most ``limit``, the oldest first), as the update left it."""
    return await db.fetch_as(
        Effect,
        SQL["retry"],
        {
            "ids": list(ids),
            "all_dead": all_dead,
            "kind": kind,
            "now": now,
            "limit": limit,
        },
    )


async def count_retryable_dead(db: Database, kind: str | None = None) -> int:
    """Dead effects a bulk retry (``--dead [--kind K]``) would re-drive."""
    return await db.fetch_count(SQL["count_retryable_dead"], {"kind": kind})


async def supersede(
    tx: Database | Tx,
    *,
    kind: Kind,
    now: datetime,
    reason: str,
    keys: Sequence[str] = (),
    patterns: Sequence[str] = (),
) -> int:
    """Give up undelivered effects that a later state change made wrong to deliver (by exact
    key, or by LIKE pattern); one in flight is left to finish. How many were given up."""
    return await tx.execute(
        SQL["supersede"],
        {
            "kind": kind,
            "now": now,
            "reason": reason,
            "keys": list(keys),
            "patterns": list(patterns),
        },
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Dropped:
    """What a dropped effect was (its row is gone)."""

    id: int
    kind: Kind
    key: str
    payload: JsonObject
    attempts: int
    last_error: str | None
    dead_at: datetime | None


async def drop(db: Database, effect_id: int, now: datetime) -> Dropped | None:
    """Forget an undelivered effect for good (not one in flight); returns what it was."""
    return await db.fetch_one_as(Dropped, SQL["drop"], {"id": effect_id, "now": now})


async def purge_delivered(db: Database, before: datetime, *, limit: int) -> int:
    return await db.execute(SQL["purge_delivered"], {"before": before, "limit": limit})
