"""Parsing off the event loop, under a budget (issue 24): ``parse.off_loop`` runs work in a worker
process that is killed past its budget, or when its caller gives up; what is still parsed in
place is small and cheap whatever the bytes say."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import feedparser
import pytest

from nightcrew.adapters.addresses import AddressPolicy
from nightcrew.news import fetch
from nightcrew.news.fetch import INLINE_PARSE_MAX_BYTES, FeedRules, read_feed_body
from nightcrew.news.parse import ParseOverBudget, ParserDied, off_loop, parse_fast_only

RULES = FeedRules(policy=AddressPolicy())
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _still_parses() -> None:
    read = await off_loop(read_feed_body, WELL_FORMED, BASE, RULES, budget_seconds=30)
    assert [i.url for i in read.items] == ["https://news.example.com/1"]


async def test_work_over_its_budget_is_stopped_and_the_pool_goes_on() -> None:
    started = time.monotonic()
    with pytest.raises(ParseOverBudget, match=r"longer than the 0\.5 s parse budget"):
        await off_loop(spin, 60.0, budget_seconds=0.5)
    # killed near its budget (pebble checks every 0.1 s), not left to spin its 60 s
    assert time.monotonic() - started < 10
    await _still_parses()


async def test_a_worker_that_dies_is_that_task_failure_only() -> None:
    with pytest.raises(ParserDied, match="exit code 3"):
        await off_loop(die, 3, budget_seconds=30)
    await _still_parses()


async def test_a_caller_that_gives_up_kills_the_worker(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    task = asyncio.create_task(off_loop(note_pid_then_spin, str(marker), budget_seconds=120))
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
    await _still_parses()


async def test_the_event_loop_runs_while_a_worker_parses() -> None:
    lags: list[float] = []

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticker = asyncio.create_task(tick())
    try:
        worker_pid = await off_loop(spin, 1.5, budget_seconds=30)
    finally:
        ticker.cancel()
    assert worker_pid != os.getpid()
    assert len(lags) > 20 and max(lags) < 0.5, max(lags)


async def test_a_small_body_the_fast_parser_cannot_read_whole_goes_to_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an entry without a link needs feedparser; in this process feedparser now refuses, so
    # a result read by it can only have come from a worker
    def not_here(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("feedparser ran on the event loop")

    monkeypatch.setattr(feedparser, "parse", not_here)
    small = WELL_FORMED.replace(b"</channel>", b"<item><title>no link</title></item></channel>")
    assert len(small) < INLINE_PARSE_MAX_BYTES
    read = await fetch._read_feed(small, BASE, RULES)
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
    fast = parse_fast_only(fetch._clean_char_refs(body), BASE)
    if fast is not None:
        fetch._feed_read(fast, BASE, RULES)
    # about 25 ms measured for the worst of these; the event loop can afford a few at once
    assert time.thread_time() - started < 0.1
