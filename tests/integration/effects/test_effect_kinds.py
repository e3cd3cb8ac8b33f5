"""The effects package knows no domain: a kind's delivery is its handler's, registered with the
runtime at assembly. Here ``billing_resume`` effects go through the real outbox, the real drain
and a real PostgreSQL, delivered by a handler of the test's own in place of the lifecycle's (a
new kind is a migration away: ``nightcrew.effects`` checks its kind against the known ones)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from nightcrew.assembly import effect_kinds
from nightcrew.cli.common import EffectKind
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.effects import outbox
from nightcrew.effects.deliver import (
    Delivery,
    EffectHandler,
    deliver_effects,
    delivered,
    handlers,
)
from nightcrew.effects.outbox import EFFECT_MAX_AGE, Effect
from nightcrew.lifecycle.billing_resume import BillingResumePayload
from nightcrew.runtime import Runtime


@dataclass
class Resumes:
    """The test's handler: the account ids of each attempt, in order."""

    attempts: list[list[str]]
    adopted: int = 0

    async def deliver(self, _rt: Runtime, effects: Sequence[Effect], _now: datetime) -> Delivery:
        self.attempts.append(sorted(e.read(BillingResumePayload).account_id for e in effects))
        return delivered(resumed=len(effects))

    async def adopt(self, _db: Database, _now: datetime) -> int:
        self.adopted += 1
        return 3

    def runtime(self, runtime: Runtime) -> Runtime:
        handler = EffectHandler(
            kind="billing_resume",
            deliver=self.deliver,
            together=lambda e: str(e.read(BillingResumePayload).podcast_id),
            adopt=self.adopt,
        )
        return replace(runtime, effect_handlers={"billing_resume": handler})


async def _owe(db: Database, now: datetime, account: str, podcast: str) -> Effect:
    async with db.transaction() as tx:
        return await outbox.record(
            tx,
            key=f"resume:{account}",
            payload=BillingResumePayload(account_id=account, podcast_id=podcast),
            now=now,
        )


async def _row(db: Database, effect_id: int) -> Effect:
    found = await outbox.get(db, effect_id)
    assert found is not None
    return found


async def test_a_kind_registered_with_the_runtime_is_delivered_by_its_handler_grouped(
    runtime: Runtime, db: Database, clock: FrozenClock
) -> None:
    resumes = Resumes(attempts=[])
    owed = [
        await _owe(db, clock.now(), "a", "p1"),
        await _owe(db, clock.now(), "b", "p1"),
        await _owe(db, clock.now(), "c", "p2"),
    ]
    assert owed[0].expires_at == clock.now() + EFFECT_MAX_AGE  # the payload's max_age
    report = await deliver_effects(resumes.runtime(runtime), clock)
    # one attempt per group its handler names: a and b together, c alone
    assert sorted(resumes.attempts) == [["a", "b"], ["c"]]
    assert report.delivered == 3 and report.dead == 0
    assert report.adopted == 3 and resumes.adopted == 1  # its adopt hook ran before the drain
    # the gauges count the kinds this runtime delivers: built in, and the one registered
    assert set(report.pending) == {"queue", "mail", "billing_resume"}
    assert report.pending["billing_resume"] == 0
    rows = [await _row(db, e.id) for e in owed]
    assert all(row.delivered_at is not None for row in rows)


async def test_a_process_without_the_handler_leaves_the_effect_owed_for_one_that_has_it(
    runtime: Runtime, db: Database, clock: FrozenClock
) -> None:
    effect = await _owe(db, clock.now(), "a", "p1")
    without = replace(runtime, effect_handlers={})  # assembled without the lifecycle
    report = await deliver_effects(without, clock)
    row = await _row(db, effect.id)
    assert report.dead == 0 and row.dead_at is None and row.delivered_at is None
    assert row.last_error == "no handler for effect kind 'billing_resume' in this process"
    resumes = Resumes(attempts=[])
    clock.advance(timedelta(minutes=5))  # past the first retry's backoff
    await deliver_effects(resumes.runtime(runtime), clock)
    assert resumes.attempts == [["a"]]
    assert (await _row(db, effect.id)).delivered_at is not None


async def test_the_assembled_runtime_delivers_the_lifecycles_kinds(runtime: Runtime) -> None:
    kinds = {"queue", "mail", "billing_resume", "feed_invalidate"}
    assert set(handlers(runtime)) == kinds
    assert set(effect_kinds()) == kinds == {k.value for k in EffectKind}  # what the CLI accepts
