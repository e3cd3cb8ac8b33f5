"""Sign-in throttling: a wrong dashboard token costs time, per client address and overall.

Three rules, all decided before the token is compared, so a refusal to check says nothing
about the token:

- **One at a time per address.** While an attempt from an address is being delayed, checked or
  answered, another from the same address is answered 429 at once, unchecked. (IPv6 addresses
  count per /64: one host holds a whole /64.)
- **Per-address backoff.** After a wrong token an address waits 0.5 s before its next attempt
  is checked, doubling with each further failure up to ``ADDRESS_BACKOFF_MAX_SECONDS``; the
  right token clears it.
- **One gate for everyone.** Tokens are compared one at a time, and after a wrong one the
  next comparison (from any address) waits ``FAILED_LOGIN_DELAY_SECONDS``: at most two wrong
  guesses a second are checked, whatever the concurrency or the number of addresses. The gate
  is a time, not a held lock, so a guesser who hangs up early does not shorten it — and the
  wrong answer itself is held back that long too, so "no answer yet" is never faster news
  than the answer.

**The operator always gets in.** An address with no failure on record goes before every
address that has failed, at the gate and for room: addresses that have failed may hold at most
``MAX_IN_FLIGHT - FRESH_RESERVE`` of the ``MAX_IN_FLIGHT`` attempts delayed or checked at once
(more are answered 429). So a right token from an address that has not been guessing waits
one turn of the gate (``FAILED_LOGIN_DELAY_SECONDS``) behind any number of guessers that have
failed — 64 of them queued 19 of 19 right tokens out with one first-come queue — while the
overall rate of checks stays two a second: a guesser that rotates fresh addresses passes the
same gate, and gets one early turn per address.

State is this process's memory: at most ``MAX_ADDRESSES`` addresses, the least recently failed
forgotten first, and an address forgotten ``FORGET_AFTER_SECONDS`` after its last failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import ipaddress
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

FAILED_LOGIN_DELAY_SECONDS = 0.5
ADDRESS_BACKOFF_MAX_SECONDS = 8.0
MAX_IN_FLIGHT = 64
FRESH_RESERVE = 16
MAX_ADDRESSES = 4096
FORGET_AFTER_SECONDS = 15 * 60
BUSY_RETRY_AFTER_SECONDS = 1


class Verdict(enum.Enum):
    ACCEPTED = "accepted"  # the right token
    REFUSED = "refused"  # a wrong token, answered after its delay
    BUSY = "busy"  # not checked: this address has an attempt in flight, or too many have


@dataclass(slots=True)
class _Failures:
    count: int
    last_at: float
    not_before: float


def address_key(host: str | None) -> str:
    """The unit of per-address backoff: the address, or its /64 for IPv6."""
    if not host:
        return "?"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # a name (a test transport's "testclient"): itself
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class SignInThrottle:
    def __init__(
        self,
        *,
        failure_delay: float = FAILED_LOGIN_DELAY_SECONDS,
        backoff_max: float = ADDRESS_BACKOFF_MAX_SECONDS,
        max_in_flight: int = MAX_IN_FLIGHT,
        fresh_reserve: int = FRESH_RESERVE,
        max_addresses: int = MAX_ADDRESSES,
        forget_after: float = FORGET_AFTER_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failure_delay = failure_delay
        self._backoff_max = backoff_max
        self._max_in_flight = max_in_flight
        self._fresh_reserve = fresh_reserve
        self._max_addresses = max_addresses
        self._forget_after = forget_after
        self._monotonic = monotonic
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._in_flight: set[str] = set()
        self._next_check = 0.0
        self._gate = _Turns()
        self._in_flight_failed = 0  # of _in_flight, addresses with a failure on record

    @property
    def addresses_remembered(self) -> int:
        return len(self._failures)

    async def attempt(self, client_host: str | None, check: Callable[[], bool]) -> Verdict:
        """Run ``check`` (the token comparison) under the rules above."""
        key = address_key(client_host)
        self._forget_old()
        known = self._failures.get(key)
        room = self._max_in_flight - (self._fresh_reserve if known is not None else 0)
        if (
            key in self._in_flight
            or len(self._in_flight) >= self._max_in_flight
            or (known is not None and self._in_flight_failed >= room)
        ):
            return Verdict.BUSY
        self._in_flight.add(key)
        self._in_flight_failed += known is not None
        try:
            if known is not None:
                await asyncio.sleep(max(0.0, known.not_before - self._monotonic()))
            async with self._gate.turn(first=known is None):
                await asyncio.sleep(max(0.0, self._next_check - self._monotonic()))
                accepted = check()
                if not accepted:
                    self._next_check = self._monotonic() + self._failure_delay
            if accepted:
                self._failures.pop(key, None)
                return Verdict.ACCEPTED
            self._failed(key)
            await asyncio.sleep(self._failure_delay)
            return Verdict.REFUSED
        finally:
            self._in_flight.discard(key)
            self._in_flight_failed -= known is not None

    def _failed(self, key: str) -> None:
        now = self._monotonic()
        known = self._failures.pop(key, None)
        count = 1 if known is None else known.count + 1
        backoff = min(self._failure_delay * 2 ** min(count - 1, 32), self._backoff_max)
        self._failures[key] = _Failures(count=count, last_at=now, not_before=now + backoff)
        while len(self._failures) > self._max_addresses:
            self._failures.popitem(last=False)

    def _forget_old(self) -> None:
        """Entries are kept in order of their last failure: the stale ones are at the front."""
        horizon = self._monotonic() - self._forget_after
        while self._failures:
            oldest = next(iter(self._failures.values()))
            if oldest.last_at > horizon:
                break
            self._failures.popitem(last=False)


class _Turns:
    """One holder at a time; waiters marked ``first`` are let in before the others, each group
    in arrival order. A waiter that is cancelled gives up its place (or its turn, if it was
    just granted one)."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, *, first: bool) -> AsyncIterator[None]:
        await self._acquire(0 if first else 1)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, rank: int) -> None:
        if not self._held and not self._waiting:
            self._held = True
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._arrivals), granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # granted as it was cancelled: pass the turn on
            else:
                self._waiting = [w for w in self._waiting if w[2] is not granted]
                heapq.heapify(self._waiting)
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, granted = heapq.heappop(self._waiting)
            if not granted.done():
                granted.set_result(None)  # the turn passes on, held all along
                return
        self._held = False
