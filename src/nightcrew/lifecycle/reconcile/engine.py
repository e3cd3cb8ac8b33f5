"""The storage reconciler's jobs (spec 000 "Storage Reconciliation").

One listing of ``podcasts/`` — partitioned by podcast prefix, RECONCILE_LIST_CONCURRENCY
partitions in flight — streams into a session temp table (COPY, one page of 1000 at a time), so
every job is a join and the store sees about N/1000 + prefixes list requests plus one request
per candidate: a HEAD per enclosure key outside ``podcasts/`` (a legacy layout the listing
cannot cover), a HEAD per missing-object candidate (it may have been uploaded after the listing
passed it) and a delete per batch of at most 1000 orphans. Memory stays flat: nothing holds more
than OVERLAP_PAGES listing pages or a batch of candidates.

What needs no listing overlaps with it: while the listers run, the session derives every
audio URL's key once (reconcile_refs), and the joins after the listing only match keys.
Comparing each podcast's partition as soon as it is listed is not done: a dry run's listing
lives in one rolled-back transaction that no second connection can read, so per-partition
joins would have to stop and restart the COPY on this one, for what is left after the keys:
at 100k the joins after the listing take 0.3 s of a 3.8 s dry run (bench.reconcile).

1. size backfill  — every enclosure's object, listed or HEADed, whatever its key's layout:
                    measured sizes where the recorded one is NULL or wrong (+ outbox intent for
                    a published episode), SIZE_WRITE_BATCH rows a statement and transaction;
                    a row the cap trigger refuses (23514) is listed, never fatal, and the rest
                    of its batch is written.
2. missing        — always reported; quarantined only with ``quarantine_missing``, one
                    transaction per episode.
3. outbox drain   — every apply run, over the confirmable ``?wait=1`` lane.
4. orphan sweeps  — audio (both audio columns), per-episode images, expired transcription prep;
                    age-guarded and re-checked against the database right before each delete.
Plus the over-cap report and the media_jobs watchdog's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from nightcrew.adapters.storage import ObjectStore, StoredObject
from nightcrew.clock import Clock
from nightcrew.db.database import Database, QueryError, Tx
from nightcrew.db.queries import load_queries
from nightcrew.effects import feed_outbox
from nightcrew.effects import outbox as effects_outbox
from nightcrew.effects.deliver import drain
from nightcrew.errors import ConfigError
from nightcrew.lifecycle.reconcile.core import (
    PREP_TTL_DAYS,
    SAMPLE_KEYS,
    ReconcileOptions,
    classify_key,
    public_prefix,
    size_needs_write,
)
from nightcrew.lifecycle.watchdogs import sweep_wedged_media_jobs
from nightcrew.log import describe_error, event, warning
from nightcrew.reports import Failure, one_item
from nightcrew.runtime import Runtime

SQL = load_queries(__file__)

DELETE_BATCH = 1000
# Size writes per statement and per transaction (the cap bypass's one transaction runs one
# statement per batch). A transaction's round trips cost more than its statement's rows, so
# 500 a batch write 10,000 sizes in 20 transactions; bounded, so that a batch holding a
# refused row costs a few more statements, and the locks a batch takes (its rows, the cap
# trigger's per-account advisory lock) are held for one short transaction.
SIZE_WRITE_BATCH = 500
LIST_PAGE = 1000
# The session's server settings (EXPLAIN ANALYZE at 1M rows, bench/reconcile_plans.py): the
# listing kept in memory, not in 8 MB of temp buffers; hash joins where the planner, misled by
# the prefix filter's estimate (0.5% of rows, really all), would probe the listing's index a
# million times (size backfill 15.5 → 7.8 s, missing 17.4 → 7.4 s). The connection is closed
# afterwards, so no pooled backend keeps the memory or the settings.
JOIN_SETTINGS = {"temp_buffers": "512MB", "work_mem": "64MB", "enable_nestloop": "off"}
# How an operator finds the reconciler's long session in pg_stat_activity (the pool's
# connections are "nightcrew").
SESSION_NAME = "nightcrew-reconcile"
REMOTE_LIST_CONCURRENCY = 16
# Listing pages buffered while the session derives the episodes' keys before its COPY starts:
# 64 pages of 1,000 objects, ~20 MB, enough for the listers to run through that work (100k
# episodes: 0.8 s of it, ~14k objects/s listed on local disk).
OVERLAP_PAGES = 64
HEAD_CONCURRENCY = 32
UUID_RE = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
# An apply run makes every undelivered feed_invalidation_outbox intent due (the oldest first),
# this many to a statement: an effect created for those without one, the effect revived for
# those whose effect died or waits out a backoff. One ?wait=1 call per podcast covers all of
# its intents. The drain then attempts them for up to OUTBOX_DRAIN_BUDGET_SECONDS (a daily run
# can wait longer than the minute lane's 40 s); what a longer outage leaves is due now, so the
# next minute's drain goes on with it.
OUTBOX_ADOPT_MAX = 5000
OUTBOX_DRAIN_BUDGET_SECONDS = 600.0
LOGGED_IDS_MAX = 20
CHECK_VIOLATION = "23514"
INSUFFICIENT_PRIVILEGE = "42501"

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
class SizeSample:
    episode_id: str
    key: str
    recorded: int | None
    measured: int

    def to_json(self) -> dict[str, Any]:
        return {
            "episodeId": self.episode_id,
            "key": self.key,
            "recorded": self.recorded,
            "measured": self.measured,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockedWrite:
    """A measured size the storage cap trigger refused (23514): listed, never fatal."""

    episode_id: str
    podcast_id: str
    measured: int
    error: str

    def to_json(self) -> dict[str, Any]:
        return {
            "episodeId": self.episode_id,
            "podcastId": self.podcast_id,
            "measured": self.measured,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ForeignUrl:
    """An episode whose audio_url is not under R2_PUBLIC_URL: no key, so no size measured."""

    episode_id: str
    audio_url: str

    def to_json(self) -> dict[str, Any]:
        return {"episodeId": self.episode_id, "audioUrl": self.audio_url}


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

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
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
class MissingSample:
    episode_id: str
    key: str
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"episodeId": self.episode_id, "key": self.key, "status": self.status}


@dataclass(frozen=True, kw_only=True, slots=True)
class Missing:
    count: int = 0
    candidates: int = 0  # not in the listing, each HEADed: the missing and the late uploads
    quarantined: int = 0
    sample: tuple[MissingSample, ...] = ()
    failures: tuple[Failure, ...] = ()  # one per episode whose quarantine rolled back

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "quarantined": self.quarantined,
            "sample": [s.to_json() for s in self.sample],
            "quarantineFailed": len(self.failures),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxDrain:
    pending: int  # undelivered intents left in the table after the drain: still owed
    delivered: int
    failed: int  # failed deliveries (each also in the run's errors)
    dead: int  # of the failed, the effects that died (revived by the next apply run)
    revived: int = 0  # earlier effects made due again (dead, or waiting out a backoff)
    failures: tuple[Failure, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, int]:
        return {
            "pending": self.pending,
            "delivered": self.delivered,
            "failed": self.failed,
            "dead": self.dead,
            "revived": self.revived,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class OrphanSample:
    key: str
    size: int
    last_modified: datetime

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self, *, protected_key: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
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
class MediaJobs:
    """The media_jobs watchdog's result, run with the reconciler."""

    flagged: int
    job_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"flagged": self.flagged, "jobIds": list(self.job_ids)}


@dataclass(frozen=True, kw_only=True, slots=True)
class OverCapAccount:
    account_id: str
    bytes: int
    cap_bytes: int
    over_bytes: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OverCapAccount:
        cap = int(row["cap_gb"] * 1_000_000_000)
        return cls(
            account_id=str(row["account_id"]),
            bytes=int(row["bytes"]),
            cap_bytes=cap,
            over_bytes=int(row["bytes"] - row["cap_gb"] * 1_000_000_000),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "accountId": self.account_id,
            "bytes": self.bytes,
            "capBytes": self.cap_bytes,
            "overBytes": self.over_bytes,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileSummary:
    """The spec's ``scheduled_reconcile`` fields, typed."""

    size_written: int
    orphans_deleted: int
    over_cap_accounts: int
    outbox_drained: int
    errors: int
    duration_ms: float

    def to_json(self) -> dict[str, Any]:
        return {
            "sizeWritten": self.size_written,
            "orphansDeleted": self.orphans_deleted,
            "overCapAccounts": self.over_cap_accounts,
            "outboxDrained": self.outbox_drained,
            "errors": self.errors,
            "durationMs": self.duration_ms,
        }


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + (time.perf_counter() - started) * 1000, 1)


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

    def to_json(self) -> dict[str, Any]:
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


async def run_reconcile(
    runtime: Runtime,
    clock: Clock,
    options: ReconcileOptions,
    *,
    progress: Progress | None = None,
) -> ReconcileReport:
    """Run the reconciler once."""
    base = runtime.settings.r2_public_url
    if not base:
        raise ReconcileUnavailable(
            "R2_PUBLIC_URL is unset: object keys cannot be derived from episode URLs"
        )
    started = time.perf_counter()
    now = clock.now()
    prefix = public_prefix(base)
    if not options.apply:
        # the one dry-run view: a rollback-only database, a read-only store, stand-ins for the
        # rest — whatever a bug upstream asks of them, a dry run changes nothing
        runtime = runtime.dry_run_view(clock)
    store: ObjectStore = runtime.store
    tick = progress or (lambda phase, n: None)
    phases: dict[str, float] = {}
    outbox: OutboxDrain | None = None

    # the listing's COPY and the joins over a million rows are long work, not a lane's statement
    long_work = runtime.settings.db_long_statement_timeout_seconds
    async with runtime.db.session(
        statement_timeout=long_work,
        settings={**JOIN_SETTINGS, "application_name": SESSION_NAME},
        discard=True,
    ) as conn:
        await conn.execute(SQL["drop_listing"])
        await conn.execute(SQL["drop_refs"])
        await conn.execute(SQL["drop_unlisted"])
        await conn.execute(SQL["create_listing"])
        try:
            concurrency = list_concurrency(runtime.settings.reconcile_list_concurrency, store)
            keyed = 0

            async def derive_episode_keys() -> None:
                nonlocal keyed
                with _timed(phases, "episodeKeys"):  # inside the listing's time
                    await conn.execute(SQL["create_refs"], {"prefix": prefix})
                    await conn.execute(SQL["index_refs"])
                    await conn.execute(SQL["analyze_refs"])
                    await conn.execute(SQL["create_unlisted"])
                    [row] = await conn.fetch(SQL["keyed_enclosures"])
                    keyed = row["keyed"]

            with _timed(phases, "listing"):
                listing = await _load_listing(
                    conn, store, tick, concurrency, meanwhile=derive_episode_keys
                )
            with _timed(phases, "heads"):
                heads, by_head = await _head_unlisted(conn, store, tick)
                # after the listing, not beside it: a scan of every episode on a second
                # connection took CPU from the listers (a 300k dry run 8.8 -> 9.9 s)
                foreign = await conn.fetch(
                    SQL["not_under_public_url"], {"prefix": prefix, "sample": SAMPLE_KEYS}
                )
            measured = _measured(keyed, heads, by_head, foreign)
            with _timed(phases, "sizeBackfill"):
                size_backfill = await _size_backfill(
                    runtime, conn, options, prefix, now, tick, measured
                )
            with _timed(phases, "missing"):
                missing = await _missing(runtime, conn, options, prefix, now, tick)
            size_backfill = replace(
                size_backfill, measured=replace(measured, unmeasured=missing.candidates)
            )
            if options.apply:
                with _timed(phases, "outbox"):
                    outbox = await drain_feed_outbox(runtime, clock, now)
            context = SweepContext(
                db=runtime.db,
                conn=conn,
                store=store,
                prefix=prefix,
                now=now,
                # skipOrphanDelete holds back every sweep, prep too
                delete=options.apply and not options.skip_orphan_delete,
                tick=tick,
            )
            sweeps: list[Sweep] = []
            for spec in sweep_specs(options, prefix, now):
                with _timed(phases, f"sweep:{spec.kind}"):
                    sweeps.append(await _sweep(context, spec))
        finally:
            await conn.execute(SQL["drop_unlisted"])
            await conn.execute(SQL["drop_refs"])
            await conn.execute(SQL["drop_listing"])

    media = await sweep_wedged_media_jobs(runtime, clock)
    over_cap = await runtime.db.fetch(SQL["over_cap_accounts"])
    orphans, episode_images, transcribe_prep = sweeps
    return ReconcileReport(
        options=options,
        now=now,
        listing=listing,
        size_backfill=size_backfill,
        missing=missing,
        outbox=outbox,
        orphans=orphans,
        episode_images=episode_images,
        transcribe_prep=transcribe_prep,
        media_jobs=MediaJobs(flagged=media.media_jobs_flagged, job_ids=tuple(media.job_ids)),
        over_cap=tuple(OverCapAccount.from_row(r) for r in over_cap),
        phases_ms=phases,
        duration_ms=round((time.perf_counter() - started) * 1000, 1),
    )


def _listing_rows(page: list[StoredObject], kinds: dict[str, int]) -> list[tuple[Any, ...]]:
    rows = []
    for obj in page:
        kind = classify_key(obj.key)
        kinds[kind] = kinds.get(kind, 0) + 1
        rows.append((obj.key, kind, obj.size, obj.last_modified))
    return rows


def list_concurrency(settings_value: int | None, store: ObjectStore) -> int:
    """RECONCILE_LIST_CONCURRENCY, else 16 listings in flight on S3 (each page a round trip)
    and one per core on local disk (each page a directory walk)."""
    if settings_value:
        return settings_value
    return REMOTE_LIST_CONCURRENCY if store.remote else max(1, os.cpu_count() or 1)


async def _load_listing(
    conn: Tx,
    store: ObjectStore,
    tick: Progress,
    concurrency: int,
    *,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> Listing:
    """List ``podcasts/`` partitioned by podcast and COPY as we go.

    A delimiter listing finds every ``podcasts/{id}/`` prefix the store holds (of podcasts in
    the database or not: a deleted podcast's objects are orphans to find) and the objects
    directly under ``podcasts/``; ``concurrency`` listers then take the prefixes one after
    another, each streaming its pages into one queue that the COPY drains. Memory holds at
    most the queue's pages plus one page per lister; requests are the prefix listing's pages
    plus every prefix's own (N/1000 + prefixes). One partition failing fails the listing,
    before anything is changed.

    ``meanwhile`` is the session's work that needs no listing (deriving the episodes' keys):
    it runs on ``conn`` before the COPY starts while the listers already fill the queue, which
    then holds up to OVERLAP_PAGES pages so that they are not held up meanwhile."""
    totals = {"objects": 0, "bytes": 0}
    kinds: dict[str, int] = {}
    pages_before = store.stats.list_pages
    prefixes, loose = await store.list_children("podcasts/")
    queue: asyncio.Queue[list[StoredObject] | None] = asyncio.Queue(
        maxsize=max(concurrency * 2, OVERLAP_PAGES if meanwhile else 0)
    )
    done = {"prefixes": 0}
    started = time.monotonic()

    async def lister(todo: Iterator[str]) -> None:
        for prefix in todo:  # shared: each lister takes the next prefix not yet taken
            async for page in store.list_prefix(prefix):
                await queue.put(page)
            done["prefixes"] += 1

    async def produce() -> None:
        try:
            for start in range(0, len(loose), LIST_PAGE):
                await queue.put(loose[start : start + LIST_PAGE])
            todo = iter(prefixes)
            listers = [
                asyncio.create_task(lister(todo)) for _ in range(min(concurrency, len(prefixes)))
            ]
            try:
                await asyncio.gather(*listers)
            finally:
                for task in listers:
                    task.cancel()
                await asyncio.gather(*listers, return_exceptions=True)
        finally:
            await queue.put(None)

    async def pages() -> AsyncIterator[list[tuple[Any, ...]]]:
        while (page := await queue.get()) is not None:
            totals["objects"] += len(page)
            totals["bytes"] += sum(o.size for o in page)
            tick(
                _listing_phase(totals["objects"], done["prefixes"], len(prefixes), started),
                totals["objects"],
            )
            yield _listing_rows(page, kinds)

    producer = asyncio.create_task(produce())
    try:
        if meanwhile is not None:
            await meanwhile()
        await conn.copy_in_batches(SQL["copy_listing"], pages())
    finally:
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer  # re-raises a listing failure
    seconds = time.monotonic() - started
    await conn.execute(SQL["index_listing"])
    await conn.execute(SQL["analyze_listing"])
    return Listing(
        objects=totals["objects"],
        bytes=totals["bytes"],
        list_requests=store.stats.list_pages - pages_before,
        partitions=len(prefixes),
        list_concurrency=concurrency,
        objects_per_second=round(totals["objects"] / seconds) if seconds > 0 else 0,
        kinds=kinds,
    )


def _listing_phase(objects: int, done: int, partitions: int, started: float) -> str:
    """The progress line: objects so far, objects/s, and an ETA from the partitions left."""
    elapsed = time.monotonic() - started
    rate = objects / elapsed if elapsed > 0 else 0.0
    if done and partitions > done:
        eta = f", ETA {elapsed * (partitions - done) / done:.0f} s"
    else:
        eta = ""
    return f"listing ({rate:,.0f} objects/s, {done:,}/{partitions:,} podcasts{eta})"


async def _head_unlisted(conn: Tx, store: ObjectStore, tick: Progress) -> tuple[int, int]:
    """HEAD every enclosure key the listing of ``podcasts/`` cannot cover (spec 000: "for every
    episode with audio_url, derive the R2 key and HEAD it"), HEAD_CONCURRENCY at a time, and add
    the objects found to the listing as kind 'headed': the size backfill then joins them like
    listed ones, the missing check does not HEAD them again, and no sweep selects them.
    Returns (HEAD requests, enclosures whose object a HEAD found)."""
    gate = asyncio.Semaphore(HEAD_CONCURRENCY)
    after, heads, by_head = "", 0, 0

    async def head(key: str) -> StoredObject | None:
        async with gate:
            return await store.head(key)

    while page := await conn.fetch(SQL["unlisted_keys"], {"after": after, "limit": LIST_PAGE}):
        found = await asyncio.gather(*(head(r["key"]) for r in page))
        heads += len(page)
        by_head += sum(r["episodes"] for r, o in zip(page, found, strict=True) if o is not None)
        after = page[-1]["key"]
        present = [o for o in found if o is not None]
        if present:
            await conn.execute(
                SQL["add_headed"],
                {
                    "keys": [o.key for o in present],
                    "sizes": [o.size for o in present],
                    "modified": [o.last_modified for o in present],
                },
            )
        tick("keys outside the listing", heads)
    return heads, by_head


def _measured(keyed: int, heads: int, by_head: int, foreign: list[dict[str, Any]]) -> Measured:
    return Measured(
        keyed=keyed,
        by_head=by_head,
        heads=heads,
        not_under_public_url=foreign[0]["total"] if foreign else 0,
        not_under_public_url_sample=tuple(
            ForeignUrl(episode_id=str(r["id"]), audio_url=r["audio_url"]) for r in foreign
        ),
    )


async def _size_backfill(
    runtime: Runtime,
    conn: Tx,
    options: ReconcileOptions,
    prefix: str,
    now: datetime,
    tick: Progress,
    measured: Measured,
) -> SizeBackfill:
    checked = mismatched = written = 0
    blocked: list[BlockedWrite] = []
    sample: list[SizeSample] = []
    # The cap bypass is one transaction that ALTERs episodes, which must not start while this
    # session's cursor still reads the table (it would wait on us forever): collect first.
    # The active path writes a batch at a time as the rows stream by, so its memory stays flat.
    bypass = options.apply and options.bypass_cap_for_backfill
    collected: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []

    async def write_active(rows: list[dict[str, Any]]) -> None:
        nonlocal written
        for batch in _batches(rows):
            updated, refused = await _write_size_batch(runtime, batch, now)
            written += updated
            blocked.extend(refused)

    async for rows in conn.stream(SQL["size_candidates"], {"prefix": prefix}):
        for row in rows:
            checked += 1
            if not size_needs_write(row["recorded"], row["actual"]):
                continue
            mismatched += 1
            if len(sample) < SAMPLE_KEYS:
                sample.append(
                    SizeSample(
                        episode_id=str(row["id"]),
                        key=row["key"],
                        recorded=row["recorded"],
                        measured=row["actual"],
                    )
                )
            if bypass:
                collected.append(row)
            elif options.apply:
                pending.append(row)
        if len(pending) >= SIZE_WRITE_BATCH:  # full batches now, the rest with the next page
            full = len(pending) - len(pending) % SIZE_WRITE_BATCH
            await write_active(pending[:full])
            del pending[:full]
        tick("size backfill", checked)
    await write_active(pending)

    fallback = False
    if collected:
        try:
            written = await _write_sizes_bypassing_cap(runtime, collected, now)
        except QueryError as exc:
            if exc.sqlstate != INSUFFICIENT_PRIVILEGE:
                raise
            fallback = True
            warning("reconcile_cap_bypass_unavailable", error=describe_error(exc))
            await write_active(collected)
    return SizeBackfill(
        checked=checked,
        mismatched=mismatched,
        written=written,
        blocked_over_cap=tuple(blocked),
        sample=tuple(sample),
        cap_bypass_fallback=fallback if options.bypass_cap_for_backfill else None,
        measured=measured,
    )


def _batches(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), SIZE_WRITE_BATCH):
        yield rows[start : start + SIZE_WRITE_BATCH]


async def _write_size_batch(
    runtime: Runtime, rows: list[dict[str, Any]], now: datetime
) -> tuple[int, list[BlockedWrite]]:
    """One transaction per batch: its sizes, and an outbox intent for each published episode
    written. Rows the cap trigger refuses are left out and returned; every other row of the
    batch is written. Returns (rows written, refused writes)."""
    async with runtime.db.transaction() as tx:
        updated, refused = await _write_sizes_isolating_refusals(tx, rows, now)
        await _record_size_intents(tx, updated, now)
    return len(updated), refused


async def _write_sizes_isolating_refusals(
    tx: Tx, rows: list[dict[str, Any]], now: datetime
) -> tuple[list[dict[str, Any]], list[BlockedWrite]]:
    """The batch in one statement under a savepoint. 23514 fails the statement as a whole and
    names the account, not the row, so the refused statement is rolled back to its savepoint
    and its halves are written the same way, first half first: each refused row costs about
    2·log2(batch) statements, and every row is decided with the rows before it in scan order
    already written, as one transaction per row decided it; a refused row is the one row of
    its last statement, its error the trigger's own."""
    await tx.execute(SQL["savepoint_batch"])
    try:
        updated = await tx.fetch(SQL["write_sizes"], _size_params(rows, now))
    except QueryError as exc:
        if exc.sqlstate != CHECK_VIOLATION:
            raise
        await tx.execute(SQL["rollback_batch"])
        await tx.execute(SQL["release_batch"])
        if len(rows) == 1:
            [row] = rows
            refused = BlockedWrite(
                episode_id=str(row["id"]),
                podcast_id=str(row["podcast_id"]),
                measured=row["actual"],
                error=str(exc),
            )
            return [], [refused]
        half = len(rows) // 2
        first, first_refused = await _write_sizes_isolating_refusals(tx, rows[:half], now)
        second, second_refused = await _write_sizes_isolating_refusals(tx, rows[half:], now)
        return first + second, first_refused + second_refused
    await tx.execute(SQL["release_batch"])
    return updated, []


def _size_params(rows: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    return {
        "ids": [r["id"] for r in rows],
        "audio_urls": [r["audio_url"] for r in rows],
        "recorded": [r["recorded"] for r in rows],
        "actual": [r["actual"] for r in rows],
        "now": now,
    }


async def _record_size_intents(tx: Tx, updated: list[dict[str, Any]], now: datetime) -> None:
    """One intent per published episode written (its feed's <enclosure length> changed), in
    the transaction of its size write; a row that changed since the scan is not written and
    owes none."""
    podcasts = [str(u["podcast_id"]) for u in updated if u["status"] == "published"]
    await feed_outbox.record(tx, podcasts, "size_backfill", now)


async def _write_sizes_bypassing_cap(
    runtime: Runtime, rows: list[dict[str, Any]], now: datetime
) -> int:
    """One transaction with only the cap trigger disabled; ENABLE runs before the commit
    whatever happens, and any error rolls back the DISABLE with everything else."""
    written = 0
    async with runtime.db.transaction() as tx:
        await tx.execute(SQL["disable_cap_trigger"])
        # Re-enabled before the commit. On an error the transaction is aborted, so ENABLE could
        # not run (and would hide the real error); the rollback undoes the DISABLE instead.
        for batch in _batches(rows):
            updated = await tx.fetch(SQL["write_sizes"], _size_params(batch, now))
            await _record_size_intents(tx, updated, now)
            written += len(updated)
        await tx.execute(SQL["enable_cap_trigger"])
    return written


async def _missing(
    runtime: Runtime,
    conn: Tx,
    options: ReconcileOptions,
    prefix: str,
    now: datetime,
    tick: Progress,
) -> Missing:
    count = candidates = quarantined = 0
    sample: list[MissingSample] = []
    failures: list[Failure] = []
    gate = asyncio.Semaphore(HEAD_CONCURRENCY)
    store = runtime.store

    async def present(key: str) -> bool:
        async with gate:
            return await store.head(key) is not None

    async for rows in conn.stream(SQL["missing_candidates"], {"prefix": prefix}):
        # One HEAD per candidate (it may have been uploaded after the listing passed its key),
        # a batch of them at a time.
        uploaded_since = await asyncio.gather(*(present(r["key"]) for r in rows))
        for row, late in zip(rows, uploaded_since, strict=True):
            candidates += 1
            if late:
                continue
            count += 1
            if len(sample) < SAMPLE_KEYS:
                sample.append(
                    MissingSample(episode_id=str(row["id"]), key=row["key"], status=row["status"])
                )
            if not (options.apply and options.quarantine_missing):
                continue
            # rolled back whole on a failure; the next run rediscovers it
            with one_item(failures, "reconcile_quarantine_failed", episode_id=str(row["id"])):
                if await quarantine_episode(runtime, row, now):
                    quarantined += 1
        tick("missing objects", candidates)
    return Missing(
        count=count,
        candidates=candidates,
        quarantined=quarantined,
        sample=tuple(sample),
        failures=tuple(failures),
    )


async def quarantine_episode(runtime: Runtime, row: dict[str, Any], now: datetime) -> bool:
    """The complete transition, in one transaction, by the row's CURRENT state."""
    async with runtime.db.transaction() as tx:
        current = await tx.fetch_one(SQL["lock_episode"], {"id": row["id"]})
        if current is None or current["audio_url"] != row["audio_url"]:
            return False  # deleted, or re-uploaded since the scan
        await tx.execute(SQL["quarantine_episode"], {"id": row["id"], "now": now})
        if current["status"] in ("published", "scheduled"):
            await tx.execute(SQL["cancel_time_automation"], {"id": row["id"], "now": now})
        if current["status"] == "published":
            await feed_outbox.record(tx, [str(current["podcast_id"])], "quarantine_missing", now)
    event(
        "reconcile_episode_quarantined",
        episode_id=str(row["id"]),
        previous_status=current["status"],
    )
    return True


async def drain_feed_outbox(runtime: Runtime, clock: Clock, now: datetime) -> OutboxDrain:
    """Attempt every undelivered intent, whatever became of an earlier effect: spec 000's drain
    "runs on every apply run" and leaves a failed row pending to be retried, so an effect that
    died (a 4xx, its maximum age) is revived here, not left as the intent's end
    (effects/outbox.sql, adopt_feed_outbox). The minute lane drains what is due every minute but
    never revives the dead. This run's own intents (size backfill, quarantine) go out before
    its orphan sweeps."""
    revived = 0
    sample: list[effects_outbox.Effect] = []  # the first few, for the log line
    # A page made due is no longer selected (its effects are live and due now), so paging ends
    # when a page comes back empty; the page count is bounded all the same, in case a concurrent
    # minute-lane drain keeps failing intents back into a backoff while this loop runs.
    pages = await feed_outbox.count_pending(runtime.db) // OUTBOX_ADOPT_MAX + 1
    for _ in range(pages):
        driven = await effects_outbox.revive_feed_outbox(runtime.db, now, limit=OUTBOX_ADOPT_MAX)
        if not driven.created and not driven.revived:
            break
        revived += len(driven.revived)
        sample.extend(driven.revived[: LOGGED_IDS_MAX - len(sample)])
    if revived:
        event(
            "reconcile_outbox_revived",
            count=revived,
            # a sample, as r2_cleanup_failed's keys: a backlog of 5,000 is no log line
            effect_ids=[e.id for e in sample],
            outbox_ids=[str(e.payload.get("outbox_id")) for e in sample],
        )
    drained = await drain(
        runtime, clock, kinds=["feed_invalidate"], budget_seconds=OUTBOX_DRAIN_BUDGET_SECONDS
    )
    failures: list[Failure] = []
    for failure in drained.errors:
        detail = {k: v for k, v in failure.items() if k != "event"}
        warning("reconcile_outbox_delivery_failed", **detail)
        failures.append({"event": "reconcile_outbox_delivery_failed", **detail})
    return OutboxDrain(
        # after the drain: what is still owed, this run's failures and any backlog past the bound
        pending=await feed_outbox.count_pending(runtime.db),
        delivered=drained.delivered,
        failed=drained.retried + drained.dead,
        dead=drained.dead,
        revived=revived,
        failures=tuple(failures),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepSpec:
    """One orphan sweep: what it finds (``query``), how old a find must be to go, and the
    statement that re-checks references right before each delete (None: nothing can start
    referencing it, e.g. expired transcription prep). Audio (both audio columns) and
    per-episode images share the age guard and the re-check; only audio honours a pending
    invalidation (in its queries)."""

    kind: str
    query: str
    params: dict[str, Any]
    recheck: str | None
    min_age: timedelta


def sweep_specs(options: ReconcileOptions, prefix: str, now: datetime) -> tuple[SweepSpec, ...]:
    """The three sweeps, in the report's order: audio, per-episode images, expired prep."""
    age = timedelta(hours=options.min_orphan_age_hours)
    return (
        SweepSpec(
            kind="orphan",
            query=SQL["unreferenced_audio"],
            params={"prefix": prefix},
            recheck=SQL["recheck_audio_references"],
            min_age=age,
        ),
        SweepSpec(
            kind="episode_image",
            query=SQL["unreferenced_episode_images"],
            params={"prefix": prefix},
            recheck=SQL["recheck_image_references"],
            min_age=age,
        ),
        SweepSpec(
            kind="transcribe_prep",
            query=SQL["expired_prep"],
            params={"now": now, "ttl_days": PREP_TTL_DAYS},
            recheck=None,
            min_age=timedelta(0),
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepContext:
    """What every sweep of one run shares."""

    db: Database  # the re-check reads the committed state, outside the listing's session
    conn: Tx  # the session that holds the listing
    store: ObjectStore
    prefix: str
    now: datetime
    delete: bool  # an apply run that does not skip orphan deletes
    tick: Progress


@dataclass(kw_only=True)
class _Tally:
    """A sweep's counts while it runs; frozen into a Sweep at its end."""

    found: int = 0
    bytes: int = 0
    too_young: int = 0
    protected: int = 0
    eligible: int = 0
    referenced_at_recheck: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    sample: list[OrphanSample] = field(default_factory=list)


async def _sweep(ctx: SweepContext, spec: SweepSpec) -> Sweep:
    cutoff = ctx.now - spec.min_age
    tally = _Tally()
    batch: list[tuple[str, int]] = []

    async def flush() -> None:
        if not batch:
            return
        keys = [k for k, _ in batch]
        if spec.recheck is not None:
            # Immediately before the delete: anything referenced now stays.
            keep = {
                r["key"]
                for r in await ctx.db.fetch(
                    spec.recheck, {"keys": keys, "prefix": ctx.prefix, "uuid_re": UUID_RE}
                )
            }
            tally.referenced_at_recheck += len(keep)
            keys = [k for k in keys if k not in keep]
        sizes = dict(batch)
        outcome = await ctx.store.delete(keys)
        tally.deleted += outcome.deleted
        tally.bytes_deleted += sum(sizes[k] for k in keys if k not in outcome.failed)
        tally.failed.update(outcome.failed)
        batch.clear()

    async for rows in ctx.conn.stream(spec.query, spec.params):
        for row in rows:
            size = int(row["size"])
            tally.found += 1
            tally.bytes += size
            if len(tally.sample) < SAMPLE_KEYS:
                tally.sample.append(
                    OrphanSample(key=row["key"], size=size, last_modified=row["last_modified"])
                )
            if row["last_modified"] >= cutoff:
                tally.too_young += 1
                continue
            if row["invalidation_pending"]:
                tally.protected += 1
                continue
            tally.eligible += 1
            if ctx.delete:
                batch.append((row["key"], size))
                if len(batch) >= DELETE_BATCH:
                    await flush()
        ctx.tick(f"{spec.kind} sweep", tally.found)
    if ctx.delete:
        await flush()
    return Sweep(
        kind=spec.kind,
        found=tally.found,
        bytes=tally.bytes,
        too_young=tally.too_young,
        protected=tally.protected,
        eligible=tally.eligible,
        referenced_at_recheck=tally.referenced_at_recheck,
        deleted=tally.deleted,
        bytes_deleted=tally.bytes_deleted,
        failed=dict(tally.failed),
        sample=tuple(tally.sample),
    )
