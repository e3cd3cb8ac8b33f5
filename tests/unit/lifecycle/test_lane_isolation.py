"""Lane dispatch with in-memory jobs: isolation and the summary event, no database."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.lifecycle.lanes import Job, Lane, run_jobs
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime
from tests.conftest import NOW


@dataclass(frozen=True)
class Counted:
    key: str
    n: int
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {self.key: self.n}

    def to_json(self) -> dict[str, Any]:
        return self.counts()


# Two jobs of this long: concurrent takes one, in sequence two — a margin of a whole job, so a
# loaded CI machine cannot blur the difference.
JOB_SECONDS = 0.6


def _job(name: str, key: str, n: int, delay: float = 0.0) -> Job:
    async def run(runtime: Runtime, clock: Any) -> Counted:
        await asyncio.sleep(delay)
        return Counted(key, n)

    return Job(name=name, failed_event=f"{name}_failed", run=run)


async def boom(runtime: Runtime, clock: Any) -> Counted:
    raise RuntimeError("queue binding missing")


def _lane(concurrent: bool) -> Lane:
    return Lane(
        name="test",
        cron="* * * * *",
        concurrent=concurrent,
        completed_event="test_completed",
        jobs=(
            _job("a", "items_requeued", 3, delay=JOB_SECONDS),
            Job(name="b", failed_event="b_failed", run=boom),
            _job("c", "links_requeued", 2, delay=JOB_SECONDS),
        ),
    )


class _Runtime:
    dry_run = False


async def test_concurrent_jobs_overlap_and_a_raiser_is_isolated() -> None:
    started = asyncio.get_running_loop().time()
    with capture_logs() as logs:
        report = await run_jobs(cast(Runtime, _Runtime()), FrozenClock(NOW), _lane(True))
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed < 1.5 * JOB_SECONDS  # concurrent, not 2 x JOB_SECONDS in sequence
    assert report.totals == {"items_requeued": 3, "links_requeued": 2}
    assert report.errors == [
        {"job": "b", "event": "b_failed", "error": "RuntimeError: queue binding missing"}
    ]
    assert [e["event"] for e in logs] == ["b_failed", "test_completed"]
    assert logs[-1]["items_requeued"] == 3 and logs[-1]["errors"] == 1
    summary = report.to_json()
    assert summary["jobs"]["b"]["ok"] is False
    assert summary["items_requeued"] == 3


async def test_sequential_jobs_run_in_order_and_the_raiser_does_not_stop_the_next() -> None:
    started = asyncio.get_running_loop().time()
    report = await run_jobs(cast(Runtime, _Runtime()), FrozenClock(NOW), _lane(False))
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed >= 2 * JOB_SECONDS  # one after another, as the daily lane's spec order wants
    assert [j.name for j in report.jobs] == ["a", "b", "c"]
    assert [j.ok for j in report.jobs] == [True, False, True]
