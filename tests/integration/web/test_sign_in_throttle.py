"""The sign-in throttle on its own, in real (shortened) time: wrong tokens are checked at most
once per delay overall, one attempt per address at a time, with a per-address backoff that the
right token clears; memory stays bounded."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from nightcrew.web.throttle import SignInThrottle, Verdict, address_key, network_key

DELAY = 0.1


def _wrong(checked: list[float]) -> bool:
    checked.append(time.monotonic())
    return False


def _within_two_turns(checked: list[float], started: float, accepted: float) -> None:
    """Answered within two turns of the gate, counted rather than timed (a loaded machine makes
    each turn slower, not more of them): at most the wrong token being checked when it came and
    the one whose turn was next went first; and far from what a queue of 64 takes."""
    went_first = [t for t in checked if started < t < accepted]
    assert len(went_first) <= 2, len(went_first)
    assert accepted - started < 10 * DELAY, accepted - started


async def _accepted_amid(
    attackers: list[asyncio.Task[Any]], checked: list[float], attempt: Awaitable[Verdict]
) -> None:
    """The operator's ``attempt``, made while ``attackers`` guess, is accepted within two turns;
    then the attackers are stopped."""
    started = time.monotonic()
    assert await attempt is Verdict.ACCEPTED
    accepted = time.monotonic()
    for task in attackers:
        task.cancel()
    await asyncio.gather(*attackers, return_exceptions=True)
    _within_two_turns(checked, started, accepted)


async def test_wrong_tokens_from_many_addresses_are_checked_one_delay_apart() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=64, network_in_flight=64)
    checked: list[float] = []
    started = time.monotonic()
    verdicts = await asyncio.gather(
        *(throttle.attempt(f"127.0.0.{i}", lambda: _wrong(checked)) for i in range(1, 21))
    )
    took = time.monotonic() - started
    assert verdicts == [Verdict.REFUSED] * 20
    gaps = [b - a for a, b in itertools.pairwise(checked)]
    assert min(gaps) >= DELAY * 0.95, gaps
    assert took >= 20 * DELAY * 0.95  # the last answer also waits its own delay


async def test_one_attempt_per_address_at_a_time_and_the_rest_are_not_checked() -> None:
    throttle = SignInThrottle(failure_delay=DELAY)
    checked: list[float] = []
    verdicts = await asyncio.gather(
        *(throttle.attempt("192.0.2.7", lambda: _wrong(checked)) for _ in range(10))
    )
    assert verdicts.count(Verdict.REFUSED) == 1 and verdicts.count(Verdict.BUSY) == 9
    assert len(checked) == 1


async def test_an_address_backs_off_doubling_up_to_the_cap_and_the_right_token_clears_it() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, backoff_max=0.4)
    checked: list[float] = []
    for _ in range(5):
        assert await throttle.attempt("192.0.2.7", lambda: _wrong(checked)) is Verdict.REFUSED
    gaps = [b - a for a, b in itertools.pairwise(checked)]
    # from one failure to the next check: the backoff (0.1, 0.2, 0.4, then capped at 0.4),
    # which the wrong answer's own delay is part of
    for gap, backoff in zip(gaps, [0.1, 0.2, 0.4, 0.4], strict=True):
        assert backoff * 0.95 <= gap < backoff + 0.1, gaps
    started = time.monotonic()
    assert await throttle.attempt("192.0.2.7", lambda: True) is Verdict.ACCEPTED
    assert time.monotonic() - started < 0.4 + 0.15  # at most the capped backoff
    started = time.monotonic()
    assert await throttle.attempt("192.0.2.7", lambda: _wrong(checked)) is Verdict.REFUSED
    assert checked[-1] - started < 0.05  # the backoff started over
    assert throttle.addresses_remembered == 1


async def test_the_right_token_from_another_address_gets_in_during_an_attack() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=64)
    checked: list[float] = []
    attack = [
        asyncio.create_task(throttle.attempt(f"10.0.0.{i}", lambda: _wrong(checked)))
        for i in range(1, 6)
    ]
    await asyncio.sleep(0.01)
    started = time.monotonic()
    assert await throttle.attempt("10.9.9.9", lambda: True) is Verdict.ACCEPTED
    waited = time.monotonic() - started
    await asyncio.gather(*attack)
    assert waited < 6 * DELAY + 0.1  # its turn at the gate, behind the five queued before it


async def test_a_guesser_that_hangs_up_does_not_shorten_the_gate() -> None:
    throttle = SignInThrottle(failure_delay=DELAY)
    checked: list[float] = []
    was_checked = asyncio.Event()

    def wrong_and_say_so() -> bool:
        was_checked.set()
        return _wrong(checked)

    first = asyncio.create_task(throttle.attempt("10.0.0.1", wrong_and_say_so))
    await was_checked.wait()
    first.cancel()  # it knows "no answer yet" — but the next check still waits
    await asyncio.gather(first, return_exceptions=True)
    assert await throttle.attempt("10.0.0.2", lambda: _wrong(checked)) is Verdict.REFUSED
    assert checked[1] - checked[0] >= DELAY * 0.95


async def test_too_many_attempts_in_flight_are_busy() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=3)
    checked: list[float] = []
    verdicts = await asyncio.gather(
        *(throttle.attempt(f"10.0.0.{i}", lambda: _wrong(checked)) for i in range(1, 6))
    )
    assert verdicts.count(Verdict.BUSY) == 2 and len(checked) == 3


async def test_memory_is_bounded_by_count_and_by_age() -> None:
    now = [1000.0]
    throttle = SignInThrottle(
        failure_delay=0.0, max_addresses=3, forget_after=60.0, monotonic=lambda: now[0]
    )
    for i in range(1, 6):
        await throttle.attempt(f"10.0.0.{i}", lambda: False)
    assert throttle.addresses_remembered == 3
    now[0] += 61.0
    await throttle.attempt("10.0.0.9", lambda: True)
    assert throttle.addresses_remembered == 0


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),  # one host holds the whole /64
        ("::ffff:192.0.2.7", "192.0.2.7"),
        (None, "?"),
        ("testclient", "testclient"),
    ],
)
def test_addresses_are_counted_per_host_and_per_ipv6_64(host: str | None, key: str) -> None:
    assert address_key(host) == key


async def test_a_fresh_address_goes_before_64_addresses_that_keep_guessing() -> None:
    """64 addresses, each with failures on record, guess again and again; a right token from
    an address that never failed is checked at the next turn of the gate, not behind them."""
    throttle = SignInThrottle(failure_delay=DELAY, backoff_max=DELAY, max_in_flight=80)
    checked: list[float] = []
    guessers = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(64)]
    for address in guessers:  # each has failed once before: no longer fresh
        throttle._failed(address, network_key(address))

    async def keep_guessing(address: str) -> None:
        while True:
            if await throttle.attempt(address, lambda: _wrong(checked)) is Verdict.BUSY:
                await asyncio.sleep(DELAY / 4)  # told to wait: a patient guesser

    attack = [asyncio.create_task(keep_guessing(a)) for a in guessers]
    await asyncio.sleep(5 * DELAY)  # every guesser queued at the gate
    # one turn, not 64
    await _accepted_amid(attack, checked, throttle.attempt("192.0.2.99", lambda: True))
    gaps = [b - a for a, b in itertools.pairwise(checked)]
    assert min(gaps) >= DELAY * 0.95  # the overall rate held all the while


async def test_guessers_that_failed_cannot_take_the_room_kept_for_fresh_addresses() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=6, fresh_reserve=2)
    checked: list[float] = []
    for i in range(1, 7):
        await throttle.attempt(f"10.0.0.{i}", lambda: _wrong(checked))
    verdicts = await asyncio.gather(
        *(throttle.attempt(f"10.0.0.{i}", lambda: _wrong(checked)) for i in range(1, 7)),
        throttle.attempt("192.0.2.1", lambda: True),
        throttle.attempt("192.0.2.2", lambda: True),
    )
    assert verdicts[:6].count(Verdict.BUSY) == 2  # 4 of the 6 that failed got room
    assert verdicts[6:] == [Verdict.ACCEPTED, Verdict.ACCEPTED]


async def test_a_waiter_cancelled_at_the_gate_passes_its_turn_on() -> None:
    throttle = SignInThrottle(failure_delay=DELAY)
    checked: list[float] = []
    first = asyncio.create_task(throttle.attempt("10.0.0.1", lambda: _wrong(checked)))
    second = asyncio.create_task(throttle.attempt("10.0.0.2", lambda: _wrong(checked)))
    await asyncio.sleep(DELAY / 4)  # the first holds the gate, the second waits for it
    second.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert await asyncio.wait_for(throttle.attempt("10.0.0.3", lambda: True), 1) is (
        Verdict.ACCEPTED
    )


@pytest.mark.parametrize(
    ("host", "network"),
    [
        ("192.0.2.7", "192.0.2.0/24"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1::/48"),
        ("::ffff:192.0.2.7", "192.0.2.0/24"),
        ("testclient", "testclient"),
    ],
)
def test_networks_are_ipv4_24s_and_ipv6_48s(host: str, network: str) -> None:
    assert network_key(host) == network


async def test_a_wave_of_first_guesses_queued_before_the_operator_ranks_behind_it() -> None:
    """64 addresses of one network each send a first wrong token at once; the operator, on
    another network, arrives after them and is checked within two turns, not behind 64."""
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=80, network_in_flight=80)
    checked: list[float] = []
    wave = [
        asyncio.create_task(throttle.attempt(f"198.51.100.{i}", lambda: _wrong(checked)))
        for i in range(1, 65)
    ]
    await asyncio.sleep(DELAY / 2)  # every guess is queued, the first one checked
    await _accepted_amid(wave, checked, throttle.attempt("203.0.113.5", lambda: True))


async def test_one_network_holds_at_most_its_share_of_places() -> None:
    throttle = SignInThrottle(failure_delay=DELAY, network_in_flight=3)
    checked: list[float] = []
    verdicts = await asyncio.gather(
        *(throttle.attempt(f"198.51.100.{i}", lambda: _wrong(checked)) for i in range(1, 7)),
        throttle.attempt("203.0.113.5", lambda: True),
    )
    assert verdicts[:6].count(Verdict.BUSY) == 3 and len(checked) == 3
    assert verdicts[6] is Verdict.ACCEPTED


async def test_a_fresh_network_pushes_out_a_waiting_guess_when_every_place_is_taken() -> None:
    """Guessers on ever new networks fill every place; each fails in turn, and an attempt from
    a network that has not failed takes the place of one of theirs still waiting (answered
    429), instead of being answered 429 itself."""
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=6, fresh_reserve=0)
    checked: list[float] = []
    guesses = [
        asyncio.create_task(throttle.attempt(f"198.51.{i}.1", lambda: _wrong(checked)))
        for i in range(6)
    ]
    await asyncio.sleep(DELAY / 2)  # the first has failed (its answer held back), the rest wait
    # one of them has wrong tokens on record from before (its network is failing): its
    # waiting guess is the one pushed out
    throttle._failed("198.51.5.1", network_key("198.51.5.1"))
    started = time.monotonic()
    assert await throttle.attempt("203.0.113.5", lambda: True) is Verdict.ACCEPTED
    waited = time.monotonic() - started
    verdicts = await asyncio.gather(*guesses)
    assert Verdict.BUSY in verdicts  # the pushed-out guess
    # admitted, not 429; at the gate behind at most the guesses of networks not failed yet
    assert waited < len(guesses) * DELAY + 0.1, waited
    # and an attempt from a failing network never pushes anyone out
    throttle2 = SignInThrottle(failure_delay=DELAY, max_in_flight=2, fresh_reserve=0)
    held = [
        asyncio.create_task(throttle2.attempt(f"198.51.{i}.1", lambda: _wrong(checked)))
        for i in range(2)
    ]
    await asyncio.sleep(DELAY / 4)
    throttle2._failed("198.51.9.1", network_key("198.51.9.1"))
    assert await throttle2.attempt("198.51.9.1", lambda: True) is Verdict.BUSY
    await asyncio.gather(*held)


async def test_an_address_with_no_wrong_token_of_its_own_is_never_pushed_out() -> None:
    """The operator on a network a guesser shares waits with it, but is not pushed out for a
    fresh network's attempt: only an address with wrong tokens of its own is."""
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=2, fresh_reserve=0)
    checked: list[float] = []
    throttle._failed("198.51.7.9", network_key("198.51.7.9"))  # the guesser beside it
    first = asyncio.create_task(throttle.attempt("198.51.7.1", lambda: _wrong(checked)))
    operator = asyncio.create_task(throttle.attempt("198.51.7.2", lambda: True))
    await asyncio.sleep(DELAY / 4)
    assert await throttle.attempt("203.0.113.5", lambda: True) is Verdict.BUSY
    assert await operator is Verdict.ACCEPTED
    await first


async def test_a_known_device_goes_before_a_wave_of_first_guesses_from_fresh_networks() -> None:
    """64 fresh networks each send one first guess at once: each ranks with an operator on a
    new browser, who waits behind them; the operator's browser that signed in before (its
    device cookie) is checked within one turn, and has places of its own when all are taken."""

    async def operator(throttle: SignInThrottle, *, known_device: bool) -> tuple[float, int]:
        """How long the operator waited, and how many wrong tokens were checked meanwhile."""
        checked: list[float] = []
        wave = [
            asyncio.create_task(throttle.attempt(f"198.{i}.100.1", lambda: _wrong(checked)))
            for i in range(64)
        ]
        await asyncio.sleep(DELAY / 2)  # every guess is queued or checked
        started = time.monotonic()
        verdict = await throttle.attempt(
            "203.0.113.5", lambda: True, device="d1" if known_device else None
        )
        accepted = time.monotonic()
        for task in wave:
            task.cancel()
        await asyncio.gather(*wave, return_exceptions=True)
        assert verdict is Verdict.ACCEPTED
        return accepted - started, len([t for t in checked if started < t < accepted])

    # every place taken by the wave (max_in_flight 64, no fresh reserve left for anyone)
    roomy = dict(failure_delay=DELAY, max_in_flight=64, fresh_reserve=0)
    device, before_device = await operator(SignInThrottle(**roomy), known_device=True)
    assert before_device <= 2 and device < 10 * DELAY, (before_device, device)
    new_browser, _ = await operator(
        SignInThrottle(failure_delay=DELAY, max_in_flight=80), known_device=False
    )
    assert new_browser > 10 * DELAY, new_browser  # behind the wave: what the cookie buys


async def test_a_known_device_that_guessed_wrong_ranks_as_any_other() -> None:
    """A stolen device cookie buys one early turn: once the device has sent a wrong token, its
    attempts take the ordinary places by address (none left here: 429) and not the device
    reserve, which another known device still gets in through."""
    throttle = SignInThrottle(failure_delay=DELAY, max_in_flight=1, fresh_reserve=0)
    checked: list[float] = []
    wrong = await throttle.attempt("203.0.113.5", lambda: _wrong(checked), device="stolen")
    assert wrong is Verdict.REFUSED and throttle.addresses_remembered == 1
    holder = asyncio.create_task(throttle.attempt("198.51.100.1", lambda: _wrong(checked)))
    await asyncio.sleep(0)  # the one ordinary place is taken
    assert await throttle.attempt("203.0.113.5", lambda: True, device="stolen") is Verdict.BUSY
    assert await throttle.attempt("203.0.113.9", lambda: True, device="own") is Verdict.ACCEPTED
    await holder
    # the device reserve is its size: a second device at once is busy, not queued
    small = SignInThrottle(failure_delay=DELAY, device_reserve=1)
    first = asyncio.create_task(small.attempt("203.0.113.6", lambda: True, device="a"))
    await asyncio.sleep(0)
    assert await small.attempt("203.0.113.7", lambda: True, device="b") is Verdict.BUSY
    assert await first is Verdict.ACCEPTED


async def test_a_guesser_at_the_operators_address_does_not_hold_out_its_known_device() -> None:
    """Four guessing loops behind the operator's own address (a NAT, an IPv6 /64) keep an
    attempt of that address in flight all the time: a sign-in from it without a device cookie
    is answered 429; the operator's browser with its device cookie gets in within a turn."""
    throttle = SignInThrottle(failure_delay=DELAY)
    checked: list[float] = []
    stop = asyncio.Event()

    async def guessing() -> None:
        while not stop.is_set():
            await throttle.attempt("203.0.113.5", lambda: _wrong(checked))
            await asyncio.sleep(0)

    loops = [asyncio.create_task(guessing()) for _ in range(4)]
    await asyncio.sleep(3 * DELAY)  # the address has failed, and always has one in flight
    assert await throttle.attempt("203.0.113.5", lambda: True) is Verdict.BUSY
    started = time.monotonic()
    assert await throttle.attempt("203.0.113.5", lambda: True, device="own") is Verdict.ACCEPTED
    accepted = time.monotonic()
    stop.set()
    await asyncio.gather(*loops)
    _within_two_turns(checked, started, accepted)
