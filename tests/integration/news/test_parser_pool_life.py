"""The parser pool's life: its workers start on the first parse and stop when the runtime
closes, or at the process's exit if nobody closed it.

Apart from ``test_parse_budget.py`` on purpose: that module's shared pool replaces a worker that
a test killed in a background thread, and a replacement appearing mid-test was counted here as a
worker this pool started (a failure seen once in CI). No other pool is open while these run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nightcrew.adapters.parsers import PARSE_WORKERS, ParserDied, ParserPool
from nightcrew.clock import FrozenClock
from tests.conftest import NOW, offline_runtime
from tests.integration.news.test_parse_budget import _alive, _workers, note_pid_then_spin


async def test_closing_the_runtime_stops_its_parser_workers() -> None:
    before = _workers()
    async with offline_runtime(FrozenClock(NOW)) as runtime:
        parsers = runtime.news_adapters().parsers
        assert not parsers.started  # nothing parsed yet: no worker spawned
        assert _workers() - before == set()
        worker_pid = await parsers.run(os.getpid, budget_seconds=60)
        started = _workers() - before
        assert worker_pid in started and len(started) == PARSE_WORKERS
    # closed with the runtime: every worker it started is gone (joined, not left a zombie)
    assert not any(_alive(pid) for pid in started), started
    assert not _workers() & started
    with pytest.raises(ParserDied, match="closed"):
        await parsers.run(os.getpid, budget_seconds=60)


async def test_a_parse_in_flight_when_the_pool_closes_is_parser_died(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    async with ParserPool() as parsers:
        task = asyncio.create_task(parsers.run(note_pid_then_spin, str(marker), budget_seconds=120))
        for _ in range(300):
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.05)
        pid = int(marker.read_text())
    with pytest.raises(ParserDied):  # "closed during the parse", or pebble saw it break first
        await asyncio.wait_for(task, 30)  # not left pending for ever
    assert not _alive(pid)


async def test_a_pool_never_used_starts_nothing_and_closes_at_once() -> None:
    before = _workers()
    async with ParserPool() as parsers:
        assert not parsers.started
    assert _workers() - before == set()


# A process that leaves its pool open, as a script stopped mid-run does: pebble's workers are
# not daemons, so without the pool's own exit hook multiprocessing would wait for them forever.
_LEFT_OPEN = textwrap.dedent(
    """
    import asyncio, os
    from nightcrew.adapters.parsers import ParserPool

    async def main():
        pool = ParserPool()
        print(await pool.run(os.getpid, budget_seconds=60), flush=True)

    asyncio.run(main())
    """
)


def test_a_process_that_never_closes_its_pool_still_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    worker_pid = int(done.stdout.strip())
    assert worker_pid > 0 and not _alive(worker_pid)
