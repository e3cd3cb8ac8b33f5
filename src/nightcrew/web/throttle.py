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

At most ``MAX_IN_FLIGHT`` attempts are delayed or checked at once (more are answered 429),
so the right token waits at most its own address's backoff plus ``MAX_IN_FLIGHT`` turns of the
gate. State is this process's memory: at most ``MAX_ADDRESSES`` addresses, the least recently
failed forgotten first, and an address forgotten ``FORGET_AFTER_SECONDS`` after its last failure.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FAILED_LOGIN_DELAY_SECONDS = 0.5
ADDRESS_BACKOFF_MAX_SECONDS = 8.0
MAX_IN_FLIGHT = 64
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
        max_addresses: int = MAX_ADDRESSES,
        forget_after: float = FORGET_AFTER_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failure_delay = failure_delay
        self._backoff_max = backoff_max
        self._max_in_flight = max_in_flight
        self._max_addresses = max_addresses
        self._forget_after = forget_after
        self._monotonic = monotonic
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._in_flight: set[str] = set()
        self._next_check = 0.0
        # created on first use, inside the serving event loop
        self._gate: asyncio.Lock | None = None

    @property
    def addresses_remembered(self) -> int:
        return len(self._failures)

    async def attempt(self, client_host: str | None, check: Callable[[], bool]) -> Verdict:
        """Run ``check`` (the token comparison) under the rules above."""
        key = address_key(client_host)
        if key in self._in_flight or len(self._in_flight) >= self._max_in_flight:
            return Verdict.BUSY
        self._in_flight.add(key)
        try:
            self._forget_old()
            if (known := self._failures.get(key)) is not None:
                await asyncio.sleep(max(0.0, known.not_before - self._monotonic()))
            if self._gate is None:
                self._gate = asyncio.Lock()
            async with self._gate:
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
