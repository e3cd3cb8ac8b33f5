"""Entries: what a feed's bytes hold, made items that may be stored — every one sanitised
before it goes anywhere (NUL and lone surrogates removed — PostgreSQL text holds neither —,
titles and summaries bounded, an item whose link cannot be stored dropped — counted by reason,
so the run reports it —, an impossible date read as no date). A link's bound is 2,048 UTF-8
bytes of its stored (normalised) form: a multibyte IRI counted in characters could still exceed
what PostgreSQL's btree index holds in one row. Links are resolved against the feed's own
address (``xml:base`` and ``Content-Location`` first), schemes compared case-insensitively,
credentials stripped; a feed's image URL must pass the address policy.

``read_feed_body`` runs in a parser worker process (``fetch`` hands it to the runtime's
``ParserPool``): it never raises, whatever the bytes say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import SplitResult, parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from nightcrew.adapters.addresses import PLAIN_URL, AddressPolicy, join_host, split_host
from nightcrew.log import describe_error
from nightcrew.news.steps.parse import MAX_ITEMS_PER_FEED, ParsedFeed, RawEntry, parse_feed

# the note of a feed's items past NEWS_MAX_ITEMS_PER_FEED, in a report's dropped items
OVER_ITEM_CAP = "past the feed's item cap (NEWS_MAX_ITEMS_PER_FEED)"

TRACKING_PARAMS = ("utm_", "fbclid", "gclid", "mc_cid", "mc_eid")
# Bounds on what one item may carry into the database, the snapshot and a model's prompt.
MAX_TITLE_CHARS = 1024
MAX_SUMMARY_CHARS = 16 * 1024
# Bytes, not characters: the bound keeps a stored URL well inside a btree index row (~2.7 kB).
MAX_URL_BYTES = 2048

# Numeric character references: feedparser turns one naming a surrogate into a lone surrogate
# that later fails to encode (inside feedparser itself), and one naming NUL into a NUL.
_CHAR_REF = re.compile(rb"&#(?:[xX]([0-9a-fA-F]{1,8})|([0-9]{1,10}));")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedItem:
    url: str
    title: str
    summary: str
    published: datetime | None
    image_url: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ItemLimits:
    """How much of one feed and item is kept (``NEWS_MAX_ITEMS_PER_FEED``,
    ``NEWS_MAX_TITLE_CHARS``, ``NEWS_MAX_SUMMARY_CHARS``)."""

    title_chars: int = MAX_TITLE_CHARS
    summary_chars: int = MAX_SUMMARY_CHARS
    # a feed's first items (its newest); the rest are dropped with a note, not a failure
    max_items: int = MAX_ITEMS_PER_FEED


def normalize_url(url: str) -> str:
    """The identity of an article: scheme and host lower-cased, no fragment, no tracking
    parameters, the remaining query sorted — so the same story is seen once."""
    return _normalize(urlsplit(url.strip()))[0]


def _normalize(parts: SplitResult) -> tuple[str, str]:
    """(normalised URL, its host); ValueError for a port out of range: not an article's."""
    host, port = split_host(parts)
    query = (
        urlencode(
            sorted(
                (k, v)
                for k, v in parse_qsl(parts.query, keep_blank_values=True)
                if not k.lower().startswith(TRACKING_PARAMS)
            )
        )
        if parts.query
        else ""
    )
    scheme = parts.scheme.lower()
    if (scheme, port) in (("https", 443), ("http", 80)):
        port = None
    netloc = join_host(host, port)  # lower-cased host, and no ``user:secret@``
    return urlunsplit((scheme, netloc, parts.path or "/", query, "")), host


@dataclass(frozen=True, kw_only=True, slots=True)
class FeedRead:
    """What a feed's bytes hold, as ``read_feed_body`` found it: the storable items and the
    dropped ones by reason, or why the document cannot be read."""

    items: list[FeedItem] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    parser: str | None = None
    error: str | None = None


def read_feed_body(body: bytes, base: str, policy: AddressPolicy, limits: ItemLimits) -> FeedRead:
    """A feed's bytes → its items. Runs in a parser worker process (``ParserPool.run``); never
    raises: whatever breaks is this feed's failure alone."""
    try:
        parsed = parse_feed(clean_char_refs(body), base, limits.max_items)
        return feed_read(parsed, base, policy, limits)
    except Exception as exc:  # untrusted bytes: whatever breaks is this feed's failure alone
        return FeedRead(error=f"could not read the feed: {describe_error(exc)}")


def feed_read(parsed: ParsedFeed, base: str, policy: AddressPolicy, limits: ItemLimits) -> FeedRead:
    if not parsed.is_feed or (parsed.problem and not parsed.entries):
        # an empty body, an HTML page, XML that is no feed: a failure, counted toward parking
        problem = parsed.problem or "no feed found"
        return FeedRead(error=f"not a readable RSS/Atom feed ({problem})")
    try:
        items, dropped = _items(parsed.entries, base, policy, limits)
    except Exception as exc:  # untrusted bytes: whatever breaks is this feed's failure alone
        return FeedRead(error=f"could not read the feed: {describe_error(exc)}")
    if parsed.over_cap:
        dropped[OVER_ITEM_CAP] = parsed.over_cap
    return FeedRead(items=items, dropped=dropped, parser=parsed.parser)


def clean_char_refs(body: bytes) -> bytes:
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


def _text(value: str, limit: int) -> str:
    """A feed string as it may be stored: no NUL, no lone surrogate, at most ``limit`` chars."""
    return _UNSTORABLE.sub("", value).strip()[:limit]


def _published(stamp: tuple[int, ...] | None) -> datetime | None:
    """The entry's date in UTC; None when there is none or it is impossible (year 0, 10000)."""
    if not stamp:
        return None
    try:
        year, month, day, hour, minute, second = stamp[:6]
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except (TypeError, ValueError, OverflowError):
        return None


def _absolute(link: str, base: str) -> str:
    # most links are absolute already: urljoin (a split, a join) only for those that are not
    head = link[:8].lower()
    if head.startswith("https://") or head.startswith("http://"):
        return link
    return urljoin(base, link)


def article_url(link: str, base: str) -> str | None:
    """The normalised address a reader can follow, or None: resolved against the feed's
    address, http(s) in any case, at most 2,048 UTF-8 bytes, nothing an index cannot hold."""
    return _article_url(link, base)[0]


# Why an item's link was not kept (FetchResult.dropped, the report's droppedItems).
NO_LINK = "no link"
LINK_TOO_LONG = f"link longer than {MAX_URL_BYTES} bytes"
LINK_UNSTORABLE = "link holds a NUL or a lone surrogate"
LINK_NOT_HTTP = "link is not http(s)"
LINK_MALFORMED = "malformed link"


def _article_url(link: str, base: str) -> tuple[str | None, str | None]:
    """(normalised URL, None), or (None, why not)."""
    # characters never outnumber UTF-8 bytes: a link this long raw cannot be kept (unless
    # its tracking parameters alone made it so — dropped all the same, before any parsing)
    if len(link) > MAX_URL_BYTES:
        return None, LINK_TOO_LONG
    if _UNSTORABLE.search(link):
        return None, LINK_UNSTORABLE
    try:
        absolute = _absolute(link.strip(), base)
    except ValueError:  # "//[": joining it splits a broken IPv6 literal; this item's alone
        return None, LINK_MALFORMED
    plain = PLAIN_URL.fullmatch(absolute)
    if plain is not None and plain["query"] is None:  # its own normal form (addresses.py)
        url = absolute if plain["path"] else absolute + "/"
        return (url, None) if len(url) <= MAX_URL_BYTES else (None, LINK_TOO_LONG)
    return _article_url_split(absolute)


def _article_url_split(absolute: str) -> tuple[str | None, str | None]:
    """``_article_url`` of an absolute link, split, normalised and joined again."""
    try:
        parts = urlsplit(absolute)
        if parts.scheme.lower() not in ("http", "https"):
            return None, LINK_NOT_HTTP
        url, host = _normalize(parts)
    except ValueError:
        return None, LINK_MALFORMED  # a bad port, a broken IPv6 literal: not an article
    if not host:
        return None, LINK_MALFORMED
    # the stored form can be longer than the link (a query's IRI characters come back
    # percent-encoded): it is the stored form the index holds
    if len(url.encode()) > MAX_URL_BYTES:
        return None, LINK_TOO_LONG
    return url, None


def _image(candidates: Iterable[str], base: str, policy: AddressPolicy) -> str | None:
    for candidate in candidates:
        if len(candidate) > MAX_URL_BYTES or _UNSTORABLE.search(candidate):
            continue
        image = policy.published_url(_absolute(candidate.strip(), base))
        if image is not None and len(image.encode()) <= MAX_URL_BYTES:
            return image
    return None


def _items(
    entries: list[RawEntry], base: str, policy: AddressPolicy, limits: ItemLimits
) -> tuple[list[FeedItem], dict[str, int]]:
    """The feed's storable items, and how many were dropped for each reason."""
    items: list[FeedItem] = []
    dropped: dict[str, int] = {}
    seen: set[str] = set()
    for entry in entries:
        url, why = _article_url(entry.link, base) if entry.link else (None, NO_LINK)
        if url is None:
            reason = why or NO_LINK
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        if url in seen:  # the same story twice in one feed: not a loss
            continue
        seen.add(url)
        items.append(
            FeedItem(
                url=url,
                title=_text(entry.title, limits.title_chars),
                summary=_text(entry.summary, limits.summary_chars),
                published=_published(entry.published),
                image_url=_image(entry.images, base, policy) if entry.images else None,
            )
        )
    return items, dropped
