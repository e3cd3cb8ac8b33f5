from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nightcrew.clock import FrozenClock, SystemClock, parse_instant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T04:00:00Z", datetime(2026, 11, 29, 4, tzinfo=UTC)),
        ("2026-11-29T06:00:00+02:00", datetime(2026, 11, 29, 4, tzinfo=UTC)),
        (" 2026-11-29T04:00:00.5+00:00 ", datetime(2026, 11, 29, 4, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_parse_instant_normalises_to_utc(text: str, expected: datetime) -> None:
    parsed = parse_instant(text)
    assert parsed == expected and parsed.tzinfo == UTC


def test_a_naive_instant_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_instant("2026-11-29T04:00:00")


@pytest.mark.parametrize("text", ["2026-11-29", "2026-11-29T04:00", "2026-11-29T04:00:00.5"])
def test_the_hint_for_a_naive_instant_is_itself_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="no UTC offset") as refused:
        parse_instant(text)
    hinted = str(refused.value).split("write it as e.g. ")[1].split(" or ")
    assert len(hinted) == 2
    for hint in hinted:
        assert parse_instant(hint).replace(tzinfo=None) == datetime.fromisoformat(text)


@pytest.mark.parametrize(
    "text", ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z"]
)
def test_instants_outside_1970_to_9000_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="outside the years 1970-9000"):
        parse_instant(text)


def test_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="not an ISO 8601 instant"):
        parse_instant("yesterday")


def test_frozen_clock_moves_only_when_told() -> None:
    clock = FrozenClock(datetime(2026, 1, 1, tzinfo=UTC))
    assert clock.now() == clock.now()
    clock.advance(timedelta(days=30))
    assert clock.now() == datetime(2026, 1, 31, tzinfo=UTC)
    with pytest.raises(ValueError):
        FrozenClock(datetime(2026, 1, 1))


def test_system_clock_is_aware_utc() -> None:
    assert SystemClock().now().utcoffset() == timedelta(0)
