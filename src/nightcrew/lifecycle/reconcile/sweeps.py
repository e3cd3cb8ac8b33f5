"""The orphan sweeps: audio, per-episode images and expired transcription prep — age-guarded
and re-checked against the database right before each delete."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nightcrew.adapters.storage import ObjectStore
from nightcrew.db.database import Database, Params, Tx
from nightcrew.db.records import as_records
from nightcrew.lifecycle.reconcile.core import (
    PREP_TTL_DAYS,
    SAMPLE_KEYS,
    ReconcileOptions,
)
from nightcrew.lifecycle.reconcile.queries import SQL
from nightcrew.lifecycle.reconcile.records import OrphanSample, Progress, Sweep
from nightcrew.log import warning

DELETE_BATCH = 1000
UUID_RE = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepSpec:
    """One orphan sweep: what it finds (``query``), how old a find must be to go, and the
    statement that re-checks references right before each delete (None: nothing can start
    referencing it, e.g. expired transcription prep). Audio (both audio columns) and
    per-episode images share the age guard and the re-check; only audio honours a pending
    invalidation (in its queries)."""

    kind: str
    query: str
    params: Params
    recheck: str | None
    min_age: timedelta


@dataclass(frozen=True, kw_only=True, slots=True)
class _Found:
    """A sweep query's row (unreferenced_audio, unreferenced_episode_images, expired_prep)."""

    key: str
    size: int
    last_modified: datetime
    invalidation_pending: bool


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


async def sweep(ctx: SweepContext, spec: SweepSpec) -> Sweep:
    cutoff = ctx.now - spec.min_age
    tally = _Tally()
    batch: list[tuple[str, int]] = []

    async def flush() -> None:
        if not batch:
            return
        keys = [k for k, _ in batch]
        if spec.recheck is not None:
            # Immediately before the delete: anything referenced now stays.
            keep = set(
                await ctx.db.fetch_values(
                    str, spec.recheck, {"keys": keys, "prefix": ctx.prefix, "uuid_re": UUID_RE}
                )
            )
            tally.referenced_at_recheck += len(keep)
            keys = [k for k in keys if k not in keep]
        sizes = dict(batch)
        outcome = await ctx.store.delete(keys)
        tally.deleted += outcome.deleted
        tally.bytes_deleted += sum(sizes[k] for k in keys if k not in outcome.failed)
        tally.failed.update(outcome.failed)
        batch.clear()

    async for rows in ctx.conn.stream(spec.query, spec.params):
        for found in as_records(_Found, rows):
            size = found.size
            tally.found += 1
            tally.bytes += size
            if len(tally.sample) < SAMPLE_KEYS:
                tally.sample.append(
                    OrphanSample(key=found.key, size=size, last_modified=found.last_modified)
                )
            if found.last_modified >= cutoff:
                tally.too_young += 1
                continue
            if found.invalidation_pending:
                tally.protected += 1
                continue
            tally.eligible += 1
            if ctx.delete:
                batch.append((found.key, size))
                if len(batch) >= DELETE_BATCH:
                    await flush()
        ctx.tick(f"{spec.kind} sweep", tally.found)
    if ctx.delete:
        await flush()
    result = Sweep(
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
    if (failure := result.error()) is not None:
        warning(**failure)  # reconcile_delete_failed: the report carries it too
    return result
