"""What the pipeline's stage workers leave for the passes' reports.

A pass reports what it found and decided itself (``report.NewsReport``); the stage workers do
the expensive steps after it, in other processes. What they did is noted in
``news.report_notes`` in the transaction that does it — an article written (with its status,
and whether it was translated), a write refused, a review parked behind a lease held elsewhere,
items a fetch dropped (the pass that sent the fetch reports them as its own ``droppedItems``),
a fetch put off behind another worker's lease, the model's tokens a review used, a Redis
failure (shard NULL: a worker serves every shard) — and the shard's next pass takes the notes
as it reads them, and reports them under ``workers`` (``report.WorkerResults``). A note is
reported once, whenever its work commits: no window of time can miss a slow commit or count
one twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from nightcrew.adapters.reviewer import Spend
from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.news.report import DroppedItems, FetchFailure, WorkerResults, WriteFailure

if TYPE_CHECKING:
    from nightcrew.adapters.news import NewsAdapters

SQL = load_queries(__file__)


# --- noted by the stage workers ------------------------------------------------------------------
async def note_dropped(
    db: Database | Tx, *, shard: str, source: str, dropped: Mapping[str, int], now: datetime
) -> None:
    """Items a fetch dropped (``FetchResult.dropped``: {reason: count}) of ``source`` (its
    name), for the ``droppedItems`` of the pass that sent the fetch."""
    if not dropped:
        return
    reasons = sorted(dropped)
    await db.execute(
        SQL["note_many"],
        {
            "shard": shard,
            "kind": "dropped_items",
            "source": source,
            "reasons": reasons,
            "counts": [int(dropped[r]) for r in reasons],
            "now": now,
        },
    )


async def note_tokens(db: Database | Tx, *, shard: str, spend: Spend, now: datetime) -> None:
    """The model's tokens one review used, for the workers' ``aiPromptTokens`` and
    ``aiCompletionTokens``; in the transaction that saves the review's result."""
    if not (spend.prompt_tokens or spend.completion_tokens):
        return
    await db.execute(
        SQL["note_many"],
        {
            "shard": shard,
            "kind": "ai_tokens",
            "source": None,
            "reasons": ["prompt", "completion"],
            "counts": [spend.prompt_tokens, spend.completion_tokens],
            "now": now,
        },
    )


async def _note(
    db: Database | Tx, *, shard: str | None, kind: str, reason: str | None, now: datetime
) -> None:
    await db.execute(
        SQL["note"],
        {"shard": shard, "kind": kind, "source": None, "reason": reason, "n": 1, "now": now},
    )


async def note_fetch_locked(db: Database | Tx, *, shard: str, now: datetime) -> None:
    """A fetch of ``shard``'s source put off because another worker holds its fetch lease,
    for the workers' ``fetchLeaseSkippedCount``."""
    await _note(db, shard=shard, kind="fetch_locked", reason=None, now=now)


async def note_redis_trouble(
    db: Database, adapters: NewsAdapters, *, since: float | None, now: datetime
) -> float | None:
    """For a worker's housekeeping: a Redis failure its circuit breaker saw since ``since``
    (the breaker's clock; None: the worker's start) noted for every shard's next pass
    (``workers.redisEnabled``). Returns the next call's ``since`` (None without Redis)."""
    breaker = adapters.redis_breaker
    if breaker is None:
        return None
    checked = breaker.now()
    if breaker.failed_since(since if since is not None else -math.inf):
        await _note(db, shard=None, kind="redis_failed", reason=breaker.last_error, now=now)
    return checked


# --- read by the pass ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Noted:
    """What a pass reads back: its fetches' errors and dropped items, the workers' results
    since the shard's previous report, the shard's candidates by stage and state."""

    fetch_errors: list[FetchFailure]
    dropped_items: list[DroppedItems]
    workers: WorkerResults
    stages: dict[str, dict[str, int]]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Note:
    """The notes of one kind, source and reason, summed (``pass_notes``, ``peek_notes``)."""

    kind: str
    source: str | None  # dropped_items: the source; written: "translated"; write_refused: the URL
    reason: str | None  # written: the status; write_refused: the error; ai_tokens: which
    n: int


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageCount:
    stage: str
    state: str
    n: int  # ``shard_stages``


def _tally(
    notes: list[_Note], *, since: datetime | None, until: datetime, review_retries: int
) -> tuple[WorkerResults, list[DroppedItems]]:
    """The workers' results from their notes, and the items dropped at fetch."""
    written: dict[str, int] = {}
    translated = lock_skipped = fetch_locked = 0
    tokens = {"prompt": 0, "completion": 0}
    redis_failed = False
    write_errors: list[WriteFailure] = []
    dropped: list[DroppedItems] = []
    for note in notes:
        # (a kind's note fills the columns that kind reads)
        kind, n, source, reason = note.kind, note.n, note.source or "", note.reason or ""
        if kind == "written":
            written[reason] = written.get(reason, 0) + n
            translated += n if source == "translated" else 0
        elif kind == "write_refused":
            write_errors.append(WriteFailure(url=source, error=reason))
        elif kind == "review_lock_skipped":
            lock_skipped += n
        elif kind == "dropped_items":
            dropped.append(DroppedItems(source=source, reason=reason, count=n))
        elif kind == "fetch_locked":
            fetch_locked += n
        elif kind == "redis_failed":
            redis_failed = True
        elif kind == "ai_tokens":
            tokens[reason] = tokens.get(reason, 0) + n
    accepted, rejected = written.get("accepted", 0), written.get("rejected", 0)
    results = WorkerResults(
        since=since,
        until=until,
        processed_count=sum(written.values()),
        ai_reviewed_count=accepted + rejected,  # every verdict ("unreviewed": the model failed)
        accepted_count=accepted,
        rejected_count=rejected,
        translated_count=translated,
        redis_ai_review_lock_skipped_count=lock_skipped,
        fetch_lease_skipped_count=fetch_locked,
        review_retry_count=review_retries,
        ai_prompt_tokens=tokens["prompt"],
        ai_completion_tokens=tokens["completion"],
        redis_enabled=not redis_failed,
        write_errors=write_errors,
    )
    return results, dropped


async def _review_retries(db: Database, shard: str) -> int:
    return await db.fetch_count(SQL["pass_review_waits"], {"shard": shard})


async def worker_results(
    db: Database, *, shard: str, now: datetime, take: bool = False
) -> WorkerResults:
    """What the stage workers have noted for ``shard`` that no pass has taken yet: left in
    place, or taken as a pass takes them (``read_for_pass``) when ``take``."""
    window = {"shard": shard, "since": now, "now": now}  # (no shared Redis note: an empty one)
    notes = await db.fetch_as(_Note, SQL["pass_notes" if take else "peek_notes"], window)
    results, _ = _tally(
        notes, since=None, until=now, review_retries=await _review_retries(db, shard)
    )
    return results


async def read_for_pass(db: Database, *, shard: str, began: datetime, now: datetime) -> Noted:
    """What a pass reports of what happened since the shard's previous report: its fetches'
    errors and dropped items, and the workers' results. The shard's notes are taken (deleted
    as read: each is reported once, by the first pass to read it after it committed), and the
    workers' Redis failures older than a day forgotten."""
    since = await db.fetch_value(datetime, SQL["previous_report"], {"shard": shard, "now": began})
    window = {"shard": shard, "since": since or datetime.min.replace(tzinfo=now.tzinfo), "now": now}
    # the pass's own fetches, and any failure the previous report did not see
    fetched_since = {"shard": shard, "since": min(since or began, began), "now": now}
    workers, dropped = _tally(
        await db.fetch_as(_Note, SQL["pass_notes"], window),
        since=since,
        until=now,
        review_retries=await _review_retries(db, shard),
    )
    await db.execute(SQL["forget_notes"], {"now": now})
    stages: dict[str, dict[str, int]] = {s: {} for s in ("enrich", "review", "write")}
    for count in await db.fetch_as(_StageCount, SQL["shard_stages"], {"shard": shard}):
        stages.setdefault(count.stage, {})[count.state] = count.n
    return Noted(
        fetch_errors=await db.fetch_as(FetchFailure, SQL["fetch_errors_since"], fetched_since),
        dropped_items=dropped,
        stages=stages,
        workers=workers,
    )
