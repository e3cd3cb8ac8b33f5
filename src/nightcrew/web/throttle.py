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

**The operator always gets in.** A network (IPv4 /24, IPv6 /48) with no wrong token in the
last ``FORGET_AFTER_SECONDS`` goes before every network that has one, at the gate (ranked
when each turn is given, so a wave of first guesses queued earlier ranks behind once its
network has failed) and for room: attempts from failing networks may hold at most
``MAX_IN_FLIGHT - FRESH_RESERVE`` of the ``MAX_IN_FLIGHT`` places, and one network at most
``NETWORK_IN_FLIGHT`` of them at any time (more are answered 429); when every place is
taken, an attempt from a network that has not failed pushes out the waiting attempt of the
address with the most wrong tokens (answered 429). So a
right token from a network that has not been guessing waits about one turn of the gate
(``FAILED_LOGIN_DELAY_SECONDS``) behind any number of guessers — 64 of them queued 19 of 19
right tokens out with one first-come queue — while the overall rate of checks stays two a
second: a guesser on fresh networks passes the same gate, one early turn per network.

**A known device goes first.** A browser that has signed in before carries a device cookie
(``Access.device_value``, signed with a key derived from the token, so a guesser cannot make
one). Its attempt ranks before every other at the gate and has ``DEVICE_RESERVE`` places of
its own beyond ``MAX_IN_FLIGHT``, so a guesser with one first guess from each of many fresh
networks — who ranks with an operator on a new browser — still cannot queue out the browser
the operator signed in from yesterday. A device is its own identity, not its address's: a
guesser behind the same NAT does not hold it out, and a device that sends a wrong token ranks
as any other from then on (a stolen device cookie buys one early turn, not a faster guessing
rate).

State is this process's memory: at most ``MAX_ADDRESSES`` addresses, the least recently failed
forgotten first, and an address forgotten ``FORGET_AFTER_SECONDS`` after its last failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ipaddress
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from nightcrew.turns import RankedTurns

FAILED_LOGIN_DELAY_SECONDS = 0.5
ADDRESS_BACKOFF_MAX_SECONDS = 8.0
MAX_IN_FLIGHT = 64
FRESH_RESERVE = 16
DEVICE_RESERVE = 8  # places beyond MAX_IN_FLIGHT for known devices only
# places one network may hold at once: a wave of first guesses from one /24 cannot fill the
# room before any of them has failed
NETWORK_IN_FLIGHT = 8
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


def network_key(host: str | None) -> str:
    """The unit of "has this network been guessing": an IPv4 /24, an IPv6 /48 (what one
    customer holds), or a name itself."""
    key = address_key(host)
    try:
        address = ipaddress.ip_address(key.split("/")[0])
    except ValueError:
        return key
    prefix = 24 if address.version == 4 else 48
    return str(ipaddress.ip_network((address, prefix), strict=False))


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
        network_in_flight: int = NETWORK_IN_FLIGHT,
        device_reserve: int = DEVICE_RESERVE,
        max_addresses: int = MAX_ADDRESSES,
        forget_after: float = FORGET_AFTER_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failure_delay = failure_delay
        self._backoff_max = backoff_max
        self._max_in_flight = max_in_flight
        self._fresh_reserve = fresh_reserve
        self._network_in_flight = network_in_flight
        self._device_reserve = device_reserve
        self._max_addresses = max_addresses
        self._forget_after = forget_after
        self._monotonic = monotonic
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._in_flight: set[str] = set()
        self._next_check = 0.0
        self._gate = RankedTurns()
        # networks (IPv4 /24, IPv6 /48) with a wrong token in the last FORGET_AFTER_SECONDS,
        # in order of their last one: who goes second at the gate and is held to less room
        self._failing_networks: OrderedDict[str, float] = OrderedDict()
        self._per_network: Counter[str] = Counter()  # _in_flight by network
        self._pending: dict[str, _Pending] = {}  # admitted, not yet at the gate
        self._devices_in_flight = 0

    @property
    def addresses_remembered(self) -> int:
        return len(self._failures)

    async def attempt(
        self, client_host: str | None, check: Callable[[], bool], *, device: str | None = None
    ) -> Verdict:
        """Run ``check`` (the token comparison) under the rules above; ``device``: the nonce of
        a device cookie this token signed, the attempt's own identity (see the module's doc)."""
        key = address_key(client_host)
        network = network_key(client_host)
        self._forget_old()
        if device is not None and (device_key := f"device:{device}") not in self._failures:
            return await self._device_attempt(device_key, network, check)
        known = self._failures.get(key)
        failing = self._failing(network)
        room = self._max_in_flight - (self._fresh_reserve if failing else 0)
        if (
            key in self._in_flight
            or (failing and self._in_flight_from_failing() >= room)
            or self._per_network[network] >= self._network_in_flight
            or (self._others_in_flight() >= self._max_in_flight and not self._make_room(failing))
        ):
            return Verdict.BUSY
        pending = _Pending(network=network)
        self._in_flight.add(key)
        self._pending[key] = pending
        self._per_network[network] += 1
        try:
            if known is not None:
                with contextlib.suppress(TimeoutError):
                    wait = max(0.0, known.not_before - self._monotonic())
                    await asyncio.wait_for(pending.evicted.wait(), wait)
                if pending.evicted.is_set():
                    return Verdict.BUSY
            # the rank is read when a turn is given, not when the attempt arrived: a wave of
            # first guesses queued before the operator ranks behind once its network failed
            try:
                turn = self._gate.turn(lambda: int(self._failing(network)), waiting=pending.waiting)
                await turn.__aenter__()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.evicted.is_set() and task is not None and not task.cancelling():
                    return Verdict.BUSY  # its place went to a network that has not failed
                raise
            if pending.evicted.is_set():  # pushed out as its turn came: pass the turn on
                await turn.__aexit__(None, None, None)
                return Verdict.BUSY
            del self._pending[key]  # at the gate: no longer to be pushed out
            try:
                accepted = await self._compare(check)
            finally:
                await turn.__aexit__(None, None, None)
            return await self._answer(accepted, key, network)
        finally:
            self._pending.pop(key, None)
            self._in_flight.discard(key)
            self._per_network[network] -= 1
            if not self._per_network[network]:
                del self._per_network[network]

    async def _device_attempt(self, key: str, network: str, check: Callable[[], bool]) -> Verdict:
        """A known device that has never sent a wrong token: its own places and backoff, keyed
        on the device and not on the address, so a guesser at the same address (a NAT, an IPv6
        /64) cannot hold it out; the first turn at the gate."""
        if key in self._in_flight or self._devices_in_flight >= self._device_reserve:
            return Verdict.BUSY
        self._in_flight.add(key)
        self._devices_in_flight += 1
        try:
            async with self._gate.turn(lambda: -1):
                accepted = await self._compare(check)
            return await self._answer(accepted, key, network)
        finally:
            self._in_flight.discard(key)
            self._devices_in_flight -= 1

    async def _compare(self, check: Callable[[], bool]) -> bool:
        """At the gate: wait out the delay a wrong token set, then compare; a wrong one sets
        the next delay."""
        await asyncio.sleep(max(0.0, self._next_check - self._monotonic()))
        accepted = check()
        if not accepted:
            self._next_check = self._monotonic() + self._failure_delay
        return accepted

    async def _answer(self, accepted: bool, key: str, network: str) -> Verdict:
        """The right token clears ``key``'s record; a wrong one is recorded and its answer
        held back by the delay ("no answer yet" is never faster news than the answer)."""
        if accepted:
            self._failures.pop(key, None)
            return Verdict.ACCEPTED
        self._failed(key, network)
        await asyncio.sleep(self._failure_delay)
        return Verdict.REFUSED

    def _others_in_flight(self) -> int:
        return len(self._in_flight) - self._devices_in_flight

    def _make_room(self, failing: bool) -> bool:
        """All places taken: an attempt from a network that has not failed pushes out the one
        still waiting from the address with the most wrong tokens on record, on a failing
        network (answered 429, try again). An address with no wrong token of its own (the
        operator on a network a guesser shares) is never pushed out."""
        if failing:
            return False
        victims = [
            (known.count, key)
            for key, pending in self._pending.items()
            if not pending.evicted.is_set()
            and (known := self._failures.get(key)) is not None
            and self._failing(pending.network)
        ]
        if not victims:
            return False
        _, key = max(victims)
        pending = self._pending[key]
        pending.evicted.set()
        if pending.granted is not None and not pending.granted.done():
            pending.granted.cancel()
        return True

    def _in_flight_from_failing(self) -> int:
        """Places held by networks failing now, whatever they were when they came in (a wave
        from fresh networks that fail holds the reserve no longer)."""
        return sum(n for net, n in self._per_network.items() if self._failing(net))

    def _failing(self, network: str) -> bool:
        last = self._failing_networks.get(network)
        return last is not None and last > self._monotonic() - self._forget_after

    def _failed(self, key: str, network: str) -> None:
        now = self._monotonic()
        self._failing_networks.pop(network, None)
        self._failing_networks[network] = now
        while len(self._failing_networks) > self._max_addresses:
            self._failing_networks.popitem(last=False)
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


@dataclass(slots=True)
class _Pending:
    """An attempt admitted and not yet at the gate: it may be pushed out (``_make_room``)."""

    network: str
    evicted: asyncio.Event = field(default_factory=asyncio.Event)
    granted: asyncio.Future[None] | None = None  # its place in the gate's queue

    def waiting(self, granted: asyncio.Future[None]) -> None:
        self.granted = granted
