"""Items: what a fetch found that is new, and holding it until it is written.

New means not processed before, one rule for both engines (``unseen``): every fetched URL is
looked up in the processed-URL set (Redis's, PostgreSQL's once Redis fails), and the URLs
written are recorded there (``mark_processed``); holding de-duplicates by URL against what is
written or already a candidate.

The inline run keeps the new items in memory, since it writes most of them itself, and stores
as rows in ``news.candidates`` only those it does not write (``store``: deferred, failed for
now). After its writes it saves each source's fetch state, in one transaction with whatever of
that source's items is still only in memory (``hold_fetched``). A run that dies before then
has saved no state, so the next run fetches those feeds again. The pipeline's fetch stage holds
a fetch's new items with its state at once (``hold_fetched``), waiting for its pass to admit
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from nightcrew.adapters.processed import ProcessedUrls, ProcessedUrlsDown
from nightcrew.db.database import Database, QueryError
from nightcrew.log import describe_error, warning
from nightcrew.news.report import DroppedItems, FetchFailure, WriteFailure
from nightcrew.news.sources import registry as news_sources
from nightcrew.news.sources.registry import DueSource
from nightcrew.news.steps import candidates as held_candidates
from nightcrew.news.steps.candidates import Candidate, Fetched, refused_for_its_data
from nightcrew.news.steps.fetch import FetchResult

ProcessedDown = Callable[[ProcessedUrlsDown], None]


async def unseen(
    processed: ProcessedUrls,
    fallback: ProcessedUrls,
    fetched: list[tuple[DueSource, FetchResult]],
    on_down: ProcessedDown,
) -> tuple[ProcessedUrls, list[Fetched]]:
    """Each fetch with its new items: those whose URL is not in the processed-URL set. Returns
    the set that answered (the fallback once Redis failed), for the rest of the run."""
    processed, done = await seen(
        processed, fallback, [i.url for _, r in fetched for i in r.items], on_down
    )
    return processed, [(s, r, [i for i in r.items if i.url not in done]) for s, r in fetched]


async def seen(
    processed: ProcessedUrls, fallback: ProcessedUrls, urls: list[str], on_down: ProcessedDown
) -> tuple[ProcessedUrls, set[str]]:
    """Which of ``urls`` were processed before, from ``processed`` — or, when Redis fails
    (``on_down`` is told first), from ``fallback``: the database still knows. Returns the set
    that answered, for the rest of the run."""
    try:
        return processed, await processed.seen(urls)
    except ProcessedUrlsDown as exc:  # Redis went away mid-run: the database still knows
        on_down(exc)
        return fallback, await fallback.seen(urls)


async def mark_processed(
    processed: ProcessedUrls, fallback: ProcessedUrls, urls: list[str], on_down: ProcessedDown
) -> ProcessedUrls:
    """``urls`` (just written) added to ``processed``. When Redis fails the written articles
    are the record PostgreSQL's set reads, so nothing is added elsewhere; returns the set for
    the rest of the run."""
    if not urls:
        return processed
    try:
        await processed.add(urls)
    except ProcessedUrlsDown as exc:  # the articles are written: that is the record
        on_down(exc)
        return fallback
    return processed


@dataclass(frozen=True, kw_only=True, slots=True)
class Held:
    """What holding a run's fetches left to report (spec 001's ``fetchErrors``,
    ``droppedItems`` and the items refused for their own data, ``writeErrors``)."""

    fetch_errors: list[FetchFailure]
    dropped_items: list[DroppedItems]
    write_errors: list[WriteFailure]


def _hold_error(exc: QueryError) -> str:
    return f"could not hold its items: {describe_error(exc)}"


def _refused(url: str, exc: QueryError) -> WriteFailure:
    """An item the database refused to hold for its own data: logged, and its ``writeErrors``
    entry."""
    warning("worker.hold_rejected", url=url, error=describe_error(exc))
    return WriteFailure(url=url, error=describe_error(exc))


async def record_failures(db: Database, fetched: list[Fetched], now: datetime) -> Held:
    """What a run's fetches report before anything is held: each failed fetch, recorded one
    by one (each may park its source; spec 001's ``fetchErrors``), and the items each
    dropped (``droppedItems``)."""
    fetch_errors: list[FetchFailure] = []
    dropped: list[DroppedItems] = []
    for source, result, _ in fetched:
        if result.outcome in ("failed", "retry_later"):
            fetch_errors.append(FetchFailure(source=source.name, error=result.error))
            await news_sources.record_fetch(db, source, result, now)
        for reason, count in result.dropped.items():
            dropped.append(DroppedItems(source=source.name, reason=reason, count=count))
    return Held(fetch_errors=fetch_errors, dropped_items=dropped, write_errors=[])


async def hold_fetched(
    db: Database,
    shard: str,
    fetched: list[Fetched],
    now: datetime,
) -> Held:
    """Successful fetches' state with the new items they hide, in one transaction — or, if
    the database refuses that, source by source and then item by item, so only an item the
    database cannot store is lost (reported in ``writeErrors``), and a source whose items
    could not be held for a reason not theirs keeps its old state (fetched again). Failed
    fetches are ``record_failures``'."""
    fetch_errors: list[FetchFailure] = []
    write_errors: list[WriteFailure] = []
    try:
        await held_candidates.record_and_hold(db, shard, fetched, now)
        return Held(fetch_errors=[], dropped_items=[], write_errors=[])
    except QueryError as exc:
        warning("worker.hold_batch_failed", shard=shard, error=describe_error(exc))
    for source, result, items in fetched:
        try:
            await held_candidates.record_and_hold(db, shard, [(source, result, items)], now)
        except QueryError as exc:
            warning("worker.hold_source_failed", source=source.name, error=str(exc))
            await _hold_one_by_one(
                db, shard, (source, result, items), now, fetch_errors, write_errors
            )
    return Held(fetch_errors=fetch_errors, dropped_items=[], write_errors=write_errors)


@dataclass(frozen=True, kw_only=True, slots=True)
class Stored:
    """What storing a run's in-memory candidates left: those the database refused for their
    own data (``writeErrors``: lost, as a hold loses them) and those it could not store for
    now (still in memory: the run's settling holds them with their fetch state, or leaves
    their feed to be fetched again)."""

    refused: list[WriteFailure]
    not_stored: list[Candidate]


async def store(db: Database, shard: str, candidates: list[Candidate], now: datetime) -> Stored:
    """A run's in-memory candidates made rows: in one statement, or, if the database refuses
    it, one by one."""
    pairs = [(c.source_id, c.item) for c in candidates]
    try:
        await held_candidates.hold(db, shard, pairs, now)
        return Stored(refused=[], not_stored=[])
    except QueryError as exc:
        warning("worker.store_batch_failed", shard=shard, error=describe_error(exc))
    refused: list[WriteFailure] = []
    not_stored: list[Candidate] = []
    for candidate in candidates:
        try:
            await held_candidates.hold(db, shard, [(candidate.source_id, candidate.item)], now)
        except QueryError as exc:
            if refused_for_its_data(exc):
                refused.append(_refused(candidate.url, exc))
            else:
                not_stored.append(candidate)
    return Stored(refused=refused, not_stored=not_stored)


async def _hold_one_by_one(
    db: Database,
    shard: str,
    fetch: Fetched,
    now: datetime,
    fetch_errors: list[FetchFailure],
    write_errors: list[WriteFailure],
) -> None:
    """Each item in its own statement; the fetch state last, and only when every item is held
    or refused for its own data — a failure that is nobody's item (a timeout, a full disk)
    leaves the state unsaved, so the next run fetches the items again."""
    source, result, items = fetch
    for item in items:
        try:
            await held_candidates.hold(db, shard, [(source.id, item)], now)
        except QueryError as exc:
            if not refused_for_its_data(exc):
                fetch_errors.append(FetchFailure(source=source.name, error=_hold_error(exc)))
                await news_sources.record_fetch(
                    db, source, FetchResult(outcome="failed", error=_hold_error(exc)), now
                )
                return
            write_errors.append(_refused(item.url, exc))
    try:
        await held_candidates.record(db, [(source, result, items)], now)
    except QueryError as exc:  # its items are held; only the 304 is lost: fetched again
        fetch_errors.append(FetchFailure(source=source.name, error=_hold_error(exc)))
