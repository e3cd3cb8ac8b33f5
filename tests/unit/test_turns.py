"""RankedTurns on its own: how many hold a turn, who goes next, and what a cancelled waiter
leaves behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from nightcrew.turns import RankedTurns


async def _take(turns: RankedTurns, rank: Callable[[], float], order: list[str], name: str) -> None:
    async with turns.turn(rank):
        order.append(name)
        await asyncio.sleep(0.01)


async def test_slots_hold_at_once_and_the_lowest_rank_read_at_the_turn_goes_next() -> None:
    turns = RankedTurns(2)
    order: list[str] = []
    ranks = {"late-low": 5}
    tasks = [asyncio.create_task(_take(turns, lambda: 1, order, n)) for n in ("a", "b")]
    await asyncio.sleep(0)  # both hold a slot
    tasks += [
        asyncio.create_task(_take(turns, lambda: 3, order, "first-high")),
        asyncio.create_task(_take(turns, lambda: ranks["late-low"], order, "late-low")),
        asyncio.create_task(_take(turns, lambda: 3, order, "second-high")),
    ]
    await asyncio.sleep(0)
    ranks["late-low"] = 0  # its rank changes while it waits: read when the turn is given
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "late-low", "first-high", "second-high"]


async def test_a_cancelled_waiter_leaves_the_queue_and_a_granted_one_passes_its_turn_on() -> None:
    turns = RankedTurns(1)
    order: list[str] = []
    await turns.acquire(lambda: 0)
    gone = asyncio.create_task(_take(turns, lambda: 0, order, "gone"))
    after = asyncio.create_task(_take(turns, lambda: 1, order, "after"))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    turns.release()
    await after
    assert order == ["after"]
    # granted and cancelled in the same step: the turn is not lost
    await turns.acquire(lambda: 0)
    granted_then_cancelled = asyncio.create_task(turns.acquire(lambda: 0))
    last = asyncio.create_task(_take(turns, lambda: 1, order, "last"))
    await asyncio.sleep(0)
    turns.release()  # grants the first waiter's future...
    granted_then_cancelled.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    await asyncio.wait_for(last, 1)
    assert order == ["after", "last"]
