"""What one overage sweep did: its report, and the tally it is made from."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from nightcrew.jsonable import Jsonable, named
from nightcrew.reports import Failure

# The report's members are the spec's snake_case names: a two-word field names itself.


@dataclass(frozen=True, kw_only=True, slots=True)
class StageClaim(Jsonable):
    """A stage an account's email claimed (the advance-once guard matched)."""

    account_id: str = named("account_id")
    stage: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SentEmail(Jsonable):
    """A stage's email, confirmed sent by this caller."""

    account_id: str = named("account_id")
    stage: int | str  # 0-4, or "restored"
    to: str
    idempotency_key: str = named("idempotency_key")


@dataclass(frozen=True, kw_only=True, slots=True)
class Restored(Jsonable):
    """An account restored: its feeds serve again (the dashboard's overage page lists them)."""

    account_id: str = named("account_id")
    since: str | None  # the clock it was on (ISO 8601), None when it was stamped but not armed
    podcasts: list[str]  # the slugs restored


@dataclass(frozen=True, kw_only=True, slots=True)
class EscalationReport(Jsonable):
    scanned: int = 0
    armed: int = 0
    emails_sent: int = named("emails_sent", default=0)
    suspended_accounts: int = named("suspended_accounts", default=0)
    suspended_podcasts: int = named("suspended_podcasts", default=0)
    restored_accounts: int = named("restored_accounts", default=0)
    restored_podcasts: int = named("restored_podcasts", default=0)
    claims: list[StageClaim] = field(default_factory=list)
    emails: list[SentEmail] = field(default_factory=list)
    # who was restored, so the run history (and the dashboard) can say it
    restored: list[Restored] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "scanned": self.scanned,
            "armed": self.armed,
            "emails_sent": self.emails_sent,
            "suspended_accounts": self.suspended_accounts,
            "suspended_podcasts": self.suspended_podcasts,
            "restored_accounts": self.restored_accounts,
            "restored_podcasts": self.restored_podcasts,
        }


# What a sweep counts besides its lists (emails sent and accounts restored are their lengths).
Count = Literal["armed", "suspended_accounts", "suspended_podcasts", "restored_podcasts"]


@dataclass(slots=True)
class Tally:
    """What a sweep has done so far; frozen into its EscalationReport when the sweep ends."""

    counts: Counter[Count] = field(default_factory=Counter)
    claims: list[StageClaim] = field(default_factory=list)
    emails: list[SentEmail] = field(default_factory=list)
    restored: list[Restored] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)

    def report(self, *, scanned: int) -> EscalationReport:
        return EscalationReport(
            scanned=scanned,
            armed=self.counts["armed"],
            emails_sent=len(self.emails),
            suspended_accounts=self.counts["suspended_accounts"],
            suspended_podcasts=self.counts["suspended_podcasts"],
            restored_accounts=len(self.restored),
            restored_podcasts=self.counts["restored_podcasts"],
            claims=self.claims,
            emails=self.emails,
            restored=self.restored,
            errors=self.errors,
        )
