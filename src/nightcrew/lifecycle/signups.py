"""Daily lane, job 3: reap unconfirmed signups older than the retention.

An ``auth.users`` row without ``email_confirmed_at`` can never sign in and owns nothing; the
database function de-provisions and deletes every unconfirmed, never-invited one older than the
retention, skipping (with a WARNING, counted) any that a NO ACTION foreign key still holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightcrew.clock import Clock
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import JsonObject
from nightcrew.log import event
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

# Generous on purpose: the confirmation code lives 15 minutes; a person who comes back later
# simply signs up again.
UNCONFIRMED_USER_RETENTION_DAYS = 7


@dataclass(frozen=True, kw_only=True, slots=True)
class SignupsReport:
    deleted: int
    # users the platform's function left (they own an account): counted, not a skipped job
    reap_skipped: int
    retention_days: int = UNCONFIRMED_USER_RETENTION_DAYS

    @property
    def errors(self) -> list[Failure]:
        return []

    def counts(self) -> dict[str, int]:
        return {"users_reaped": self.deleted, "users_reap_skipped": self.reap_skipped}

    def to_json(self) -> JsonObject:
        return {**self.counts(), "retention_days": self.retention_days}


@dataclass(frozen=True, kw_only=True, slots=True)
class _Reaped:
    """The one row public.reap_unconfirmed_users returns."""

    deleted: int
    skipped: int


async def reap_unconfirmed_users(runtime: Runtime, clock: Clock) -> SignupsReport:
    """Failures propagate to the lane, which logs ``unconfirmed_users_reap_failed``."""
    reaped = await runtime.db.fetch_one_as(
        _Reaped,
        SQL["reap_unconfirmed_users"],
        {"retention_days": UNCONFIRMED_USER_RETENTION_DAYS, "now": clock.now()},
    )
    assert reaped is not None  # the function always returns one row
    report = SignupsReport(deleted=int(reaped.deleted), reap_skipped=int(reaped.skipped))
    event(
        "unconfirmed_users_reaped",
        deleted=report.deleted,
        skipped=report.reap_skipped,
        retention_days=report.retention_days,
    )
    return report
