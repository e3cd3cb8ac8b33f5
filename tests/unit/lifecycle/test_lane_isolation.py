"""Lane dispatch with in-memory jobs: isolation and the summary event, no database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.lifecycle.lanes import Job, Lane, run_jobs
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime
from tests.conftest import NOW, offline_runtime


@dataclass(frozen=True)
class Counted:
    key: str
    n: int
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {self.key: self.n}

    def to_json(self) -> dict[str, Any]:
        return self.counts()


@dataclass
class Span:
    started: float = 0.0
    finished: float = 0.0


# Long enough that the two sleeping jobs could interleave only if they run side by side; the
# assertions compare the recorded instants, so no bound on elapsed time is needed.
JOB_SECONDS = 0.05


def _job(name: str, key: str, n: int, spans: dict[str, Span]) -> Job:
    async def run(runtime: Runtime, clock: Any) -> Counted:
        loop = asyncio.get_running_loop()
        span = spans.setdefault(name, Span())
        span.started = loop.time()
        await asyncio.sleep(JOB_SECONDS)
        span.finished = loop.time()
        return Counted(key, n)

    return Job(name=name, failed_event=f"{name}_failed", run=run)


async def boom(runtime: Runtime, clock: Any) -> Counted:
    raise RuntimeError("queue binding missing")


def _lane(concurrent: bool, spans: dict[str, Span]) -> Lane:
    return Lane(
        name="test",
        cron="* * * * *",
        concurrent=concurrent,
        completed_event="test_completed",
        jobs=(
            _job("a", "items_requeued", 3, spans),
            Job(name="b", failed_event="b_failed", run=boom),
            _job("c", "links_requeued", 2, spans),
        ),
    )


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    """Jobs that touch nothing, over a pool that is never opened (offline_runtime)."""
    async with offline_runtime(FrozenClock(NOW)) as rt:
        yield rt


async def test_concurrent_jobs_overlap_and_a_raiser_is_isolated(runtime: Runtime) -> None:
    spans: dict[str, Span] = {}
    with capture_logs() as logs:
        report = await run_jobs(runtime, FrozenClock(NOW), _lane(True, spans))
    a, c = spans["a"], spans["c"]
    assert a.started < c.finished and c.started < a.finished  # side by side, not in turn
    assert report.totals == {"items_requeued": 3, "links_requeued": 2}
    assert report.errors == [
        {"job": "b", "event": "b_failed", "error": "RuntimeError: queue binding missing"}
    ]
    assert [e["event"] for e in logs] == ["b_failed", "test_completed"]
    assert logs[-1]["items_requeued"] == 3 and logs[-1]["errors"] == 1
    summary = report.to_json()
    assert summary["jobs"]["b"]["ok"] is False
    assert summary["items_requeued"] == 3


async def test_sequential_jobs_run_in_order_and_the_raiser_does_not_stop_the_next(
    runtime: Runtime,
) -> None:
    spans: dict[str, Span] = {}
    report = await run_jobs(runtime, FrozenClock(NOW), _lane(False, spans))
    assert spans["a"].finished <= spans["c"].started  # one after another, as the spec orders
    assert [j.name for j in report.jobs] == ["a", "b", "c"]
    assert [j.ok for j in report.jobs] == [True, False, True]
