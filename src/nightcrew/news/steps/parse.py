"""Feed bytes → entries: ``feedparser-rs`` first (a Rust parser with feedparser's API, about
14 times faster), ``feedparser`` when the fast one fails or finds fewer entries than the document
plainly holds (ill-formed and mis-encoded feeds, where feedparser's forgiving loose parser reads
more). Both results are reduced to the few fields nightcrew uses, as plain values; a title is
plain text whichever parser read it (both hand HTML titles on as markup).

The bytes are untrusted and parsing is CPU work the event loop cannot interrupt (a 5 MB feed of
50,000 linkless items held it 22 to 45 s), so fetches parse in the runtime's parser worker
processes (``adapters/parsers.py``: ``ParserPool``), each task under a hard time limit.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, replace
from typing import Any

import feedparser_rs
from selectolax.parser import HTMLParser

from nightcrew.log import describe_error

PARSE_BUDGET_SECONDS = 10.0
# NEWS_MAX_ITEMS_PER_FEED's default: feedparser-rs's own max_entries; a feed's first items are
# its newest, and a run reviews a few hundred at most
MAX_ITEMS_PER_FEED = 10_000

# An item or entry element opening (any namespace prefix): what a document "plainly holds".
_ENTRY_TAG = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?(?:item|entry)[\s>/]", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RawEntry:
    link: str | None
    title: str
    summary: str
    published: tuple[int, ...] | None
    images: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ParsedFeed:
    """``is_feed`` is False for what is no RSS/Atom document (empty, HTML, other XML)."""

    is_feed: bool
    entries: list[RawEntry]
    parser: str
    problem: str | None = None
    over_cap: int = 0  # entries past the item cap, left unread


def parse_feed(body: bytes, base_url: str, max_items: int = MAX_ITEMS_PER_FEED) -> ParsedFeed:
    """Always bytes to feedparser-rs: given a str that looks like a URL, it would fetch it.
    At most ``max_items`` entries, the document's first; the rest are counted in ``over_cap``."""
    fast = _parse_fast(body, max_items)
    if fast is not None and _fast_is_enough(fast, body, max_items):
        return _capped(fast, body, max_items)
    # imported on first use (in a parser worker, as a rule): it is ~20 ms of every start
    import feedparser

    # a stream, never bytes: given bytes, feedparser first tries them as a file path
    slow = _from_result(
        feedparser.parse(io.BytesIO(body), response_headers={"content-location": base_url}),
        "feedparser",
    )
    if fast is not None and len(fast.entries) > len(slow.entries):
        return _capped(fast, body, max_items)
    return _capped(slow, body, max_items)


def parse_fast_only(
    body: bytes, base_url: str, max_items: int = MAX_ITEMS_PER_FEED
) -> ParsedFeed | None:
    """What ``parse_feed`` returns when feedparser-rs alone reads the document whole (up to
    the item cap); None when feedparser would have to read it too (slow, and not bounded: see
    ``ParserPool``)."""
    fast = _parse_fast(body, max_items)
    if fast is None or not _fast_is_enough(fast, body, max_items):
        return None
    return _capped(fast, body, max_items)


def _parse_fast(body: bytes, max_items: int) -> ParsedFeed | None:
    try:
        limits = feedparser_rs.ParserLimits(max_entries=max_items)
        parsed = _from_result(
            feedparser_rs.parse_with_limits(bytes(body), limits=limits), "feedparser-rs"
        )
    except Exception:  # a Rust-side panic or a value it cannot convert: the slow path reads it
        return None
    if parsed.problem and _ENTRY_LIMIT in parsed.problem:
        return replace(parsed, problem=None)  # the cap, counted by _capped, is no fault
    return parsed


# feedparser-rs's bozo exception past max_entries
_ENTRY_LIMIT = "Entry limit exceeded"


def _capped(parsed: ParsedFeed, body: bytes, max_items: int) -> ParsedFeed:
    in_document = len(_ENTRY_TAG.findall(body))
    if len(parsed.entries) <= max_items and in_document <= max_items:
        return parsed
    return replace(
        parsed,
        entries=parsed.entries[:max_items],
        over_cap=max(in_document, len(parsed.entries)) - max_items,
    )


def _fast_is_enough(fast: ParsedFeed, body: bytes, max_items: int) -> bool:
    expected = min(len(_ENTRY_TAG.findall(body)), max_items)
    return (
        len(fast.entries) >= expected
        and (fast.is_feed or not expected)
        # feedparser-rs blanks links to private addresses, and leaves a link relative when
        # the xml:base it should resolve against is private; whether those are allowed is the
        # address policy's decision (NEWS_ALLOWED_PRIVATE_HOSTS), so such a feed is read again
        and all(e.link for e in fast.entries)
        and not (b"xml:base" in body and any(_relative(e.link) for e in fast.entries))
    )


def _relative(link: str | None) -> bool:
    return bool(link) and "://" not in (link or "")[:16]


def _from_result(result: Any, parser: str) -> ParsedFeed:
    # only Atom can say a title is text (type="text"); RSS titles are read as HTML, as readers
    # do (feedparser guesses "plain" for markup it does not know, a <script> among it)
    atom = str(result.get("version") or "").startswith("atom")
    entries = [_entry(e, atom=atom) for e in result.entries]
    problem = None
    if result.get("bozo") and result.get("bozo_exception") is not None:
        problem = describe_error(result["bozo_exception"])
    return ParsedFeed(
        is_feed=bool(result.get("version")) or bool(entries),
        entries=entries,
        parser=parser,
        problem=problem,
    )


def _field(entry: Any, name: str) -> Any:
    # feedparser's entries are dicts that also answer attributes; feedparser-rs's answer
    # attributes only (its ``get`` misses some fields)
    return getattr(entry, name, None)


def _entry(entry: Any, *, atom: bool) -> RawEntry:
    link = _field(entry, "link") or _field(entry, "id")
    stamp = _field(entry, "published_parsed") or _field(entry, "updated_parsed")
    images: list[str] = []
    media_items = list(_field(entry, "media_content") or [])
    media_items += list(_field(entry, "media_thumbnail") or [])
    for media in media_items:
        url = media.get("url") if isinstance(media, dict) else getattr(media, "url", None)
        if url:
            images.append(str(url))
    return RawEntry(
        link=str(link) if link else None,
        title=_plain_title(entry, atom=atom),
        summary=str(_field(entry, "summary") or ""),
        published=tuple(stamp[:6]) if stamp else None,
        images=tuple(images),
    )


_MARKUP_TYPES = ("text/html", "application/xhtml+xml")


def _plain_title(entry: Any, *, atom: bool) -> str:
    """The title as text: both parsers hand an HTML title on as markup (feedparser-rs calls
    every RSS title HTML, and escapes a plain one's ``&``), and a title is shown, stored and
    published as text, never as markup."""
    title = str(_field(entry, "title") or "")
    if atom and getattr(_field(entry, "title_detail"), "type", None) not in _MARKUP_TYPES:
        return title
    if "<" not in title:  # most titles: no tags, at most an entity or two
        return html.unescape(title) if "&" in title else title
    tree = HTMLParser(title)
    tree.strip_tags(["script", "style"])
    body = tree.body
    return " ".join((body.text() if body is not None else "").split())
