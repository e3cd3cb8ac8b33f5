"""The daily lane's storage-reconciler job: the safe subset, in its own isolation."""

from __future__ import annotations

from dataclasses import dataclass, field

from nightcrew.clock import Clock
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle.reconcile.core import SCHEDULED_OPTIONS
from nightcrew.lifecycle.reconcile.engine import run_reconcile
from nightcrew.lifecycle.reconcile.feed_drain import drain_feed_outbox
from nightcrew.lifecycle.reconcile.records import OutboxDrain, ReconcileReport, ReconcileUnavailable
from nightcrew.log import event, warning
from nightcrew.reports import Failure
from nightcrew.runtime import Runtime


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledReconcileReport:
    report: ReconcileReport | None = None  # None: skipped
    skipped: str | None = None
    outbox: OutboxDrain | None = None  # a skipped reconciler's outbox drain
    errors: list[Failure] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        s = self.report.summary() if self.report else None
        return {
            "reconcile_size_written": s.size_written if s else 0,
            "reconcile_orphans_deleted": s.orphans_deleted if s else 0,
            "reconcile_over_cap_accounts": s.over_cap_accounts if s else 0,
            "reconcile_outbox_drained": (
                s.outbox_drained if s else self.outbox.delivered if self.outbox else 0
            ),
        }

    def to_json(self) -> JsonObject:
        if self.report is None:
            skipped: JsonObject = {"skipped": self.skipped}
            if self.outbox is not None:
                skipped["outbox"] = self.outbox.to_json()
            return skipped
        return {**self.counts(), "report": self.report.to_json()}


async def scheduled_reconcile(runtime: Runtime, clock: Clock) -> ScheduledReconcileReport:
    """mode=apply, backfill on, orphan sweep at 24 h; never quarantine, never the cap bypass.
    A throw becomes ``scheduled_reconcile_failed`` in the lane; the rest of the lane goes on."""
    try:
        report = await run_reconcile(runtime, clock, SCHEDULED_OPTIONS)
    except ReconcileUnavailable as exc:
        warning("scheduled_reconcile_skipped", reason=str(exc))
        # The invalidation-outbox drain needs no object store: spec 000 runs it on every apply
        # run, and it is the only thing that revives an intent whose effect died.
        outbox = await drain_feed_outbox(runtime, clock, clock.now())
        return ScheduledReconcileReport(
            skipped=str(exc), outbox=outbox, errors=list(outbox.failures)
        )
    event("scheduled_reconcile", **report.summary().to_json())
    # each entry carries its event (reconcile_quarantine_failed, reconcile_delete_failed, an
    # outbox delivery's), logged where it happened
    return ScheduledReconcileReport(report=report, errors=report.errors)
