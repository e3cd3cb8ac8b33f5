"""A scheduled slot is claimed again only when its run was abandoned or failed for want of the
database (``retry: true``) — never after a failure that would only happen again.

A run that failed on its own (a bug, bad data) recorded its failure: running the slot again
would repeat it, and each attempt could repeat the side effects it had before it failed. So
the claim (``runs.claim``), the question ``serve`` asks before it starts (``slot_owed``,
``Scheduler.owed``) and the catch-up that runs a missed slot all leave it alone; a run that
lost the database is run again, once (re-claiming after any failure went unseen).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nightcrew import runs
from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database, json_param
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.scheduler import Schedule, Scheduler
from tests.conftest import make_runtime

LANE = "daily"
SLOT = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
LATER = SLOT + timedelta(minutes=30)  # inside the catch-up window, past any heartbeat grace


class Work:
    """A lane's work that raises ``failure`` on its first call and succeeds after."""

    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure
        self.calls = 0

    async def __call__(self, handle: runs.RunHandle) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1 and self.failure is not None:
            raise self.failure
        return {"attempt": handle.attempt}


def _schedule(db: Database, clock: FrozenClock, work: Work) -> Schedule:
    async def runner(slot: datetime) -> bool:
        report = await runs.recorded(
            db, clock, runs.RunSpec(lane=LANE, slot=slot, heartbeat_every=60), work, dict
        )
        return report is not None

    return Schedule(name=LANE, cron="0 4 * * *", runner=runner, catch_up=timedelta(hours=6))


async def _row(db: Database) -> dict[str, Any]:
    row = await db.fetch_one(
        "SELECT status, attempts, report FROM nightcrew.runs WHERE lane = %(l)s AND slot = %(s)s",
        {"l": LANE, "s": SLOT},
    )
    assert row is not None
    return row


# (status, report) of the slot's row → whether the slot is claimed (and owed) again
STATES = [
    ("failed", {"error": "ValueError: bad data", "retry": False}, False, "failed"),
    ("failed", {"error": "KeyError: 'x'"}, False, "failed-without-retry-flag"),
    ("failed", {"error": "x", "retry": None}, False, "failed-retry-null"),
    ("completed", {"jobs": []}, False, "completed"),
    ("running", {}, False, "running-with-a-fresh-heartbeat"),
    ("failed", {"error": "lost PostgreSQL", "retry": True}, True, "failed-retry"),
    ("abandoned", {"abandoned": "no heartbeat"}, True, "abandoned"),
]
# a failed row without a retry flag (written before the flag existed, or by hand) is neither
# claimed again nor owed: slot_owed once said owed there (SQL NULL), and serve announced a
# catch-up the claim then refused


async def _slot_row(db: Database, status: str, report: dict[str, Any]) -> None:
    await db.execute(
        "INSERT INTO nightcrew.runs"
        " (lane, trigger, slot, started_at, heartbeat_at, finished_at, status, report)"
        " VALUES (%(l)s, 'scheduled', %(s)s, %(at)s, %(at)s,"
        "         CASE WHEN %(st)s = 'running' THEN NULL ELSE %(at)s END, %(st)s, %(r)s)",
        {"l": LANE, "s": SLOT, "at": LATER - timedelta(seconds=5), "st": status,
         "r": json_param(report)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("status", "report", "again"), [pytest.param(*state[:3], id=state[3]) for state in STATES]
)
async def test_a_slot_is_claimed_again_only_after_a_retryable_failure_or_abandonment(
    db: Database, status: str, report: dict[str, Any], again: bool
) -> None:
    await _slot_row(db, status, report)
    handle = await runs.claim(db, lane=LANE, slot=SLOT, now=LATER)
    row = await _row(db)
    if again:
        assert handle is not None and handle.attempt == 2
        assert row["status"] == "running" and row["attempts"] == 2
        assert row["report"] == {"previous": report}  # what the earlier attempt left
    else:
        assert handle is None
        assert row["status"] == status and row["attempts"] == 1 and row["report"] == report


@pytest.mark.parametrize(
    ("status", "report", "again"),
    [pytest.param(*state[:3], id=state[3]) for state in STATES],
)
async def test_serve_owes_a_slot_exactly_when_the_claim_would_take_it(
    db: Database, fresh_db_url: str, status: str, report: dict[str, Any], again: bool
) -> None:
    await _slot_row(db, status, report)
    clock = FrozenClock(LATER)
    scheduler = Scheduler(
        await make_runtime(db, clock, fresh_db_url), clock, (_schedule(db, clock, Work(None)),)
    )
    assert [at for _, at in await scheduler.owed()] == ([SLOT] if again else [])
    assert await runs.slot_owed(db, LANE, SLOT) is again


async def test_a_run_that_failed_on_its_own_is_not_run_again_by_the_catch_up(
    db: Database, fresh_db_url: str
) -> None:
    """The slot's run raises an ordinary error: its row says failed, retry false. The next
    catch-up (a restart, the minute re-check) finds nothing owed and runs nothing."""
    clock = FrozenClock(SLOT)
    work = Work(ValueError("a row this run cannot handle"))
    schedule = _schedule(db, clock, work)
    scheduler = Scheduler(await make_runtime(db, clock, fresh_db_url), clock, (schedule,))

    assert await scheduler.fire(LANE, SLOT) is False  # failed, and logged by fire
    assert work.calls == 1
    failed = await _row(db)
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["report"]["retry"] is False
    assert "a row this run cannot handle" in failed["report"]["error"]

    clock.set(LATER)
    assert await scheduler.owed() == []
    assert await runs.slot_owed(db, LANE, SLOT) is False
    assert await scheduler.catch_up(schedule) is False
    assert await runs.claim(db, lane=LANE, slot=SLOT, now=clock.now()) is None
    assert work.calls == 1  # never run again
    assert await _row(db) == failed


async def test_a_run_that_lost_the_database_is_run_again_once_by_the_catch_up(
    db: Database, fresh_db_url: str
) -> None:
    """The slot's run loses the database (its failure still recorded: the database answers
    the finish): failed, retry true. The catch-up claims the slot again and completes it —
    attempt 2, keeping the first attempt's report — and then it is owed no more."""
    clock = FrozenClock(SLOT)
    work = Work(DatabaseUnavailableError("lost PostgreSQL at db:5432/x: server closed"))
    schedule = _schedule(db, clock, work)
    scheduler = Scheduler(await make_runtime(db, clock, fresh_db_url), clock, (schedule,))

    assert await scheduler.fire(LANE, SLOT) is False
    first = await _row(db)
    assert first["status"] == "failed" and first["report"]["retry"] is True

    clock.set(LATER)
    assert [(s.name, at) for s, at in await scheduler.owed()] == [(LANE, SLOT)]
    assert await scheduler.catch_up(schedule) is True
    assert work.calls == 2
    again = await _row(db)
    assert again["status"] == "completed" and again["attempts"] == 2
    assert again["report"] == {"attempt": 2, "previous": first["report"]}

    assert await scheduler.owed() == []
    assert await scheduler.catch_up(schedule) is False
    assert work.calls == 2
