"""Fetching one RSS/Atom feed, politely and defensively.

Every request has timeouts, a response-size cap (a hostile feed cannot exhaust memory),
bounded redirects (a loop is an error, not a hang), and conditional GET (ETag /
Last-Modified → 304, nothing to parse). 429 and 503 honour ``Retry-After``. Parsing is
``feedparser``'s; a document it cannot read as a feed is a failure with a reason.
"""

from __future__ import annotations

import email.utils
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

    parsed = feedparser.parse(bytes(body))
    if parsed.bozo and not parsed.entries:
        reason = describe_error(parsed.bozo_exception) if parsed.get("bozo_exception") else ""
        return FetchResult(
            outcome="failed",
            status=status,
            error=f"not a readable RSS/Atom feed ({reason or 'no entries'})",
        )
    return FetchResult(
        outcome="ok",
        status=status,
        items=_items(parsed.entries),
        etag=new_etag,
        last_modified=new_last_modified,
    )


def _items(entries: list[Any]) -> list[FeedItem]:
    items: list[FeedItem] = []
    seen: set[str] = set()
    for entry in entries:
        link = entry.get("link") or entry.get("id")
        if not link or not str(link).startswith(("http://", "https://")):
            continue
        try:
            url = normalize_url(str(link))
        except ValueError:
            continue  # a malformed link (a bad port, a broken IPv6 literal) is not an article
        if url in seen:
            continue
        seen.add(url)
        published = None
        stamp = entry.get("published_parsed") or entry.get("updated_parsed")
        if stamp:
            year, month, day, hour, minute, second = stamp[:6]
            published = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        image = None
        for media in entry.get("media_content", []) + entry.get("media_thumbnail", []):
            if media.get("url"):
                image = str(media["url"])
                break
        items.append(
            FeedItem(
                url=url,
                title=str(entry.get("title", "")).strip(),
                summary=str(entry.get("summary", "")).strip(),
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
