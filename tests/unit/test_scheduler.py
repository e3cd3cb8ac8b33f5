from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nightcrew.scheduler import next_slot


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        (
            "* * * * *",
            datetime(2026, 11, 29, 4, 0, 0, tzinfo=UTC),
            datetime(2026, 11, 29, 4, 1, tzinfo=UTC),
        ),
        (
            "* * * * *",
            datetime(2026, 11, 29, 4, 0, 59, 999000, tzinfo=UTC),
            datetime(2026, 11, 29, 4, 1, tzinfo=UTC),
        ),
        (
            "0 4 * * *",
            datetime(2026, 11, 29, 4, 0, 1, tzinfo=UTC),
            datetime(2026, 11, 30, 4, 0, tzinfo=UTC),
        ),
        (
            "0 4 * * *",
            datetime(2026, 11, 29, 3, 59, 59, tzinfo=UTC),
            datetime(2026, 11, 29, 4, 0, tzinfo=UTC),
        ),
    ],
)
def test_next_slot_is_strictly_after(cron: str, after: datetime, expected: datetime) -> None:
    slot = next_slot(cron, after)
    assert slot == expected and slot.tzinfo is not None
