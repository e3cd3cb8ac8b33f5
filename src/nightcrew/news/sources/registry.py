"""News sources: add, import, list, disable, and record what each fetch left behind."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from nightcrew.db.database import Database, Tx
from nightcrew.db.queries import load_queries
from nightcrew.errors import NightcrewError
from nightcrew.jsonable import Jsonable, JsonObject
from nightcrew.log import event, warning
from nightcrew.news.sources.opml import (
    FeedEntry,
    FeedList,
    FileFormat,
    Skipped,
    SkipReason,
)
from nightcrew.news.steps.fetch import FetchResult, next_check

SQL = load_queries(__file__)

# A source failing this many times in a row is parked (reported, not retried every run).
PARK_AFTER_FAILURES = 5
CHECK_INTERVAL = timedelta(minutes=15)


class SourceError(NightcrewError):
    """A source command was refused; the message says why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """A source as every query of it names it (``disable_source``, ``enable_source``)."""

    id: int
    name: str
    feed_url: str
    shard: str


@dataclass(frozen=True, kw_only=True, slots=True)
class AddedSource(Source):
    """A source just added (``add_source``)."""

    enabled: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ListedSource(Source):
    """A source with its fetch health (``list_sources``)."""

    enabled: bool
    consecutive_failures: int
    last_error: str | None
    last_fetched_at: datetime | None
    next_check_at: datetime | None
    parked_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DueSource(Source):
    """A source to fetch (``due_sources``): what its conditional GET sends, and what its
    fetch is reported by."""

    etag: str | None
    last_modified: str | None
    body_hash: str | None
    consecutive_failures: int


@dataclass(frozen=True, kw_only=True, slots=True)
class _Failures:
    """A source's failures after one more (``record_failure``)."""

    consecutive_failures: int
    parked_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Imported:
    """An import's answer for the file's entry on ``line`` (``import_sources``)."""

    line: int
    added_id: int | None
    existing_id: int | None
    existing_shard: str | None


# a DNS name as the address policy will resolve it (underscores are seen in the wild)
_HOST_NAME = re.compile(
    r"^(?=.{1,253}\.?$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
    r"(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?$"
)


def validate_feed_url(url: str) -> str:
    """An http(s) URL whose host is an address or a name that could resolve: a host with a
    space in it was accepted, then refused at every run as a private address."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # "http://[oops/": an unclosed IPv6 bracket
        raise SourceError(f"not a feed URL ({exc}): {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SourceError(f"not an http(s) feed URL: {url!r}")
    try:
        host = parts.hostname or ""
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise SourceError(f"not a feed URL ({exc}): {url!r}") from None
    if not _is_host(host):
        raise SourceError(f"not a host name or address: {host!r} in {url!r}")
    return url.strip()


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        ascii_name = host.encode("idna").decode("ascii")
    except UnicodeError:
        return False
    return bool(_HOST_NAME.match(ascii_name.lower()))


def refusal_hint(urls: list[str], allowed_private_hosts: str) -> list[str]:
    """What a run will refuse among ``urls`` for its address, one line per host, naming the
    setting that allows it — told when the source is added, not found at the first run. Only
    what can be said without DNS (a literal address, localhost, an internal name): adding a
    source never touches the network."""
    from nightcrew.adapters.addresses import AddressPolicy, UnsafeURL

    policy = AddressPolicy.parse(allowed_private_hosts)
    hints: dict[str, str] = {}
    for url in urls:
        host = urlsplit(url).hostname or ""
        if not host or host in hints:
            continue
        try:
            policy.check_host(host)
        except UnsafeURL as exc:
            hints[host] = (
                f"{exc}: news runs refuse it unless NEWS_ALLOWED_PRIVATE_HOSTS names it"
                f" (e.g. NEWS_ALLOWED_PRIVATE_HOSTS={host}); once it does, the next run"
                " fetches it"
            )
    return list(hints.values())


async def add_source(
    db: Database, *, url: str, name: str, shard: str, now: datetime
) -> AddedSource:
    added = await db.fetch_one_as(
        AddedSource,
        SQL["add_source"],
        {"name": name, "feed_url": validate_feed_url(url), "shard": shard, "now": now},
    )
    if added is None:
        raise SourceError(f"a source with feed URL {url!r} already exists")
    return added


def source_name_for(url: str) -> str:
    """The name of a source its list gave none: the feed URL's host."""
    parts = urlsplit(url)
    return parts.hostname or parts.netloc


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportedSource(Jsonable):
    line: int
    id: int | None  # None in a dry run
    name: str
    feed_url: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportReport:
    """What an import added (or, dry, would add) and every entry it skipped, with why."""

    format: FileFormat
    shard: str
    dry_run: bool
    added: tuple[ImportedSource, ...]
    skipped: tuple[Skipped, ...]

    def skipped_by_reason(self) -> dict[str, int]:
        counts = {reason.value: 0 for reason in SkipReason}
        for skip in self.skipped:
            counts[skip.reason.value] += 1
        return counts

    def to_json(self) -> JsonObject:
        # the counts are computed, and a skipped entry's JSON is opml.Skipped's own
        return {
            "format": self.format,
            "shard": self.shard,
            "dryRun": self.dry_run,
            "entryCount": len(self.added) + len(self.skipped),
            "addedCount": len(self.added),
            "skippedCount": len(self.skipped),
            "skippedByReason": self.skipped_by_reason(),
            "added": [source.to_json() for source in self.added],
            "skipped": [skip.to_json() for skip in self.skipped],
        }


def check_import(feeds: FeedList) -> tuple[list[ImportedSource], list[Skipped]]:
    """The file's entries that may become sources (URL checked as `sources add` checks it, the
    first of each URL), and those that may not."""
    candidates: list[ImportedSource] = []
    skipped = list(feeds.skipped)
    first_line: dict[str, int] = {}
    for entry in feeds.entries:
        try:
            url = validate_feed_url(entry.url)
        except SourceError as exc:
            skipped.append(_skip(entry, SkipReason.invalid_url, str(exc), url=entry.url))
            continue
        if url in first_line:
            earlier = f"the same feed URL as line {first_line[url]}"
            skipped.append(_skip(entry, SkipReason.duplicate, earlier, url=url))
            continue
        first_line[url] = entry.line
        name = entry.name or source_name_for(url)
        candidates.append(ImportedSource(line=entry.line, id=None, name=name, feed_url=url))
    return candidates, skipped


def _skip(
    entry: FeedEntry | ImportedSource, reason: SkipReason, detail: str, *, url: str
) -> Skipped:
    """Why the file's entry on ``entry.line`` did not become a source."""
    return Skipped(line=entry.line, reason=reason, url=url, name=entry.name, detail=detail)


async def import_sources(
    db: Database, feeds: FeedList, *, shard: str, now: datetime, dry_run: bool = False
) -> ImportReport:
    """Add a parsed file's sources to ``shard`` in one statement; a dry run only reads."""
    candidates, skipped = check_import(feeds)
    rows = await db.fetch_as(
        _Imported,
        SQL["preview_import" if dry_run else "import_sources"],
        {
            "lines": [source.line for source in candidates],
            "names": [source.name for source in candidates],
            "feed_urls": [source.feed_url for source in candidates],
            "shard": shard,
            "now": now,
        },
    )
    outcome = {imported.line: imported for imported in rows}
    added: list[ImportedSource] = []
    for source in candidates:
        answer = outcome[source.line]
        if answer.added_id is not None or (dry_run and answer.existing_id is None):
            added.append(replace(source, id=answer.added_id))
            continue
        known = (
            f"already source {answer.existing_id} on shard {answer.existing_shard}"
            if answer.existing_id is not None
            else "already a source (added while this import ran)"
        )
        skipped.append(_skip(source, SkipReason.exists, known, url=source.feed_url))
    return ImportReport(
        format=feeds.format,
        shard=shard,
        dry_run=dry_run,
        added=tuple(added),
        skipped=tuple(sorted(skipped, key=lambda skip: skip.line)),
    )


async def list_sources(db: Database, *, shard: str | None = None) -> list[ListedSource]:
    return await db.fetch_as(ListedSource, SQL["list_sources"], {"shard": shard})


async def set_enabled(db: Database, ref: str, *, enabled: bool) -> Source:
    source = await db.fetch_one_as(
        Source, SQL["enable_source" if enabled else "disable_source"], {"ref": ref}
    )
    if source is None:
        raise SourceError(f"no source {ref!r} (give its id or its feed URL)")
    return source


async def due_sources(db: Database, shard: str, now: datetime) -> list[DueSource]:
    """The shard's sources whose next check is due (the inline run fetches them)."""
    return await db.fetch_as(DueSource, SQL["due_sources"], {"shard": shard, "now": now})


async def record_fetch(
    db: Database | Tx, source: Source, result: FetchResult, now: datetime
) -> None:
    if result.outcome in ("ok", "not_modified"):
        await db.execute(
            SQL["record_success"],
            {
                "id": source.id,
                "etag": result.etag,
                "last_modified": result.last_modified,
                "body_hash": result.body_hash,
                "now": now,
                "next_check_at": next_check(now, result, CHECK_INTERVAL),
            },
        )
        return
    failures = await db.fetch_one_as(
        _Failures,
        SQL["record_failure"],
        {
            "id": source.id,
            "error": result.error,
            "now": now,
            "next_check_at": next_check(now, result, CHECK_INTERVAL),
            "park_after": PARK_AFTER_FAILURES,
        },
    )
    if result.refused_address:
        # not "the feed failed": the operator's setting decides, so say which one
        warning(
            "news.source_refused",
            source_id=source.id,
            feed_url=source.feed_url,
            error=result.error,
            hint="allow it with NEWS_ALLOWED_PRIVATE_HOSTS; it is tried again on every run"
            " (once parked, `news sources enable` frees it)",
        )
    if failures is not None and failures.parked_at is not None:
        warning(
            "news.source_parked",
            source_id=source.id,
            feed_url=source.feed_url,
            failures=failures.consecutive_failures,
            error=result.error,
        )
    elif not result.refused_address:
        event(
            "news.source_fetch_failed",
            source_id=source.id,
            error=result.error,
            outcome=result.outcome,
        )
