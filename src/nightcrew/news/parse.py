"""Feed bytes → entries: ``feedparser-rs`` first (a Rust parser with feedparser's API, about
14 times faster), ``feedparser`` when the fast one fails or finds fewer entries than the document
plainly holds (ill-formed and mis-encoded feeds, where feedparser's forgiving loose parser reads
more). Both results are reduced to the few fields nightcrew uses, as plain values; a title is
plain text whichever parser read it (both hand HTML titles on as markup).

The bytes are untrusted and parsing is CPU work the event loop cannot interrupt (a 5 MB feed of
50,000 linkless items held it 22 to 45 s), so fetches parse through ``off_loop``: in a pool of
worker processes, each task under a hard time limit — a worker past it is killed and replaced
(a thread could not be stopped). Workers are spawned, never forked, from a process that runs
threads (the database pool's, the scheduler's), and the pool is shared by the whole process.
"""

from __future__ import annotations

import asyncio
import atexit
import html
import io
import multiprocessing
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import feedparser
import feedparser_rs
import pebble
from selectolax.parser import HTMLParser

from nightcrew.errors import FetchError
from nightcrew.log import describe_error

T = TypeVar("T")

PARSE_BUDGET_SECONDS = 10.0
# At least two, so one hostile feed holding a worker for its whole budget never stops every
# other feed's parse; at most four: parsing is a small share of a run (the database is most).
PARSE_WORKERS = max(2, min(4, os.cpu_count() or 1))

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


def parse_feed(body: bytes, base_url: str) -> ParsedFeed:
    """Always bytes to feedparser-rs: given a str that looks like a URL, it would fetch it."""
    fast = _parse_fast(body)
    if fast is not None and _fast_is_enough(fast, body):
        return fast
    # a stream, never bytes: given bytes, feedparser first tries them as a file path
    slow = _from_result(
        feedparser.parse(io.BytesIO(body), response_headers={"content-location": base_url}),
        "feedparser",
    )
    if fast is not None and len(fast.entries) > len(slow.entries):
        return fast
    return slow


def parse_fast_only(body: bytes, base_url: str) -> ParsedFeed | None:
    """What ``parse_feed`` returns when feedparser-rs alone reads the document whole; None when
    feedparser would have to read it too (slow, and not bounded: see ``off_loop``)."""
    fast = _parse_fast(body)
    return fast if fast is not None and _fast_is_enough(fast, body) else None


def _parse_fast(body: bytes) -> ParsedFeed | None:
    try:
        return _from_result(feedparser_rs.parse(bytes(body)), "feedparser-rs")
    except Exception:  # a Rust-side panic or a value it cannot convert: the slow path reads it
        return None


def _fast_is_enough(fast: ParsedFeed, body: bytes) -> bool:
    expected = len(_ENTRY_TAG.findall(body))
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
    kind = getattr(_field(entry, "title_detail"), "type", None)
    if atom and kind not in _MARKUP_TYPES:
        return title
    if "<" not in title:  # most titles: no tags, at most an entity or two
        return html.unescape(title) if "&" in title else title
    tree = HTMLParser(title)
    tree.strip_tags(["script", "style"])
    body = tree.body
    return " ".join((body.text() if body is not None else "").split())


# --- parsing off the event loop ------------------------------------------------------------------
class ParseOverBudget(FetchError):
    """Parsing one document took longer than its budget; the worker doing it was killed."""


class ParserDied(FetchError):
    """The worker process parsing a document ended (a crash in native code, out of memory)."""


_pool: pebble.ProcessPool | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _parser_pool() -> pebble.ProcessPool:
    global _pool, _pool_pid
    with _pool_lock:
        # a forked child inherits the object but not the threads that run it: a pool of its own
        if _pool is None or _pool_pid != os.getpid() or not _pool.active:
            _pool = pebble.ProcessPool(
                max_workers=PARSE_WORKERS, context=multiprocessing.get_context("spawn")
            )
            _pool_pid = os.getpid()
        return _pool


@atexit.register
def shutdown_parser_pool() -> None:
    """Stop the workers now. Registered at exit: multiprocessing's own exit handler would wait
    for them, and they wait for work (pebble's workers are not daemons)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and _pool_pid == os.getpid():
        pool.stop()  # type: ignore[no-untyped-call]  # pebble leaves stop() unannotated
        pool.join(timeout=10)


async def off_loop(function: Callable[..., T], *args: Any, budget_seconds: float) -> T:
    """``function(*args)`` in a parser worker process, at most ``budget_seconds`` once a
    worker has taken it. ParseOverBudget past that (the worker is killed and replaced),
    ParserDied if the worker ended; the function's own exception is raised as it was. A
    caller that is cancelled (its fetch budget) cancels the task, which kills its worker."""
    try:
        future = _parser_pool().schedule(function, args=args, timeout=budget_seconds)
    except RuntimeError:  # the pool stopped between the check and the call: once more
        future = _parser_pool().schedule(function, args=args, timeout=budget_seconds)
    try:
        return await asyncio.wrap_future(future)
    except TimeoutError as exc:  # pebble's: the task's own limit, not an asyncio timeout
        raise ParseOverBudget(
            f"parsing took longer than the {budget_seconds:g} s parse budget"
        ) from exc
    except pebble.ProcessExpired as exc:
        raise ParserDied(f"the parser process died (exit code {exc.exitcode})") from exc
    except BrokenProcessPool as exc:
        raise ParserDied(f"the parser pool broke: {describe_error(exc)}") from exc
