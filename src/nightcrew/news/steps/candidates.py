"""Fetched articles wait in ``news.candidates`` until they are written: deferred means later.

A source's fetch state (ETag / Last-Modified / body hash) is saved in the same transaction as
those of its new items that are not written yet (``record_and_hold``), so the next conditional
GET answering 304 can never lose them; the inline run keeps what it writes itself in memory
(``fetched_now``) and saves the state after its writes. A candidate waits (``held``, not
admitted) until a run or pass admits it, oldest first; a pass's admitted candidates are
``queued`` in the pipeline's stages (or ``held`` for a backoff) until written. A written
candidate is dropped in the transaction that writes its article; one the database cannot store
is ``rejected`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nightcrew.adapters.reviewer import Verdict
from nightcrew.db.database import Database, QueryError, Tx, json_param
from nightcrew.db.queries import load_queries
from nightcrew.jsonable import JsonObject
from nightcrew.news.engines.pipeline.message_outbox import Owed
from nightcrew.news.sources import registry as news_sources
from nightcrew.news.sources.registry import DueSource
from nightcrew.news.steps.entries import FeedItem
from nightcrew.news.steps.fetch import FetchResult, next_check

SQL = load_queries(__file__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    source_id: int
    source_label: str  # "name (shard)", as queuedBySource names it
    item: FeedItem
    reason: str
    attempts: int
    reviewed: bool = False  # the pipeline's review stage already judged it: ``verdict``
    verdict: Verdict | None = None  # None when reviewed: the model failed for good
    translation: str | None = None

    @property
    def url(self) -> str:
        return self.item.url


@dataclass(frozen=True, kw_only=True, slots=True)
class CandidateRow:
    """A candidate as ``news.candidates`` holds it (``held``, and the pipeline's take)."""

    url: str
    source_id: int
    source_name: str = ""
    source_shard: str
    title: str
    summary: str
    image_url: str | None
    published_at: datetime | None
    reason: str
    attempts: int
    stage: str | None = None
    verdict: JsonObject | None = None  # a Verdict's JSON; {}: the model failed for good
    translation: str | None = None

    def candidate(self) -> Candidate:
        return Candidate(
            source_id=self.source_id,
            source_label=f"{self.source_name} ({self.source_shard})",
            item=FeedItem(
                url=self.url,
                title=self.title,
                summary=self.summary,
                published=self.published_at,
                image_url=self.image_url,
            ),
            reason=self.reason,
            attempts=self.attempts,
            reviewed=self.stage == "write",
            verdict=Verdict.from_json(self.verdict) if self.verdict else None,
            translation=self.translation,
        )


Fetched = tuple[DueSource, FetchResult, list[FeedItem]]


@dataclass(frozen=True, kw_only=True, slots=True)
class _HeldBySource:
    source_name: str
    source_shard: str
    n: int


async def record_and_hold(db: Database, shard: str, fetched: list[Fetched], now: datetime) -> None:
    """Every successful fetch's outcome (ETag, Last-Modified, body hash, next check) and its
    new items, in one transaction: the state that makes the next fetch answer 304 is saved
    only with the items it hides. Failed fetches are recorded by the caller."""
    done = [(s, r, i) for s, r, i in fetched if r.outcome in ("ok", "not_modified")]
    if not done:
        return
    async with db.transaction() as tx:
        await _record(tx, done, now)
        await hold(tx, shard, [(source.id, item) for source, _, new in done for item in new], now)


async def record(db: Database, fetched: list[Fetched], now: datetime) -> None:
    """The fetch state alone — for a source whose items are held (or refused) already."""
    done = [(s, r, i) for s, r, i in fetched if r.outcome in ("ok", "not_modified")]
    if done:
        await _record(db, done, now)


async def _record(tx: Database | Tx, done: list[Fetched], now: datetime) -> None:
    await tx.execute(
        news_sources.SQL["record_successes"],
        {
            "now": now,
            "ids": [s.id for s, _, _ in done],
            "etags": [r.etag for _, r, _ in done],
            "last_modified": [r.last_modified for _, r, _ in done],
            "hashes": [r.body_hash for _, r, _ in done],
            "next_check_at": [next_check(now, r, news_sources.CHECK_INTERVAL) for _, r, _ in done],
        },
    )


async def hold(
    tx: Database | Tx, shard: str, items: list[tuple[int, FeedItem]], now: datetime
) -> None:
    """(source id, item) pairs held, in one statement: all of them or, refused, none."""
    if not items:
        return
    await tx.execute(
        SQL["hold"],
        {
            "shard": shard,
            "now": now,
            "urls": [i.url for _, i in items],
            "source_ids": [s for s, _ in items],
            "titles": [i.title for _, i in items],
            "summaries": [i.summary for _, i in items],
            "images": [i.image_url for _, i in items],
            "published": [i.published for _, i in items],
        },
    )


async def known(db: Database, urls: list[str]) -> set[str]:
    """Those of ``urls`` a hold would skip: held already (by any shard, in any state) or
    written."""
    if not urls:
        return set()
    return set(await db.fetch_values(str, SQL["known"], {"urls": urls}))


def fetched_now(fetched: list[Fetched], known_urls: set[str]) -> list[Candidate]:
    """The new items of a run's fetches as candidates not yet stored, in the order a hold
    would store them: the first source to list a URL is its source, and what ``known`` found
    is left out."""
    fresh: dict[str, Candidate] = {}
    for source, _, items in fetched:
        label = f"{source.name} ({source.shard})"
        for item in items:
            if item.url not in fresh and item.url not in known_urls:
                fresh[item.url] = Candidate(
                    source_id=source.id,
                    source_label=label,
                    item=item,
                    reason="fetched",
                    attempts=0,
                )
    return list(fresh.values())


def refused_for_its_data(exc: QueryError) -> bool:
    """SQLSTATE class 22 (data exception), 23 (integrity constraint) or 54 (program limit
    exceeded: "index row size exceeds btree maximum"): the row itself is what the database
    refuses, and will refuse again — unlike a timeout, a deadlock or a full disk."""
    return exc.sqlstate is not None and exc.sqlstate[:2] in ("22", "23", "54")


async def adopt_queued(db: Database, shard: str, now: datetime) -> int:
    return await db.execute(SQL["adopt_queued"], {"shard": shard, "now": now})


async def held(db: Database, shard: str, limit: int) -> list[Candidate]:
    """The shard's first ``limit`` held candidates, oldest first."""
    rows = await db.fetch_as(CandidateRow, SQL["held"], {"shard": shard, "limit": limit})
    return [r.candidate() for r in rows]


async def held_by_source(
    db: Database, shard: str, *, states: tuple[str, ...] = ("held",)
) -> dict[str, int]:
    """How many candidates wait, by "source (shard)" (forgetting those written meanwhile);
    the pipeline counts its ``queued`` ones too."""
    await db.execute(SQL["forget_written"], {"shard": shard})
    rows = await db.fetch_as(
        _HeldBySource, SQL["held_by_source"], {"shard": shard, "states": list(states)}
    )
    return {f"{r.source_name} ({r.source_shard})": r.n for r in rows}


async def defer_all_but(
    db: Database, shard: str, taken: list[str], reason: str, now: datetime
) -> None:
    await db.execute(
        SQL["defer_all_but"], {"shard": shard, "taken": taken, "reason": reason, "now": now}
    )


async def count_held(db: Database, shard: str) -> int:
    """The shard's candidates waiting for a later run or pass (``deferredCount``)."""
    return await db.fetch_count(SQL["count_held"], {"shard": shard})


async def admission_load(db: Database, shard: str) -> int:
    """What earlier passes admitted that the stage workers still have in flight."""
    return await db.fetch_count(SQL["admission_load"], {"shard": shard})


async def admit(db: Database, urls: list[str], now: datetime) -> list[Owed]:
    """A pass admits these waiting candidates into their stages: the outbox rows to send."""
    if not urls:
        return []
    return await db.fetch_as(Owed, SQL["admit"], {"urls": urls, "now": now})


async def defer(
    db: Database, urls: list[str], reason: str, now: datetime, *, attempted: bool = False
) -> None:
    if urls:
        await db.execute(
            SQL["defer"], {"urls": urls, "reason": reason, "now": now, "attempted": attempted}
        )


async def drop(tx: Database | Tx, urls: list[str]) -> None:
    if urls:
        await tx.execute(SQL["drop"], {"urls": urls})


async def keep_verdicts(
    db: Database, verdicts: list[tuple[str, Verdict, str | None]], now: datetime
) -> int:
    """(url, verdict, translation) saved on the held candidates, ready to write: a run fenced
    out after paying for these reviews hands them to the next writer. How many were kept."""
    if not verdicts:
        return 0
    return await db.execute(
        SQL["keep_verdicts"],
        {
            "urls": [u for u, _, _ in verdicts],
            "translations": [t for _, _, t in verdicts],
            "verdicts": json_param([v.to_json() for _, v, _ in verdicts]),
            "now": now,
        },
    )


async def reject(db: Database, url: str, reason: str, now: datetime) -> None:
    await db.execute(SQL["reject"], {"url": url, "reason": reason, "now": now})
