"""What one overage sweep did: its report, and the tally it is made from."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from nightcrew.reports import Failure


@dataclass(frozen=True, kw_only=True, slots=True)
class EscalationReport:
    scanned: int = 0
    armed: int = 0
    emails_sent: int = 0
    suspended_accounts: int = 0
    suspended_podcasts: int = 0
    restored_accounts: int = 0
    restored_podcasts: int = 0
    claims: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)
    # who was restored, so the run history (and the dashboard) can say it
    restored: list[dict[str, Any]] = field(default_factory=list)
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

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "claims": self.claims,
            "emails": self.emails,
            "restored": self.restored,
            "errors": self.errors,
        }


# What a sweep counts besides its lists (emails sent and accounts restored are their lengths).
Count = Literal["armed", "suspended_accounts", "suspended_podcasts", "restored_podcasts"]


@dataclass(slots=True)
class Tally:
    """What a sweep has done so far; frozen into its EscalationReport when the sweep ends."""

    counts: Counter[Count] = field(default_factory=Counter)
    claims: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)
    restored: list[dict[str, Any]] = field(default_factory=list)
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
