"""The one source of "now".

Every time-based decision takes ``now`` from a Clock so a test (or ``--now``) can walk days in a
second. Nothing else in nightcrew calls ``datetime.now()``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware, in UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told to: ``--now`` and tests."""

    def __init__(self, at: datetime) -> None:
        self._at = _require_aware(at)

    def now(self) -> datetime:
        return self._at

    def set(self, at: datetime) -> None:
        self._at = _require_aware(at)

    def advance(self, delta: timedelta) -> None:
        self._at = self._at + delta


class SlotClock:
    """A scheduled run's clock: ``now()`` is the slot instant — every decision (cooldowns,
    thresholds, due dates) is taken as of the slot, whatever the timer's jitter — while
    ``wall_now()`` is real time, for what must not be back-dated: claims with a lease (an
    effect's ``claimed_until``), delivery and settle times."""

    def __init__(self, slot: datetime, wall: Clock) -> None:
        self._slot = _require_aware(slot)
        self._wall = wall

    def now(self) -> datetime:
        return self._slot

    def wall_now(self) -> datetime:
        return self._wall.now()


def wall_now(clock: Clock) -> datetime:
    """Real time: a SlotClock's wall clock, any other clock's now()."""
    return clock.wall_now() if isinstance(clock, SlotClock) else clock.now()


EARLIEST_YEAR = 1970
LATEST_YEAR = 9000


def parse_instant(text: str) -> datetime:
    """Parse an ISO 8601 instant with an explicit offset (``Z`` or ``+02:00``).

    A naive time is refused: "04:00" means nothing without a zone, and guessing one is how a
    deletion runs a day early.
    """
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(f"not an ISO 8601 instant: {text!r}") from exc
    if value.tzinfo is None or value.utcoffset() is None:
        # the hint is itself accepted: a date alone gets its midnight ("2026-11-29Z" is not ISO)
        shown = value.isoformat()
        raise ValueError(f"{text!r} has no UTC offset; write it as e.g. {shown}Z or {shown}+00:00")
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        # a run's schedule, backoffs and retention windows add days to it: near datetime's
        # limits they overflow deep inside a job instead of here
        raise ValueError(f"{text!r} is outside the years {EARLIEST_YEAR}-{LATEST_YEAR}")
    return value.astimezone(UTC)


def _require_aware(at: datetime) -> datetime:
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("a Clock needs a timezone-aware datetime")
    return at.astimezone(UTC)
