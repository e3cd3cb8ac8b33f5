"""Write: reviewed candidates become articles (and their reviews), only under a fence at
least as new as any writer's (``leases.py``), so a holder whose lease ran out writes nothing.
A URL already written is left as it is: writes are idempotent on the normalised URL.

Both engines write through ``insert_articles``, in a transaction of their own around it: the
inline run a batch under the shard's fence, falling back to one article per transaction so
only the article the database refuses is lost (``write_reviewed``); the pipeline's write stage
one candidate under the fence its worker drew (``write_candidate``). An inline run fenced out
at its write keeps the reviews it paid for on the held candidates, for the next writer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from nightcrew.db.database import Database, QueryError, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.log import describe_error, event, warning
from nightcrew.news.report import WriteFailure
from nightcrew.news.steps import candidates as held_candidates
from nightcrew.news.steps import snapshot
from nightcrew.news.steps.candidates import refused_for_its_data
from nightcrew.news.steps.leases import StaleLease, Superseded, holds_fence
from nightcrew.news.steps.review import Reviewed, Verdicts

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Inserted:
    url: str  # an article written now (``insert_articles``)
    id: int


async def insert_articles(
    tx: Tx, shard: str, fence: int, verdicts: Verdicts, images: dict[str, str], now: datetime
) -> dict[str, int]:
    """The articles (a URL already written is left as it is) and, for those written now, their
    reviews; {url: article id} of the articles written now."""
    items = [r.candidate.item for r in verdicts]
    inserted = await tx.fetch_as(
        _Inserted,
        SQL["insert_articles"],
        {
            "shard": shard,
            "fence": fence,
            "now": now,
            "urls": [i.url for i in items],
            "source_ids": [r.candidate.source_id for r in verdicts],
            "titles": [i.title or i.url for i in items],
            "summaries": [i.summary for i in items],
            "images": [i.image_url or images.get(i.url) for i in items],
            "published": [i.published for i in items],
            "statuses": [r.status for r in verdicts],
        },
    )
    ids = {article.url: article.id for article in inserted}
    reviewed = [
        (ids[r.url], r.verdict, r.translation)
        for r in verdicts
        if r.verdict is not None and r.url in ids
    ]
    if reviewed:
        await tx.execute(
            SQL["insert_reviews"],
            {
                "now": now,
                "article_ids": [a for a, _, _ in reviewed],
                "reviewers": [v.reviewer for _, v, _ in reviewed],
                "accepted": [v.accepted for _, v, _ in reviewed],
                "reasons": json_param([v.reasons for _, v, _ in reviewed]),
                "summaries": [v.summary for _, v, _ in reviewed],
                "translations": [t for _, _, t in reviewed],
            },
        )
    return ids


# --- the inline run's ----------------------------------------------------------------------------
# Makes rows of the candidates (by URL) the inline run still holds in memory only, before the
# write defers, rejects or keeps the verdict of one (``inline._Run._review_and_write``).
StoreFirst = Callable[[list[str]], Awaitable[None]]


async def _all_stored(urls: list[str]) -> None:
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Written:
    urls: list[str]  # the articles written now (processedCount)
    write_errors: list[WriteFailure]  # refused for their own data


@dataclass(frozen=True, kw_only=True, slots=True)
class _Writing:
    """One shard holder's write of its reviewed articles: under ``fence``, at ``now``."""

    db: Database
    shard: str
    fence: int
    images: dict[str, str]
    now: datetime
    store_first: StoreFirst


async def write_reviewed(
    db: Database,
    shard: str,
    fence: int,
    verdicts: Verdicts,
    images: dict[str, str],
    now: datetime,
    *,
    store_first: StoreFirst = _all_stored,
) -> Written:
    """Fenced writes, in one transaction when they all go in; when the batch is refused, one
    transaction per article, so only the article the database cannot store is rejected (and
    reported with the reason); one that failed for another reason (a timeout, a deadlock) is
    held for the next run. A holder whose lease expired (and whose shard a newer holder has
    since written) gets StaleLease and writes nothing; its model reviews stay on the held
    candidates (``_keep_paid_reviews``). A candidate that is not a row yet is made one
    (``store_first``) before any of that touches it."""
    if not verdicts:
        return Written(urls=[], write_errors=[])
    writing = _Writing(
        db=db, shard=shard, fence=fence, images=images, now=now, store_first=store_first
    )
    try:
        return await _write_all(writing, verdicts)
    except StaleLease:
        await keep_paid_reviews(db, shard, verdicts, now, store_first=store_first)
        raise


async def keep_paid_reviews(
    db: Database,
    shard: str,
    verdicts: Verdicts,
    now: datetime,
    *,
    store_first: StoreFirst = _all_stored,
) -> None:
    """Model reviews a run paid for and cannot write — fenced out at its write, or stopped
    (SIGTERM) with answers already in — stay on the held candidates (the run still holds
    their review locks), and whoever writes them next asks the model nothing again. Best
    effort: a database that fails (or a stop's bound that passes) here costs a second review,
    never the run's outcome."""
    paid = [
        (r.url, r.verdict, r.translation)
        for r in verdicts
        if r.verdict is not None and not r.candidate.reviewed
    ]
    if not paid:
        return
    try:
        await store_first([url for url, _, _ in paid])
        kept = await held_candidates.keep_verdicts(db, paid, now)
    except NightcrewError as exc:
        warning("worker.verdicts_not_kept", shard=shard, error=describe_error(exc))
        return
    event("worker.verdicts_kept", shard=shard, kept=kept)


async def _write_all(writing: _Writing, verdicts: Verdicts) -> Written:
    db, now = writing.db, writing.now
    try:
        urls = await _write_batch(writing, verdicts)
        return Written(urls=urls, write_errors=[])
    except QueryError as exc:
        warning("worker.write_batch_failed", shard=writing.shard, error=describe_error(exc))
    written: list[str] = []
    errors: list[WriteFailure] = []
    for verdict in verdicts:
        try:
            written += await _write_batch(writing, [verdict])
        except QueryError as exc:
            url = verdict.url
            await writing.store_first([url])
            if not refused_for_its_data(exc):
                # a timeout, a deadlock, a full disk: not this article's fault — held, retried
                warning("worker.write_deferred", url=url, error=describe_error(exc))
                await held_candidates.defer(
                    db, [url], f"write failed for now: {describe_error(exc)}", now, attempted=True
                )
                continue
            errors.append(WriteFailure(url=url, error=describe_error(exc)))
            warning("worker.write_rejected", url=url, error=describe_error(exc))
            await held_candidates.reject(db, url, describe_error(exc), now)
    return Written(urls=written, write_errors=errors)


async def _write_batch(writing: _Writing, verdicts: Verdicts) -> list[str]:
    shard, fence = writing.shard, writing.fence
    async with writing.db.transaction() as tx:
        if not await holds_fence(tx, shard, fence):
            raise StaleLease(f"shard {shard}: a newer lease holder has written")
        ids = await insert_articles(tx, shard, fence, verdicts, writing.images, writing.now)
        # written now, or already (ON CONFLICT): either way no longer a candidate
        await held_candidates.drop(tx, [r.url for r in verdicts])
    return [r.url for r in verdicts if r.url in ids]


# --- the pipeline's ------------------------------------------------------------------------------
async def write_candidate(
    db: Database,
    shard: str,
    fence: int,
    reviewed: Reviewed,
    now: datetime,
) -> dict[str, int]:
    """One candidate's article and review, its candidate row gone, the write noted for the next
    pass's report and its shard's snapshot marked stale, in one transaction — only under
    ``fence`` (else Superseded: a newer worker took it). {url: article id} when written now;
    empty when it was written already."""
    async with db.transaction() as tx:
        ids = await insert_articles(tx, shard, fence, [reviewed], {}, now)
        gone = await tx.fetch_one(
            SQL["drop_written_candidate"],
            {
                "url": reviewed.url,
                "fence": fence,
                "written": reviewed.url in ids,
                "status": reviewed.status,
                "translated": "translated" if reviewed.translation else None,
                "now": now,
            },
        )
        if gone is None:
            raise Superseded(f"{reviewed.url}: taken over while being written")
        await snapshot.mark_stale(tx, shard, now)
    return ids
