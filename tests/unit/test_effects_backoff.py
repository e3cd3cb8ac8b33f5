"""Backoff of effect retries: 30 s doubling to a cap of 30 min, with a bounded jitter."""

from __future__ import annotations

from datetime import timedelta

from nightcrew.effects.outbox import RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, retry_delay


def test_delays_double_from_30_seconds_to_the_30_minute_cap_within_the_jitter() -> None:
    for effect_id in range(200):
        for attempts in range(1, 15):
            base = min(RETRY_BASE_SECONDS * 2 ** (attempts - 1), RETRY_CAP_SECONDS)
            delay = retry_delay(effect_id, attempts)
            assert timedelta(seconds=0.8 * base) <= delay < timedelta(seconds=1.2 * base)


def test_jitter_spreads_effects_that_failed_together_and_is_reproducible() -> None:
    delays = {retry_delay(effect_id, 3) for effect_id in range(100)}
    assert len(delays) > 50
    assert retry_delay(7, 3) == retry_delay(7, 3)
