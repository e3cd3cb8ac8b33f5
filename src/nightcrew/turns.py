"""Ranked turns: a fixed number of holders at a time, and the next turn to the waiter of the
lowest rank — read when the turn is given, so a waiter's rank may change while it waits — then
the earliest. The parser pool gives its workers' turns smallest document first
(``adapters/parsers.py``); the sign-in throttle gives its one gate to networks that have not
been guessing first (``web/throttle.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Waiter:
    arrival: int
    rank: Callable[[], float]
    granted: asyncio.Future[None]


class RankedTurns:
    """``slots`` holders at a time. A waiter that is cancelled gives up its place in the queue
    (or its turn, if it was just granted one: the turn passes on). The queue is scanned for the
    lowest rank at each turn: it is meant for tens of waiters, not thousands."""

    def __init__(self, slots: int = 1) -> None:
        self._free = slots
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(
        self,
        rank: Callable[[], float],
        *,
        waiting: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> AsyncIterator[None]:
        """Held for the block. ``waiting`` is told the future of a waiter that has to queue:
        cancelling that future takes it out of the queue (the throttle's push-out)."""
        await self.acquire(rank, waiting)
        try:
            yield
        finally:
            self.release()

    async def acquire(
        self,
        rank: Callable[[], float],
        waiting: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if waiting is not None:
            waiting(granted)
        self._waiting.append(_Waiter(next(self._arrivals), rank, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # granted as it was cancelled: the turn passes on
            else:
                self._waiting = [w for w in self._waiting if w.granted is not granted]
            raise

    def release(self) -> None:
        self._waiting = [w for w in self._waiting if not w.granted.done()]
        if not self._waiting:
            self._free += 1
            return
        chosen = min(self._waiting, key=lambda w: (w.rank(), w.arrival))
        self._waiting.remove(chosen)
        chosen.granted.set_result(None)  # the turn passes on, never free in between
