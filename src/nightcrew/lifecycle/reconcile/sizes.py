"""The size backfill: every enclosure's measured size written where the recorded one is NULL
or wrong, a batch a transaction; a row the cap trigger refuses is listed, never fatal."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from nightcrew.db.database import Params, QueryError, Tx
from nightcrew.db.records import as_records
from nightcrew.lifecycle import feed_outbox
from nightcrew.lifecycle.reconcile.core import (
    SAMPLE_KEYS,
    size_needs_write,
)
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import (
    BlockedWrite,
    ForeignUrl,
    Measured,
    SizeBackfill,
    SizeSample,
)
from nightcrew.lifecycle.reconcile.scope import RunScope
from nightcrew.log import describe_error, warning
from nightcrew.runtime import Runtime

# Size writes per statement and per transaction (the cap bypass's one transaction runs one
# statement per batch). A transaction's round trips cost more than its statement's rows, so
# 500 a batch write 10,000 sizes in 20 transactions; bounded, so that a batch holding a
# refused row costs a few more statements, and the locks a batch takes (its rows, the cap
# trigger's per-account advisory lock) are held for one short transaction.
SIZE_WRITE_BATCH = 500
CHECK_VIOLATION = "23514"
INSUFFICIENT_PRIVILEGE = "42501"


@dataclass(frozen=True, kw_only=True, slots=True)
class ForeignEpisode:
    """not_under_public_url: one of the first episodes whose audio_url is not ours, with how
    many there are in all."""

    total: int
    id: UUID
    audio_url: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeCandidate:
    """size_candidates: an enclosure whose object's size differs from the recorded one."""

    id: UUID
    podcast_id: UUID
    audio_url: str
    recorded: int | None
    actual: int
    key: str


@dataclass(frozen=True, kw_only=True, slots=True)
class _Written:
    """write_sizes: an episode whose size was written."""

    podcast_id: UUID
    status: str


def measured_from(keyed: int, heads: int, by_head: int, foreign: list[ForeignEpisode]) -> Measured:
    return Measured(
        keyed=keyed,
        by_head=by_head,
        heads=heads,
        not_under_public_url=foreign[0].total if foreign else 0,
        not_under_public_url_sample=tuple(
            ForeignUrl(episode_id=str(f.id), audio_url=f.audio_url) for f in foreign
        ),
    )


async def backfill_sizes(scope: RunScope, measured: Measured) -> SizeBackfill:
    runtime, conn, options = scope.runtime, scope.conn, scope.options
    prefix, now, tick = scope.prefix, scope.now, scope.tick
    checked = mismatched = written = 0
    blocked: list[BlockedWrite] = []
    sample: list[SizeSample] = []
    # The cap bypass is one transaction that ALTERs episodes, which must not start while this
    # session's cursor still reads the table (it would wait on us forever): collect first.
    # The active path writes a batch at a time as the rows stream by, so its memory stays flat.
    bypass = options.apply and options.bypass_cap_for_backfill
    collected: list[SizeCandidate] = []
    pending: list[SizeCandidate] = []

    async def write_active(candidates: list[SizeCandidate]) -> None:
        nonlocal written
        for batch in _batches(candidates):
            updated, refused = await _write_size_batch(runtime, batch, now)
            written += updated
            blocked.extend(refused)

    async for rows in conn.stream(SQL["size_candidates"], {"prefix": prefix}):
        for candidate in as_records(SizeCandidate, rows):
            checked += 1
            if not size_needs_write(candidate.recorded, candidate.actual):
                continue
            mismatched += 1
            if len(sample) < SAMPLE_KEYS:
                sample.append(
                    SizeSample(
                        episode_id=str(candidate.id),
                        key=candidate.key,
                        recorded=candidate.recorded,
                        measured=candidate.actual,
                    )
                )
            if bypass:
                collected.append(candidate)
            elif options.apply:
                pending.append(candidate)
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


def _batches(candidates: list[SizeCandidate]) -> Iterator[list[SizeCandidate]]:
    for start in range(0, len(candidates), SIZE_WRITE_BATCH):
        yield candidates[start : start + SIZE_WRITE_BATCH]


async def _write_size_batch(
    runtime: Runtime, batch: list[SizeCandidate], now: datetime
) -> tuple[int, list[BlockedWrite]]:
    """One transaction per batch: its sizes, and an outbox intent for each published episode
    written. Rows the cap trigger refuses are left out and returned; every other row of the
    batch is written. Returns (rows written, refused writes)."""
    async with runtime.db.transaction() as tx:
        updated, refused = await _write_sizes_isolating_refusals(tx, batch, now)
        await _record_size_intents(tx, updated, now)
    return len(updated), refused


async def _write_sizes_isolating_refusals(
    tx: Tx, batch: list[SizeCandidate], now: datetime
) -> tuple[list[_Written], list[BlockedWrite]]:
    """The batch in one statement under a savepoint. 23514 fails the statement as a whole and
    names the account, not the row, so the refused statement is rolled back to its savepoint
    and its halves are written the same way, first half first: each refused row costs about
    2·log2(batch) statements, and every row is decided with the rows before it in scan order
    already written, as one transaction per row decided it; a refused row is the one row of
    its last statement, its error the trigger's own."""
    await tx.execute(SQL["savepoint_batch"])
    try:
        updated = await tx.fetch_as(_Written, SQL["write_sizes"], _size_params(batch, now))
    except QueryError as exc:
        if exc.sqlstate != CHECK_VIOLATION:
            raise
        await tx.execute(SQL["rollback_batch"])
        await tx.execute(SQL["release_batch"])
        if len(batch) == 1:
            [candidate] = batch
            refused = BlockedWrite(
                episode_id=str(candidate.id),
                podcast_id=str(candidate.podcast_id),
                measured=candidate.actual,
                error=str(exc),
            )
            return [], [refused]
        half = len(batch) // 2
        first, first_refused = await _write_sizes_isolating_refusals(tx, batch[:half], now)
        second, second_refused = await _write_sizes_isolating_refusals(tx, batch[half:], now)
        return first + second, first_refused + second_refused
    await tx.execute(SQL["release_batch"])
    return updated, []


def _size_params(batch: list[SizeCandidate], now: datetime) -> Params:
    return {
        "ids": [c.id for c in batch],
        "audio_urls": [c.audio_url for c in batch],
        "recorded": [c.recorded for c in batch],
        "actual": [c.actual for c in batch],
        "now": now,
    }


async def _record_size_intents(tx: Tx, updated: list[_Written], now: datetime) -> None:
    """One intent per published episode written (its feed's <enclosure length> changed), in
    the transaction of its size write; a row that changed since the scan is not written and
    owes none."""
    podcasts = [str(u.podcast_id) for u in updated if u.status == "published"]
    await feed_outbox.record(tx, podcasts, "size_backfill", now)


async def _write_sizes_bypassing_cap(
    runtime: Runtime, candidates: list[SizeCandidate], now: datetime
) -> int:
    """One transaction with only the cap trigger disabled; ENABLE runs before the commit
    whatever happens, and any error rolls back the DISABLE with everything else."""
    written = 0
    async with runtime.db.transaction() as tx:
        await tx.execute(SQL["disable_cap_trigger"])
        # Re-enabled before the commit. On an error the transaction is aborted, so ENABLE could
        # not run (and would hide the real error); the rollback undoes the DISABLE instead.
        for batch in _batches(candidates):
            updated = await tx.fetch_as(_Written, SQL["write_sizes"], _size_params(batch, now))
            await _record_size_intents(tx, updated, now)
            written += len(updated)
        await tx.execute(SQL["enable_cap_trigger"])
    return written
