"""Fetching one RSS/Atom feed, politely and defensively.

Every request has timeouts, a response-size cap (a hostile feed cannot exhaust memory),
bounded redirects (a loop is an error, not a hang), and conditional GET (ETag /
Last-Modified → 304, nothing to parse). 429 and 503 honour ``Retry-After``. Parsing is
``feedparser``'s; a document it cannot read as a feed is a failure with a reason.

The bytes are untrusted, so nothing that comes out of them may fail a run: any exception while
reading a feed is that feed's failure; every item is sanitised before it goes anywhere (NUL
and lone surrogates removed — PostgreSQL text holds neither —, titles and summaries bounded,
links over 2,048 characters dropped, an impossible date read as no date).
"""

from __future__ import annotations

import email.utils
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import feedparser
import httpx

from nightcrew.log import describe_error

MAX_FEED_BYTES = 5 * 1024 * 1024
MAX_REDIRECTS = 5
TIMEOUT = httpx.Timeout(15.0, connect=5.0)
DEFAULT_RETRY_AFTER_SECONDS = 300
MAX_RETRY_AFTER_SECONDS = 24 * 3600
TRACKING_PARAMS = ("utm_", "fbclid", "gclid", "mc_cid", "mc_eid")
# Bounds on what one item may carry into the database, the snapshot and a model's prompt.
MAX_TITLE_CHARS = 1024
MAX_SUMMARY_CHARS = 16 * 1024
MAX_URL_CHARS = 2048

# Numeric character references: feedparser turns one naming a surrogate into a lone surrogate
# that later fails to encode (inside feedparser itself), and one naming NUL into a NUL.
_CHAR_REF = re.compile(rb"&#(?:[xX]([0-9a-fA-F]{1,8})|([0-9]{1,10}));")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

Outcome = Literal["ok", "not_modified", "retry_later", "failed"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedItem:
    url: str
    title: str
    summary: str
    published: datetime | None
    image_url: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchResult:
    outcome: Outcome
    items: list[FeedItem] = field(default_factory=list)
    etag: str | None = None
    last_modified: str | None = None
    retry_after_seconds: int | None = None
    status: int | None = None
    error: str | None = None


def normalize_url(url: str) -> str:
    """The identity of an article: scheme and host lower-cased, no fragment, no tracking
    parameters, the remaining query sorted — so the same story is seen once."""
    parts = urlsplit(url.strip())
    _ = parts.port  # raises ValueError for a port out of range: not an article's address
    query = sorted(
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not k.lower().startswith(TRACKING_PARAMS)
    )
    netloc = parts.netloc.lower()
    if (parts.scheme == "https" and netloc.endswith(":443")) or (
        parts.scheme == "http" and netloc.endswith(":80")
    ):
        netloc = netloc.rsplit(":", 1)[0]
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", urlencode(query), ""))


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
    client: httpx.AsyncClient,
    url: str,
    now: datetime,
    *,
    etag: str | None = None,
    last_modified: str | None = None,
    max_bytes: int = MAX_FEED_BYTES,
) -> FetchResult:
    headers = {
        "Accept": "application/rss+xml, application/atom+xml, application/xml;q=0.9, */*;q=0.5"
    }
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    try:
        async with client.stream(
            "GET", url, headers=headers, timeout=TIMEOUT, follow_redirects=True
        ) as response:
            status = response.status_code
            if status == 304:
                return FetchResult(
                    outcome="not_modified", status=status, etag=etag, last_modified=last_modified
                )
            if status in (429, 503):
                return FetchResult(
                    outcome="retry_later",
                    status=status,
                    retry_after_seconds=retry_after_seconds(
                        response.headers.get("Retry-After"), now
                    ),
                    error=f"the feed answered {status}",
                )
            if not 200 <= status < 300:
                return FetchResult(
                    outcome="failed", status=status, error=f"the feed answered {status}"
                )
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                return FetchResult(
                    outcome="failed", status=status, error=f"feed larger than {max_bytes} bytes"
                )
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body.extend(chunk)
                if len(body) > max_bytes:
                    return FetchResult(
                        outcome="failed", status=status, error=f"feed larger than {max_bytes} bytes"
                    )
            new_etag = response.headers.get("ETag")
            new_last_modified = response.headers.get("Last-Modified")
    except httpx.TooManyRedirects:
        return FetchResult(outcome="failed", error=f"more than {MAX_REDIRECTS} redirects")
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        return FetchResult(outcome="failed", error=describe_error(exc))

    try:
        parsed = feedparser.parse(_clean_char_refs(bytes(body)))
        if parsed.bozo and not parsed.entries:
            reason = describe_error(parsed.bozo_exception) if parsed.get("bozo_exception") else ""
            return FetchResult(
                outcome="failed",
                status=status,
                error=f"not a readable RSS/Atom feed ({reason or 'no entries'})",
            )
        if not parsed.entries and not parsed.get("version"):
            # an empty body, an HTML page, XML that is no feed: a failure, counted toward parking
            return FetchResult(
                outcome="failed", status=status, error="not an RSS/Atom feed (no feed found)"
            )
        items = _items(parsed.entries)
    except Exception as exc:  # untrusted bytes: whatever breaks is this feed's failure alone
        return FetchResult(
            outcome="failed", status=status, error=f"could not read the feed: {describe_error(exc)}"
        )
    return FetchResult(
        outcome="ok",
        status=status,
        items=items,
        etag=new_etag,
        last_modified=new_last_modified,
    )


def _clean_char_refs(body: bytes) -> bytes:
    """Replace character references that name no storable character (a surrogate, NUL, past
    U+10FFFF) with U+FFFD, before the parser turns them into text nothing can encode."""
    if b"&#" not in body:
        return body

    def swap(match: re.Match[bytes]) -> bytes:
        hex_digits, decimal = match.groups()
        code = int(hex_digits, 16) if hex_digits else int(decimal)
        if code == 0 or 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            return b"&#xFFFD;"
        return match.group(0)

    return _CHAR_REF.sub(swap, body)


def _text(value: Any, limit: int) -> str:
    """A feed string as it may be stored: no NUL, no lone surrogate, at most ``limit`` chars."""
    return _UNSTORABLE.sub("", str(value)).strip()[:limit]


def _published(stamp: Any) -> datetime | None:
    """The entry's date in UTC; None when there is none or it is impossible (year 0, 10000)."""
    if not stamp:
        return None
    try:
        year, month, day, hour, minute, second = stamp[:6]
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except (TypeError, ValueError, OverflowError):
        return None


def _items(entries: list[Any]) -> list[FeedItem]:
    items: list[FeedItem] = []
    seen: set[str] = set()
    for entry in entries:
        link = entry.get("link") or entry.get("id")
        if not link or not str(link).startswith(("http://", "https://")):
            continue
        if len(str(link)) > MAX_URL_CHARS or _UNSTORABLE.search(str(link)):
            continue  # not an address a reader could follow, nor one an index can hold
        try:
            url = normalize_url(str(link))
        except ValueError:
            continue  # a malformed link (a bad port, a broken IPv6 literal) is not an article
        if url in seen:
            continue
        seen.add(url)
        published = _published(entry.get("published_parsed") or entry.get("updated_parsed"))
        image = None
        for media in entry.get("media_content", []) + entry.get("media_thumbnail", []):
            candidate = media.get("url")
            if candidate and len(str(candidate)) <= MAX_URL_CHARS:
                image = _text(candidate, MAX_URL_CHARS)
                break
        items.append(
            FeedItem(
                url=url,
                title=_text(entry.get("title", ""), MAX_TITLE_CHARS),
                summary=_text(entry.get("summary", ""), MAX_SUMMARY_CHARS),
                published=published,
                image_url=image,
            )
        )
    return items


def next_check(now: datetime, result: FetchResult, interval: timedelta) -> datetime:
    if result.outcome == "retry_later" and result.retry_after_seconds:
        return now + timedelta(seconds=result.retry_after_seconds)
    return now + interval


def new_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(max_redirects=MAX_REDIRECTS, headers={"User-Agent": "nightcrew"})
