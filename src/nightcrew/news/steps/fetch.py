"""Fetch: RSS/Atom feeds, politely and defensively — one feed (``fetch_feed``), a source as
both engines fetch it (``fetch_source``), and a shard's due sources at once (``fetch_sources``,
the inline run).

Every request goes through the address policy (``adapters/addresses.py``), has per-read timeouts
and a total time budget (a server sending a byte every few seconds cannot hold a run), a
response-size cap (a hostile feed cannot exhaust memory), bounded redirects (a loop is an
error, not a hang), and conditional GET (ETag / Last-Modified → 304, nothing to parse); a body
identical to the last one (its SHA-256 is kept) is not parsed again either. 429 and 503 honour
``Retry-After``. Parsing is ``steps/parse.py``'s; a document that is no feed — an empty body, an
HTML page, other XML — is a failure with a reason, counted toward parking. Parsing and building
the items (``read_feed_body``) run in a parser worker process under ``NEWS_PARSE_BUDGET_SECONDS``
(``rules.parsers``, the runtime's ``parse.ParserPool``): a feed over it is that feed's failure,
and the event loop never waits on it. Only a small body that the fast parser reads whole is read
in place (INLINE_PARSE_MAX_BYTES).

The bytes are untrusted, so nothing that comes out of them may fail a run: any exception while
reading a feed is that feed's failure, and every item is sanitised before it goes anywhere
(``entries``; what is dropped is counted by reason in ``FetchResult.dropped``).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal
from urllib.parse import urljoin

from nightcrew.adapters.addresses import (
    AddressPolicy,
    FetchLimits,
    UnsafeURL,
    UntrustedHttp,
    system_resolver,
)
from nightcrew.adapters.parsers import ParserPool
from nightcrew.config import Settings
from nightcrew.errors import FetchError
from nightcrew.log import describe_error
from nightcrew.news.steps.entries import (
    FeedItem,
    FeedRead,
    ItemLimits,
    clean_char_refs,
    feed_read,
    read_feed_body,
)
from nightcrew.news.steps.parse import PARSE_BUDGET_SECONDS, parse_fast_only

if TYPE_CHECKING:
    from nightcrew.news.sources.registry import DueSource

MAX_FEED_BYTES = 5 * 1024 * 1024
READ_TIMEOUT_SECONDS = 15.0
CONNECT_TIMEOUT_SECONDS = 5.0
DEFAULT_RETRY_AFTER_SECONDS = 300
MAX_RETRY_AFTER_SECONDS = 24 * 3600
FETCH_BUDGET_SECONDS = 30.0
FETCH_CONCURRENCY = 16  # the inline run's feeds in flight at once
# A body this small that feedparser-rs reads whole is read on the event loop: handing it to a
# worker cost more than the parse (bench.news, 15 KB feeds: first run 2.5-2.7 s in place against
# 3.0-3.9 s through the pool, on this loaded 2-core machine). Bounded whatever the bytes say: the
# Rust parser is linear, and 32 KB holds at most ~800 items; the worst shapes measured (tiny
# linked items, relative links, one huge HTML title) cost at most ~25 ms of CPU
# (tests/integration/news/test_parse_budget.py). The slow parser never runs here: a body it
# must read goes to a worker, however small.
INLINE_PARSE_MAX_BYTES = 32 * 1024

Outcome = Literal["ok", "not_modified", "retry_later", "failed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedRules:
    """What one fetch must respect: whose addresses, how long in all, how much per item; and
    where a feed is parsed (the runtime's parser worker processes)."""

    policy: AddressPolicy
    parsers: ParserPool
    budget_seconds: float = FETCH_BUDGET_SECONDS
    limits: ItemLimits = field(default_factory=ItemLimits)
    max_bytes: int = MAX_FEED_BYTES
    # one parse in a worker process, from when a worker takes it; budget_seconds stops meanwhile
    parse_budget_seconds: float = PARSE_BUDGET_SECONDS


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchResult:
    outcome: Outcome
    items: list[FeedItem] = field(default_factory=list)
    etag: str | None = None
    last_modified: str | None = None
    body_hash: str | None = None
    retry_after_seconds: int | None = None
    status: int | None = None
    error: str | None = None
    parser: str | None = None
    # items left out because their link cannot be stored or followed: {reason: how many}
    dropped: dict[str, int] = field(default_factory=dict)
    # the address policy refused the feed (or a redirect): no network was spent, and the
    # operator may allow it (NEWS_ALLOWED_PRIVATE_HOSTS) at any moment — tried every run
    refused_address: bool = False


def retry_after_seconds(value: str | None, now: datetime) -> int:
    """Retry-After as delta-seconds or an HTTP date, clamped to [1 s, 24 h]."""
    if not value:
        return DEFAULT_RETRY_AFTER_SECONDS
    value = value.strip()
    if value.isdigit():
        seconds = int(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return DEFAULT_RETRY_AFTER_SECONDS
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = int((when - now).total_seconds())
    return max(1, min(MAX_RETRY_AFTER_SECONDS, seconds))


async def fetch_feed(
    client: UntrustedHttp,
    url: str,
    now: datetime,
    rules: FeedRules,
    *,
    etag: str | None = None,
    last_modified: str | None = None,
    body_hash: str | None = None,
) -> FetchResult:
    """One feed, within ``rules.budget_seconds`` from the first byte sent to the last read and
    any parse in place; a parse in a worker process is held to ``rules.parse_budget_seconds``
    instead (``_paused``)."""
    try:
        async with asyncio.timeout(rules.budget_seconds) as budget:
            return await _fetch(client, url, now, rules, etag, last_modified, body_hash, budget)
    except TimeoutError:
        return FetchResult(
            outcome="failed",
            error=f"the feed took longer than the {rules.budget_seconds:g} s budget",
        )


async def _fetch(
    client: UntrustedHttp,
    url: str,
    now: datetime,
    rules: FeedRules,
    etag: str | None,
    last_modified: str | None,
    body_hash: str | None,
    budget: asyncio.Timeout | None = None,
) -> FetchResult:
    headers = {
        "Accept": "application/rss+xml, application/atom+xml, application/xml;q=0.9, */*;q=0.5"
    }
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    max_bytes = rules.max_bytes
    limits = FetchLimits(
        max_bytes=max_bytes,
        read_seconds=READ_TIMEOUT_SECONDS,
        connect_seconds=CONNECT_TIMEOUT_SECONDS,
        follow_redirects=True,  # every hop goes through the policy's transport
    )
    try:
        rules.policy.check_url(url)
        response = await client.get(url, limits=limits, headers=headers)
    except UnsafeURL as exc:
        return FetchResult(outcome="failed", error=f"refused: {exc}", refused_address=True)
    except FetchError as exc:
        return FetchResult(outcome="failed", error=str(exc))
    status = response.status
    if status == 304:
        return FetchResult(
            outcome="not_modified",
            status=status,
            etag=etag,
            last_modified=last_modified,
            body_hash=body_hash,
        )
    if status in (429, 503):
        return FetchResult(
            outcome="retry_later",
            status=status,
            retry_after_seconds=retry_after_seconds(response.headers.get("retry-after"), now),
            error=f"the feed answered {status}",
        )
    if not 200 <= status < 300:
        return FetchResult(outcome="failed", status=status, error=f"the feed answered {status}")
    if response.too_large:
        return FetchResult(
            outcome="failed", status=status, error=f"feed larger than {max_bytes} bytes"
        )
    body = response.body
    new_etag = response.headers.get("etag")
    new_last_modified = response.headers.get("last-modified")
    try:
        base = urljoin(response.url, response.headers.get("content-location", ""))
    except ValueError as exc:
        return FetchResult(outcome="failed", error=describe_error(exc))

    digest = hashlib.sha256(body).hexdigest()
    if body_hash is not None and digest == body_hash:
        # a server that sends neither ETag nor Last-Modified, and the same bytes: nothing new
        return FetchResult(
            outcome="not_modified",
            status=status,
            etag=new_etag,
            last_modified=new_last_modified,
            body_hash=digest,
        )
    try:
        read = await _read_feed(body, base, rules, budget)
    except FetchError as exc:  # over the parse budget, or the parser process died
        return FetchResult(outcome="failed", status=status, error=str(exc))
    if read.error is not None:
        return FetchResult(outcome="failed", status=status, error=read.error)
    return FetchResult(
        outcome="ok",
        status=status,
        items=read.items,
        etag=new_etag,
        last_modified=new_last_modified,
        body_hash=digest,
        parser=read.parser,
        dropped=read.dropped,
    )


async def _read_feed(
    body: bytes, base: str, rules: FeedRules, budget: asyncio.Timeout | None = None
) -> FeedRead:
    if len(body) <= INLINE_PARSE_MAX_BYTES:
        try:
            fast = parse_fast_only(clean_char_refs(body), base, rules.limits.max_items)
        except Exception as exc:  # untrusted bytes: whatever breaks is this feed's failure
            return FeedRead(error=f"could not read the feed: {describe_error(exc)}")
        if fast is not None:
            return feed_read(fast, base, rules.policy, rules.limits)
    # a worker process gets the policy without a test's (or anyone's) resolver: it only needs
    # the allowed hosts, to check image URLs, and a closure does not pickle (nor does the pool)
    portable = replace(rules.policy, resolver=system_resolver)
    with _paused(budget):
        async with rules.parsers.turn(len(body)):
            return await rules.parsers.run(
                read_feed_body,
                body,
                base,
                portable,
                rules.limits,
                budget_seconds=rules.parse_budget_seconds,
            )


@contextlib.contextmanager
def _paused(budget: asyncio.Timeout | None) -> Iterator[None]:
    """The fetch budget stopped while a parser worker reads the body: that parse has its own
    budget from the moment a worker takes it, and the wait for a worker — others' parses, a
    worker process starting on a loaded machine (3 s once ran out on a 2-item feed) — is no
    time of this feed's own."""
    loop = asyncio.get_running_loop()
    deadline = budget.when() if budget is not None else None
    if budget is None or deadline is None:
        yield
        return
    left = deadline - loop.time()
    budget.reschedule(None)
    try:
        yield
    finally:
        budget.reschedule(loop.time() + left)


def next_check(now: datetime, result: FetchResult, interval: timedelta) -> datetime:
    if result.refused_address:
        return now  # due on the next run: once the setting allows it, it is fetched then
    if result.outcome == "retry_later" and result.retry_after_seconds:
        return now + timedelta(seconds=result.retry_after_seconds)
    return now + interval


def feed_rules(settings: Settings, policy: AddressPolicy, parsers: ParserPool) -> FeedRules:
    """The rules every fetch of a run follows, from NEWS_FETCH_BUDGET_SECONDS,
    NEWS_PARSE_BUDGET_SECONDS, NEWS_MAX_TITLE_CHARS and NEWS_MAX_SUMMARY_CHARS; feeds are parsed
    in ``parsers`` (the runtime's, ``NewsAdapters.parsers``)."""
    return FeedRules(
        policy=policy,
        parsers=parsers,
        budget_seconds=settings.news_fetch_budget_seconds,
        parse_budget_seconds=settings.news_parse_budget_seconds,
        limits=ItemLimits(
            title_chars=settings.news_max_title_chars,
            summary_chars=settings.news_max_summary_chars,
            max_items=settings.news_max_items_per_feed,
        ),
    )


async def fetch_source(
    client: UntrustedHttp, rules: FeedRules, source: DueSource, now: datetime
) -> FetchResult:
    """One source's feed, conditionally on what its last fetch saved (ETag, Last-Modified,
    body hash). Never raises: whatever goes wrong is that source's failed fetch."""
    try:
        return await fetch_feed(
            client,
            source.feed_url,
            now,
            rules,
            etag=source.etag,
            last_modified=source.last_modified,
            body_hash=source.body_hash,
        )
    except Exception as exc:  # a feed never kills its run or its worker: it is that source's
        return FetchResult(outcome="failed", error=describe_error(exc))


async def fetch_sources(
    client: UntrustedHttp, rules: FeedRules, sources: list[DueSource], now: datetime
) -> list[tuple[DueSource, FetchResult]]:
    """Every one of ``sources`` fetched, FETCH_CONCURRENCY at a time, in their order; one
    source never takes the others' results with it."""
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(source: DueSource) -> tuple[DueSource, FetchResult]:
        async with gate:
            return source, await fetch_source(client, rules, source, now)

    return list(await asyncio.gather(*(one(s) for s in sources)))
