"""Parsing off the event loop, under a budget (in the integration tier: it starts worker
processes and measures wall-clock time): ``ParserPool.run`` runs work in a
worker process that is killed past its budget, or when its caller gives up; what is still parsed
in place is small and cheap whatever the bytes say. The pool is the runtime's: its workers start
on the first parse and stop when the runtime closes, or at the process's exit if nobody closed
it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import feedparser
import pytest

from nightcrew.adapters.addresses import AddressPolicy
from nightcrew.adapters.parsers import ParseOverBudget, ParserDied, ParserPool
from nightcrew.news.steps import entries, fetch
from nightcrew.news.steps.entries import ItemLimits, read_feed_body
from nightcrew.news.steps.fetch import INLINE_PARSE_MAX_BYTES, FeedRules
from nightcrew.news.steps.parse import parse_fast_only

POLICY = AddressPolicy()
LIMITS = ItemLimits()
BASE = "https://news.example.com/feed.xml"
WELL_FORMED = (
    b'<?xml version="1.0"?><rss version="2.0"><channel><title>T</title>'
    b"<item><title>one</title><link>https://news.example.com/1</link></item>"
    b"</channel></rss>"
)


# --- run in the worker processes (module-level: a spawned worker imports them by name) ---
def spin(seconds: float) -> int:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        pass
    return os.getpid()


def die(code: int) -> None:
    os._exit(code)


def note_pid_then_spin(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    spin(120)


def parent_pid() -> int:
    return os.getppid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _workers() -> set[int]:
    """This process's live parser workers (pebble's multiprocessing children)."""
    return {
        p.pid
        for p in multiprocessing.active_children()
        if p.name.startswith("pebble_pool_worker") and p.pid is not None
    }


@pytest.fixture(scope="module")
def pool() -> Iterator[ParserPool]:
    """One pool for this module's tests (starting workers is most of a small test's time)."""
    parsers = ParserPool()
    yield parsers
    parsers.close()


async def _still_parses(pool: ParserPool) -> None:
    read = await pool.run(read_feed_body, WELL_FORMED, BASE, POLICY, LIMITS, budget_seconds=30)
    assert [i.url for i in read.items] == ["https://news.example.com/1"]


async def test_work_over_its_budget_is_stopped_and_the_pool_goes_on(pool: ParserPool) -> None:
    started = time.monotonic()
    with pytest.raises(ParseOverBudget, match=r"longer than the 0\.5 s parse budget"):
        await pool.run(spin, 60.0, budget_seconds=0.5)
    # killed near its budget (pebble checks every 0.1 s), not left to spin its 60 s
    assert time.monotonic() - started < 10
    await _still_parses(pool)


async def test_workers_are_forked_by_the_fork_server_not_by_this_threaded_process(
    pool: ParserPool,
) -> None:
    """Forked from the fork server (single-threaded, nightcrew's fetch module imported), never
    from this process, whose threads a fork would copy half-held; not spawned either (a new
    Python per worker): a spawned or forked worker's parent is this process."""
    assert await pool.run(parent_pid, budget_seconds=30) != os.getpid()


async def test_a_worker_that_dies_is_that_task_failure_only(pool: ParserPool) -> None:
    with pytest.raises(ParserDied, match="exit code 3"):
        await pool.run(die, 3, budget_seconds=30)
    await _still_parses(pool)


async def test_a_caller_that_gives_up_kills_the_worker(pool: ParserPool, tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    task = asyncio.create_task(pool.run(note_pid_then_spin, str(marker), budget_seconds=120))
    for _ in range(300):
        if marker.exists() and marker.read_text():
            break
        await asyncio.sleep(0.05)
    pid = int(marker.read_text())
    assert pid != os.getpid() and _alive(pid)
    task.cancel()  # as the fetch budget's asyncio.timeout does
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not _alive(pid):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pid), "the worker still spins for a caller that is gone"
    await _still_parses(pool)


async def test_the_event_loop_runs_while_a_worker_parses(pool: ParserPool) -> None:
    lags: list[float] = []

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticker = asyncio.create_task(tick())
    try:
        worker_pid = await pool.run(spin, 1.5, budget_seconds=30)
    finally:
        ticker.cancel()
    assert worker_pid != os.getpid()
    assert len(lags) > 20 and max(lags) < 0.5, max(lags)


async def test_a_small_body_the_fast_parser_cannot_read_whole_goes_to_a_worker(
    pool: ParserPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an entry without a link needs feedparser; in this process feedparser now refuses, so
    # a result read by it can only have come from a worker
    def not_here(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("feedparser ran on the event loop")

    monkeypatch.setattr(feedparser, "parse", not_here)
    small = WELL_FORMED.replace(b"</channel>", b"<item><title>no link</title></item></channel>")
    assert len(small) < INLINE_PARSE_MAX_BYTES
    read = await fetch._read_feed(small, BASE, FeedRules(policy=POLICY, parsers=pool))
    assert read.error is None and read.parser == "feedparser"
    assert read.dropped == {"no link": 1}


def _fill(item: bytes, *, head: bytes = b"", tail: bytes = b"") -> bytes:
    """An RSS document of as many copies of ``item`` as fit the in-place limit."""
    start = b'<?xml version="1.0"?><rss version="2.0"><channel><title>T</title>' + head
    end = tail + b"</channel></rss>"
    count = (INLINE_PARSE_MAX_BYTES - len(start) - len(end)) // len(item)
    return start + item * count + end


WORST_SMALL = {
    "tiny linked items": _fill(b"<item><link>http://a.example/x</link></item>"),
    "relative links with tracking": _fill(
        b"<item><link>/p?utm_x=1&amp;b=2&amp;a=1</link><title>&amp;t</title></item>"
    ),
    "one huge markup title": _fill(
        b"&lt;b&gt;", head=b"<item><title>", tail=b"</title><link>http://a.example/1</link></item>"
    ),
    "deep nesting": _fill(b"<a>", tail=b"</a>"),
}


@pytest.mark.parametrize("shape", list(WORST_SMALL))
def test_what_is_read_in_place_is_cheap_whatever_it_holds(shape: str) -> None:
    body = WORST_SMALL[shape]
    assert len(body) <= INLINE_PARSE_MAX_BYTES
    started = time.thread_time()  # this thread's CPU: other work on the machine does not count
    fast = parse_fast_only(entries.clean_char_refs(body), BASE)
    if fast is not None:
        entries.feed_read(fast, BASE, POLICY, LIMITS)
    # about 25 ms measured for the worst of these; the event loop can afford a few at once
    assert time.thread_time() - started < 0.1


async def test_the_fetch_budget_stops_while_a_worker_parses_and_runs_on_afterwards() -> None:
    """A parse in a worker has its own budget, so the fetch budget does not run meanwhile: a
    2-item feed once ran out of a 3 s fetch budget while a worker process started on a loaded
    machine. What was left of the fetch budget is left after the parse, and still ends it."""
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3) as budget:
            with fetch._paused(budget):
                assert budget.when() is None
                await asyncio.sleep(0.5)  # past the fetch budget: not counted
            left = (budget.when() or 0) - loop.time()
            assert 0.2 < left <= 0.3, left
            await asyncio.sleep(1)  # the rest of the download: the budget ends it


async def test_a_large_document_waits_its_turn_but_not_for_ever() -> None:
    """Smallest first, less the time waited: a 5 MB document queued behind both workers goes
    before small ones that keep arriving once it has waited long enough (here 0.5 s at 10 MB a
    second of aging); smaller ones queued with it still go first."""
    pool = ParserPool(workers=2)
    order: list[str] = []
    release = asyncio.Event()

    async def take(name: str, size: int) -> None:
        async with pool.turn(size, aging=10_000_000):
            order.append(name)
            if name.startswith("held"):
                await release.wait()

    held = [asyncio.create_task(take(f"held{n}", 1)) for n in range(2)]
    await asyncio.sleep(0)
    large = asyncio.create_task(take("large", 5_000_000))
    early = asyncio.create_task(take("early-small", 1_000))
    await asyncio.sleep(0.6)  # the large one has waited 0.6 s: 6 MB of aging
    late = asyncio.create_task(take("late-small", 1_000))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*held, large, early, late)
    assert order == ["held0", "held1", "early-small", "large", "late-small"]
