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

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from uuid import UUID

from nightcrew.adapters.storage import ObjectStore
from nightcrew.clock import Clock
from nightcrew.lifecycle.reconcile.core import (
    SAMPLE_KEYS,
    ReconcileOptions,
    public_prefix,
)
from nightcrew.lifecycle.reconcile.feed_drain import drain_feed_outbox
from nightcrew.lifecycle.reconcile.listing import head_unlisted, list_concurrency, load_listing
from nightcrew.lifecycle.reconcile.missing import find_missing
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import (
    MediaJobs,
    OutboxDrain,
    OverCapAccount,
    Progress,
    ReconcileReport,
    ReconcileUnavailable,
    Sweep,
)
from nightcrew.lifecycle.reconcile.scope import RunScope
from nightcrew.lifecycle.reconcile.sizes import ForeignEpisode, backfill_sizes, measured_from
from nightcrew.lifecycle.reconcile.sweeps import SweepContext, sweep, sweep_specs
from nightcrew.lifecycle.watchdogs import sweep_wedged_media_jobs
from nightcrew.runtime import Runtime

# The session's server settings (EXPLAIN ANALYZE at 1M rows, bench/reconcile_plans.py): the
# listing kept in memory, not in 8 MB of temp buffers; hash joins where the planner, misled by
# the prefix filter's estimate (0.5% of rows, really all), would probe the listing's index a
# million times (size backfill 15.5 → 7.8 s, missing 17.4 → 7.4 s). The connection is closed
# afterwards, so no pooled backend keeps the memory or the settings.
JOIN_SETTINGS = {"temp_buffers": "512MB", "work_mem": "64MB", "enable_nestloop": "off"}
# How an operator finds the reconciler's long session in pg_stat_activity (the pool's
# connections are "nightcrew").
SESSION_NAME = "nightcrew-reconcile"


@dataclass(frozen=True, kw_only=True, slots=True)
class _OverCapUsage:
    """over_cap_accounts: an account's bytes against its live cap, both numeric."""

    account_id: UUID
    bytes: Decimal
    cap_gb: Decimal


def _over_cap_account(usage: _OverCapUsage) -> OverCapAccount:
    return OverCapAccount(
        account_id=str(usage.account_id),
        bytes=int(usage.bytes),
        cap_bytes=int(usage.cap_gb * 1_000_000_000),
        over_bytes=int(usage.bytes - usage.cap_gb * 1_000_000_000),
    )


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + (time.perf_counter() - started) * 1000, 1)


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
                    keyed = await conn.fetch_count(SQL["keyed_enclosures"])

            with _timed(phases, "listing"):
                listing = await load_listing(
                    conn, store, tick, concurrency, meanwhile=derive_episode_keys
                )
            with _timed(phases, "heads"):
                heads, by_head = await head_unlisted(conn, store, tick)
                # after the listing, not beside it: a scan of every episode on a second
                # connection took CPU from the listers (a 300k dry run 8.8 -> 9.9 s)
                foreign = await conn.fetch_as(
                    ForeignEpisode,
                    SQL["not_under_public_url"],
                    {"prefix": prefix, "sample": SAMPLE_KEYS},
                )
            measured = measured_from(keyed, heads, by_head, foreign)
            scope = RunScope(
                runtime=runtime, conn=conn, options=options, prefix=prefix, now=now, tick=tick
            )
            with _timed(phases, "sizeBackfill"):
                size_backfill = await backfill_sizes(scope, measured)
            with _timed(phases, "missing"):
                missing = await find_missing(scope)
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
                    sweeps.append(await sweep(context, spec))
        finally:
            await conn.execute(SQL["drop_unlisted"])
            await conn.execute(SQL["drop_refs"])
            await conn.execute(SQL["drop_listing"])

    media = await sweep_wedged_media_jobs(runtime, clock)
    over_cap = await runtime.db.fetch_as(_OverCapUsage, SQL["over_cap_accounts"])
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
        over_cap=tuple(_over_cap_account(u) for u in over_cap),
        phases_ms=phases,
        duration_ms=round((time.perf_counter() - started) * 1000, 1),
    )
