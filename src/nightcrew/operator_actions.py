"""What an operator does to the crew's work — re-drive or drop an effect, replay or purge a
dead letter, enable a source, run a lane or a shard now — once, for both doors: the command
line (`effects retry`, `news dlq replay`, …) and the dashboard's buttons call these same
functions. Each action is remembered in ``nightcrew.actions`` (what, which ids, from where), so
the pages show who did what; the dashboard's also log ``dashboard_action``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from nightcrew import runs
from nightcrew.clock import Clock
from nightcrew.db.database import Database, json_param
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import Jsonable, JsonObject
from nightcrew.log import event
from nightcrew.runtime import Runtime

if TYPE_CHECKING:
    from nightcrew.effects.outbox import Dropped
    from nightcrew.news.sources.registry import Source as FeedSource

SQL = load_queries(__file__)

Source = Literal["dashboard", "cli"]
# One request re-drives at most this many effects: a click never holds a page (nor the
# outbox's rows) for long, and the page says how many are left for the next click.
BULK_RETRY_LIMIT = 100
# A stage's replay from the page takes at most this many letters per click, for the same reason.
BULK_REPLAY_LIMIT = 100
# Actions shown on a page: the newest few, never the whole log.
RECENT_ACTIONS = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Actor:
    """Who acts: the dashboard (with the client's address) or the command line."""

    source: Source
    client: str | None = None

    @property
    def label(self) -> str:
        """As a run's ``requested_by`` shows it: "dashboard 127.0.0.1", "cli"."""
        return f"{self.source} {self.client}" if self.client else self.source


CLI = Actor(source="cli")


async def record(
    db: Database,
    now: datetime,
    actor: Actor,
    *,
    action: str,
    target: str,
    ids: Sequence[object] = (),
    outcome: JsonObject | None = None,  # stored with the action, as its page shows it
) -> None:
    shown = [str(i) for i in ids]
    await db.execute(
        SQL["record_action"],
        {
            "at": now,
            "source": actor.source,
            "action": action,
            "target": target,
            "ids": shown,
            "client": actor.client,
            "outcome": json_param(outcome or {}),
        },
    )
    if actor.source == "dashboard":
        event(
            "dashboard_action",
            action=action,
            target=target,
            ids=shown,
            client=actor.client,
            outcome=outcome or {},
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RecentAction:
    """A row of recent_actions: one remembered action."""

    id: int
    at: datetime
    source: Source
    action: str
    target: str
    ids: list[str]
    client: str | None
    outcome: JsonObject


async def recent(
    db: Database, *, actions: Sequence[str], limit: int = RECENT_ACTIONS
) -> list[RecentAction]:
    """The newest actions of these kinds, newest first."""
    return await db.fetch_as(
        RecentAction, SQL["recent_actions"], {"actions": list(actions), "limit": limit}
    )


# --- effects -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class EffectRetried(Jsonable):
    """One re-driven effect, as ``effects retry --json`` prints it."""

    id: int
    kind: str
    key: str
    outcome: str  # "pending" (due now; the drain attempts it), or a delivery's status
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryResult:
    retried: list[EffectRetried]
    remaining: int  # dead effects a bulk retry of the same kind would still re-drive


async def retry_effects(
    runtime: Runtime,
    clock: Clock,
    actor: Actor,
    *,
    ids: Sequence[int] = (),
    all_dead: bool = False,
    kind: str | None = None,
    limit: int | None = None,
    deliver: bool = True,
) -> RetryResult:
    """Make undelivered effects due now with a fresh maximum age (``ids``, or every dead one
    of ``kind`` — at most ``limit``, the oldest first); with ``deliver``, attempt them at once.

    The dashboard does not deliver in the request: a click answers at once, and the minute
    lane's drain delivers within a minute (its backoff and time budget apply)."""
    from nightcrew.effects import outbox
    from nightcrew.effects.deliver import deliver_now

    effects = await outbox.retry(
        runtime.db, clock.now(), ids=ids, all_dead=all_dead, kind=kind, limit=limit
    )
    if deliver:
        deliveries = await deliver_now(runtime, clock, effects)
        retried = [
            EffectRetried(id=e.id, kind=e.kind, key=e.key, outcome=d.status, error=d.error)
            for e, d in zip(effects, deliveries, strict=True)
        ]
    else:
        retried = [
            EffectRetried(id=e.id, kind=e.kind, key=e.key, outcome="pending") for e in effects
        ]
    for r in retried:
        event(
            "effect_retried",
            effect_id=r.id,
            kind=r.kind,
            key=r.key,
            outcome=r.outcome,
            error=r.error,
        )
    remaining = await outbox.count_retryable_dead(runtime.db, kind) if all_dead else 0
    if retried:
        await record(
            runtime.db,
            clock.now(),
            actor,
            action="effects.retry_dead" if all_dead else "effects.retry",
            target=kind or ("every kind" if all_dead else retried[0].kind),
            ids=[r.id for r in retried],
            outcome={"retried": len(retried), "remaining": remaining},
        )
    return RetryResult(retried=retried, remaining=remaining)


async def drop_effect(db: Database, clock: Clock, actor: Actor, effect_id: int) -> Dropped | None:
    """Forget an undelivered effect for good; what it was (None: no such effect at rest)."""
    from nightcrew.effects import outbox

    dropped = await outbox.drop(db, effect_id, clock.now())
    if dropped is not None:  # the row is gone: the log and the actions keep what it was
        event(
            "effect_dropped",
            kind=dropped.kind,
            key=dropped.key,
            payload=dropped.payload,
            attempts=dropped.attempts,
            last_error=dropped.last_error,
            dead_at=dropped.dead_at,
            effect_id=effect_id,
        )
        await record(
            db,
            clock.now(),
            actor,
            action="effects.drop",
            target=dropped.kind,
            ids=[effect_id],
            outcome={"key": dropped.key},
        )
    return dropped


# --- news ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class LettersDone:
    """What a replay or a purge did, by message id."""

    replayed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # its candidate no longer waits
    kept: list[str] = field(default_factory=list)  # unreadable: names nothing to replay
    purged: list[str] = field(default_factory=list)

    @property
    def touched(self) -> int:
        return len(self.replayed) + len(self.dropped) + len(self.kept) + len(self.purged)


async def replay_letters(
    runtime: Runtime,
    clock: Clock,
    actor: Actor,
    *,
    stage: str | None = None,
    message_id: str | None = None,
    limit: int | None = None,
) -> LettersDone:
    """Queue dead letters again: ``message_id``, or every letter of ``stage`` (None: all) —
    at most ``limit`` of each stage's letters, the oldest first."""
    from nightcrew.news.engines.pipeline.dlq import replay

    done = await replay(runtime, clock, stage=stage, message_id=message_id, limit=limit)
    result = LettersDone(
        replayed=[x.message_id for x in done.replayed],
        dropped=[x.message_id for x in done.dropped],
        kept=[x.message_id for x in done.kept],
    )
    if result.replayed or result.dropped:
        await record(
            runtime.db,
            clock.now(),
            actor,
            action="news.dlq_replay",
            target=stage or "every stage",
            ids=[*result.replayed, *result.dropped],
            outcome={"replayed": len(result.replayed), "dropped": len(result.dropped)},
        )
    return result


async def purge_letters(
    runtime: Runtime,
    clock: Clock,
    actor: Actor,
    *,
    stage: str,
    message_id: str | None = None,
) -> LettersDone:
    """Drop dead letters for good (their candidates are rejected with the letter's error):
    ``message_id`` of ``stage``, or every letter of it."""
    from nightcrew.news.engines.pipeline.dlq import purge

    gone = await purge(runtime, clock, stage, message_id=message_id)
    result = LettersDone(purged=[x.message_id for x in gone])
    if result.purged:
        await record(
            runtime.db,
            clock.now(),
            actor,
            action="news.dlq_purge",
            target=stage,
            ids=result.purged,
            outcome={"purged": len(result.purged)},
        )
    return result


async def set_source_enabled(
    db: Database, clock: Clock, actor: Actor, ref: str, *, enabled: bool
) -> FeedSource:
    """Enable (un-park, failures cleared, due now) or disable a source by id or feed URL."""
    from nightcrew.news.sources.registry import set_enabled

    source = await set_enabled(db, ref, enabled=enabled)
    await record(
        db,
        clock.now(),
        actor,
        action="news.source_enable" if enabled else "news.source_disable",
        target=str(source.shard),
        ids=[source.id],
        outcome={"name": source.name},
    )
    return source


# --- runs ----------------------------------------------------------------------------------------
OnStarted = Callable[[runs.RunHandle], None]


async def run_lane_now(
    runtime: Runtime,
    clock: Clock,
    actor: Actor,
    lane: str,
    *,
    on_started: OnStarted | None = None,
    progress: Any = None,
) -> JsonObject:
    """A manual run of a lifecycle lane (``daily``, ``minute``) or a news shard (``news:S``):
    exclusive of the lane's other runs (runs.LaneBusy when one runs; no scheduled slot is
    claimed while it runs), recorded with who asked. Its report, as JSON."""
    from nightcrew.lifecycle.lanes import run_lane
    from nightcrew.news.schedule import run_shard_now

    if lane.startswith("news:"):
        news = await run_shard_now(
            runtime,
            clock,
            lane.removeprefix("news:"),
            requested_by=actor.label,
            on_started=on_started,
        )
        assert news is not None  # manual runs always run
        return news.to_json()
    report = await run_lane(
        runtime, clock, lane, requested_by=actor.label, on_started=on_started, progress=progress
    )
    assert report is not None  # manual runs always run
    return report.to_json()
