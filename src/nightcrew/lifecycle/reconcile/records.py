"""What the storage reconciler reports: one record per phase, and the run's report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from nightcrew.errors import ConfigError
from nightcrew.jsonable import Jsonable, JsonObject, omitted
from nightcrew.lifecycle.reconcile.core import (
    SAMPLE_KEYS,
    ReconcileOptions,
)
from nightcrew.reports import Failure

Progress = Callable[[str, int], None]


class ReconcileUnavailable(ConfigError):
    """The reconciler cannot run here (e.g. R2_PUBLIC_URL is unset); the message says why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Listing:
    """What the listing saw, and how fast."""

    objects: int
    bytes: int
    list_requests: int
    partitions: int
    list_concurrency: int
    objects_per_second: int
    kinds: Mapping[str, int]  # objects per ObjectKind

    def to_json(self) -> dict[str, int]:
        # the kinds' counts are members of the listing's object itself, beside its totals
        return {
            "objects": self.objects,
            "bytes": self.bytes,
            "listRequests": self.list_requests,
            "partitions": self.partitions,
            "listConcurrency": self.list_concurrency,
            "objectsPerSecond": self.objects_per_second,
            **self.kinds,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeSample(Jsonable):
    episode_id: str
    key: str
    recorded: int | None
    measured: int


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockedWrite(Jsonable):
    """A measured size the storage cap trigger refused (23514): listed, never fatal."""

    episode_id: str
    podcast_id: str
    measured: int
    error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ForeignUrl(Jsonable):
    """An episode whose audio_url is not under R2_PUBLIC_URL: no key, so no size measured."""

    episode_id: str
    audio_url: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """How the enclosures' objects were measured: by the listing of ``podcasts/`` (every layout
    under it), by a HEAD per key outside it (legacy keys), and which URLs name no key of ours."""

    keyed: int = 0  # enclosures under R2_PUBLIC_URL whose key could be derived
    by_head: int = 0
    unmeasured: int = 0  # keyed, neither listed nor found by a HEAD: the missing check's
    heads: int = 0  # HEAD requests: one per distinct key outside the listing
    not_under_public_url: int = 0
    not_under_public_url_sample: tuple[ForeignUrl, ...] = ()

    @property
    def by_listing(self) -> int:
        return self.keyed - self.by_head - self.unmeasured


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeBackfill:
    checked: int = 0
    mismatched: int = 0
    written: int = 0
    blocked_over_cap: tuple[BlockedWrite, ...] = ()
    sample: tuple[SizeSample, ...] = ()
    cap_bypass_fallback: bool | None = None  # None: the bypass was not asked for
    measured: Measured = field(default_factory=Measured)

    def to_json(self) -> JsonObject:
        # how the sizes were measured is flattened into this object, and the bypass's fallback
        # is a member only when the bypass was asked for
        body: JsonObject = {
            "checked": self.checked,
            "mismatched": self.mismatched,
            "written": self.written,
            "measuredByListing": self.measured.by_listing,
            "measuredByHead": self.measured.by_head,
            "heads": self.measured.heads,
            "notUnderPublicUrl": self.measured.not_under_public_url,
            "notUnderPublicUrlSample": [
                u.to_json() for u in self.measured.not_under_public_url_sample
            ],
            "blockedOverCap": [b.to_json() for b in self.blocked_over_cap],
            "sample": [s.to_json() for s in self.sample],
        }
        if self.cap_bypass_fallback is not None:
            body["capBypassFallback"] = self.cap_bypass_fallback
        return body


@dataclass(frozen=True, kw_only=True, slots=True)
class MissingSample(Jsonable):
    episode_id: str
    key: str
    status: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Missing:
    count: int = 0
    candidates: int = 0  # not in the listing, each HEADed: the missing and the late uploads
    quarantined: int = 0
    sample: tuple[MissingSample, ...] = ()
    failures: tuple[Failure, ...] = ()  # one per episode whose quarantine rolled back

    def to_json(self) -> JsonObject:
        # counts the failures (each one is in the run's errors) and leaves the candidates out
        return {
            "count": self.count,
            "quarantined": self.quarantined,
            "sample": [s.to_json() for s in self.sample],
            "quarantineFailed": len(self.failures),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxDrain(Jsonable):
    pending: int  # undelivered intents left in the table after the drain: still owed
    delivered: int
    failed: int  # failed deliveries (each also in the run's errors)
    dead: int  # of the failed, the effects that died (revived by the next apply run)
    revived: int = 0  # earlier effects made due again (dead, or waiting out a backoff)
    # in the run's errors, not in this object
    failures: tuple[Failure, ...] = omitted(default=(), compare=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class OrphanSample:
    key: str
    size: int
    last_modified: datetime

    def to_json(self) -> JsonObject:
        # an ISO string here, whoever serialises the report (a derived one would leave the
        # datetime to the caller's json.dumps)
        return {"key": self.key, "size": self.size, "lastModified": self.last_modified.isoformat()}


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    """One orphan category's tally."""

    kind: str = ""
    found: int = 0
    bytes: int = 0
    too_young: int = 0
    protected: int = 0
    eligible: int = 0
    referenced_at_recheck: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    failed: Mapping[str, str] = field(default_factory=dict)  # key → the store's refusal
    sample: tuple[OrphanSample, ...] = ()

    def error(self) -> Failure | None:
        """The sweep's one error entry: its failed deletes, summed (each key is in the report)."""
        if not self.failed:
            return None
        return {
            "event": "reconcile_delete_failed",
            "kind": self.kind,
            "failed": len(self.failed),
            "error": next(iter(self.failed.values())),
        }

    def to_json(self, *, protected_key: str | None = None) -> JsonObject:
        # the spec's names (count, skippedReferenced) and derived members (failed, failedKeys),
        # and the protected count only under the name the caller's category gives it
        body: JsonObject = {
            "count": self.found,
            "bytes": self.bytes,
            "tooYoung": self.too_young,
            "eligible": self.eligible,
            "skippedReferenced": self.referenced_at_recheck,
            "deleted": self.deleted,
            "bytesDeleted": self.bytes_deleted,
            "failed": len(self.failed),
            "failedKeys": dict(list(self.failed.items())[:SAMPLE_KEYS]),
            "sample": [s.to_json() for s in self.sample],
        }
        if protected_key:
            body[protected_key] = self.protected
        return body


@dataclass(frozen=True, kw_only=True, slots=True)
class MediaJobs(Jsonable):
    """The media_jobs watchdog's result, run with the reconciler."""

    flagged: int
    job_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class OverCapAccount(Jsonable):
    account_id: str
    bytes: int
    cap_bytes: int
    over_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileSummary(Jsonable):
    """The spec's ``scheduled_reconcile`` fields, typed."""

    size_written: int
    orphans_deleted: int
    over_cap_accounts: int
    outbox_drained: int
    errors: int
    duration_ms: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileReport:
    """One run, assembled once at its end from each phase's own result."""

    options: ReconcileOptions
    now: datetime
    listing: Listing
    size_backfill: SizeBackfill
    missing: Missing
    outbox: OutboxDrain | None  # None: a dry run drains nothing
    orphans: Sweep
    episode_images: Sweep
    transcribe_prep: Sweep
    media_jobs: MediaJobs
    over_cap: tuple[OverCapAccount, ...]
    phases_ms: Mapping[str, float]  # where the time went
    duration_ms: float

    @property
    def errors(self) -> list[Failure]:
        """Quarantines that rolled back, the outbox's failed deliveries, then each sweep's
        failed deletes."""
        sweeps = (self.orphans, self.episode_images, self.transcribe_prep)
        return [
            *self.missing.failures,
            *(self.outbox.failures if self.outbox else ()),
            *(e for s in sweeps if (e := s.error()) is not None),
        ]

    def summary(self) -> ReconcileSummary:
        """The fields of the spec's scheduled_reconcile event."""
        return ReconcileSummary(
            size_written=self.size_backfill.written,
            orphans_deleted=self.orphans.deleted
            + self.episode_images.deleted
            + self.transcribe_prep.deleted,
            over_cap_accounts=len(self.over_cap),
            outbox_drained=self.outbox.delivered if self.outbox else 0,
            errors=len(self.errors),
            duration_ms=self.duration_ms,
        )

    def to_json(self) -> JsonObject:
        # the phases' own documents under the spec's names, the mode repeated at the top, the
        # phases' timings left out
        return {
            "mode": self.options.mode,
            "options": self.options.to_json(),
            "now": self.now.isoformat(),
            "summary": self.summary().to_json(),
            "listing": self.listing.to_json(),
            "sizeBackfill": self.size_backfill.to_json(),
            "missing": self.missing.to_json(),
            "outbox": self.outbox.to_json() if self.outbox else {},
            "orphans": self.orphans.to_json(protected_key="protectedPendingInvalidation"),
            "episodeImages": self.episode_images.to_json(),
            "transcribePrep": self.transcribe_prep.to_json(),
            "mediaJobs": self.media_jobs.to_json(),
            "overCap": [a.to_json() for a in self.over_cap],
            "errors": self.errors,
            "durationMs": self.duration_ms,
        }
