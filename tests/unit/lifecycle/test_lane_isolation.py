"""Lane dispatch with in-memory sweeps: isolation and the summary event, no database."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.lifecycle.lanes import Sweep, run_minute_sweeps
from nightcrew.runtime import Runtime
from tests.conftest import NOW


@dataclass(frozen=True)
class Counted:
    key: str
    n: int

    def to_json(self) -> dict[str, Any]:
        return {self.key: self.n}


def _sweep(name: str, key: str, n: int, delay: float = 0.0) -> Sweep:
    async def run(runtime: Runtime, clock: Any) -> Counted:
        await asyncio.sleep(delay)
        return Counted(key, n)

    return Sweep(name=name, failed_event=f"{name}_failed", run=run)


async def test_sweeps_run_concurrently_and_a_raiser_is_isolated() -> None:
    async def boom(runtime: Runtime, clock: Any) -> Counted:
        raise RuntimeError("queue binding missing")

    sweeps = (
        _sweep("a", "items_requeued", 3, delay=0.2),
        Sweep(name="b", failed_event="b_failed", run=boom),
        _sweep("c", "links_requeued", 2, delay=0.2),
    )
    started = asyncio.get_running_loop().time()
    with capture_logs() as logs:
        report = await run_minute_sweeps(cast(Runtime, None), FrozenClock(NOW), sweeps=sweeps)
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed < 0.35  # concurrent, not 0.4 s in sequence
    assert report.total("items_requeued") == 3 and report.total("links_requeued") == 2
    assert report.errors == [
        {"sweep": "b", "event": "b_failed", "error": "RuntimeError: queue binding missing"}
    ]
    assert [e["event"] for e in logs] == ["b_failed", "import_watchdog_completed"]
    summary = report.to_json()
    assert summary["sweeps"]["b"]["ok"] is False
    assert summary["items_requeued"] == 3 and summary["previews_canceled"] == 0
