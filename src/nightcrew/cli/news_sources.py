"""`nightcrew news sources`: the feeds — add, list, disable, enable, import, export."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Annotated

import typer

from nightcrew.cli.common import (
    _fail,
    _print_json,
    _run,
    _settings,
    open_database,
    sources_app,
)
from nightcrew.clock import SystemClock
from nightcrew.log import redact_url_passwords

if TYPE_CHECKING:
    from nightcrew.news.sources.registry import (
        AddedSource,
        ImportReport,
        ListedSource,
        Source,
    )


@sources_app.command("add")
def news_sources_add(
    url: Annotated[str, typer.Argument(help="The feed's http(s) URL.")],
    name: Annotated[str, typer.Option("--name", help="A name for reports.")],
    shard: Annotated[str, typer.Option("--shard", help="Which shard fetches it.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print the source as JSON.")] = False,
) -> None:
    """Add a feed source."""
    from nightcrew.news.sources.registry import SourceError, add_source, validate_feed_url

    # a URL that can never be fetched is a bad argument (exit 2), refused before any database
    try:
        validate_feed_url(url)
    except SourceError as exc:
        _fail(str(exc), 2)
    settings = _settings()

    async def work() -> AddedSource:
        async with open_database(settings) as db:
            return await add_source(db, url=url, name=name, shard=shard, now=SystemClock().now())

    added = _run(work, settings)
    if as_json:
        _print_json(asdict(added))  # the source as its row: the columns' names
    else:
        typer.echo(f"added source {added.id} ({added.name}) on shard {added.shard}")
    _warn_refused([added.feed_url], settings.news_allowed_private_hosts)


def _warn_refused(urls: list[str], allowed_private_hosts: str) -> None:
    """On stderr (a --json answer stays one document): a source added for a host the runs
    will refuse, with the setting that allows it."""
    from nightcrew.news.sources.registry import refusal_hint

    for hint in refusal_hint(urls, allowed_private_hosts):
        typer.echo(f"note: {hint}", err=True)


ShowSecrets = Annotated[
    bool,
    typer.Option(
        "--show-secrets", help="Show the passwords in feed URLs (https://user:password@…)."
    ),
]


def _shown(source: ListedSource, show_secrets: bool) -> ListedSource:
    if show_secrets:
        return source
    return replace(source, feed_url=redact_url_passwords(source.feed_url))


@sources_app.command("list")
def news_sources_list(
    shard: Annotated[str | None, typer.Option("--shard", help="Only this shard.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the sources as JSON.")] = False,
    show_secrets: ShowSecrets = False,
) -> None:
    """List feed sources, with their fetch health (a feed URL's password shown as
    [redacted] unless --show-secrets)."""
    from nightcrew.news.sources.registry import list_sources

    settings = _settings()

    async def work() -> list[ListedSource]:
        async with open_database(settings) as db:
            return await list_sources(db, shard=shard)

    sources = [_shown(source, show_secrets) for source in _run(work, settings)]
    if as_json:
        _print_json([asdict(source) for source in sources])  # as their rows: the columns' names
        return
    if not sources:
        typer.echo("no sources yet: nightcrew news sources add URL --name NAME")
        return
    table = [("ID", "SHARD", "STATE", "FAILURES", "NAME", "FEED URL")] + [
        (
            str(s.id),
            s.shard,
            "parked" if s.parked_at else "enabled" if s.enabled else "disabled",
            str(s.consecutive_failures or 0),
            s.name,
            s.feed_url,
        )
        for s in sources
    ]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]) - 1)]
    for cells in table:
        # the id and the failures right-aligned, as numbers; the URL last, never padded
        padded = [
            cell.rjust(width) if i in (0, 3) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=False))
        ]
        typer.echo("  ".join([*padded, cells[-1]]))


def _set_source(ref: str, enabled: bool) -> None:
    from nightcrew.operator_actions import CLI, set_source_enabled

    settings = _settings()

    async def work() -> Source:
        async with open_database(settings) as db:
            return await set_source_enabled(db, SystemClock(), CLI, ref, enabled=enabled)

    source = _run(work, settings)
    typer.echo(f"{'enabled' if enabled else 'disabled'} source {source.id} ({source.name})")


@sources_app.command("disable")
def news_sources_disable(
    ref: Annotated[str, typer.Argument(help="The source's id or feed URL.")],
) -> None:
    """Stop fetching a source."""
    _set_source(ref, False)


@sources_app.command("enable")
def news_sources_enable(
    ref: Annotated[str, typer.Argument(help="The source's id or feed URL.")],
) -> None:
    """Fetch a source again (also un-parks it and clears its failure count)."""
    _set_source(ref, True)


@sources_app.command("import")
def news_sources_import(
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE", help="An OPML file (a feed reader's export) or a URL list; - is stdin."
        ),
    ],
    shard: Annotated[str, typer.Option("--shard", help="Which shard fetches them.")] = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would be added; add nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Add many feed sources at once: OPML (nested categories walked) or one URL per line
    (`URL [NAME]`, # comments). Each entry skipped is reported with its line and why."""
    from nightcrew.news.sources.opml import FeedListError, parse_feed_list
    from nightcrew.news.sources.registry import import_sources

    started = time.monotonic()
    label = "<stdin>" if file == "-" else file
    # the whole file is parsed before the database is touched: a file that cannot be read
    # adds nothing
    try:
        feeds = parse_feed_list(_read_feed_list(file))
    except OSError as exc:
        _fail(f"cannot read {label}: {exc.strerror or exc}", 2)
    except FeedListError as exc:
        _fail(f"{label}: {exc}", 2)
    settings = _settings()

    async def work() -> ImportReport:
        async with open_database(settings) as db:
            return await import_sources(
                db, feeds, shard=shard, now=SystemClock().now(), dry_run=dry_run
            )

    report = _run(work, settings)
    elapsed_ms = (time.monotonic() - started) * 1000
    _warn_refused([a.feed_url for a in report.added], settings.news_allowed_private_hosts)
    if as_json:
        _print_json({"file": label, **report.to_json(), "durationMs": round(elapsed_ms, 1)})
        return
    for skip in report.skipped:
        typer.echo(
            f"line {skip.line:>5}  {skip.reason.value:<14} {skip.url or '-'}  ({skip.detail})"
        )
    reasons = ", ".join(f"{n} {reason}" for reason, n in report.skipped_by_reason().items() if n)
    typer.echo(
        f"{'dry run: would add' if dry_run else 'added'} {len(report.added)} of"
        f" {len(report.added) + len(report.skipped)} entries from {label} ({report.format})"
        f" to shard {shard}; skipped {len(report.skipped)}{f' ({reasons})' if reasons else ''};"
        f" {elapsed_ms:.0f} ms"
    )


def _read_feed_list(file: str) -> bytes:
    from nightcrew.news.sources.opml import MAX_FILE_BYTES

    # one byte past the cap: the parser refuses an oversized file by name, never a truncated one
    if file == "-":
        return sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    with open(file, "rb") as handle:
        return handle.read(MAX_FILE_BYTES + 1)


@sources_app.command("export")
def news_sources_export(
    opml: Annotated[
        bool, typer.Option("--opml", help="As an OPML 2.0 document (the one format so far).")
    ] = False,
    shard: Annotated[str | None, typer.Option("--shard", help="Only this shard.")] = None,
    show_secrets: ShowSecrets = False,
) -> None:
    """Write the feed sources to stdout as OPML (disabled and parked ones too): any feed reader,
    and `news sources import`, reads it back. A feed URL's password is written as [redacted]
    unless --show-secrets (a document to move the sources elsewhere needs it)."""
    from nightcrew.news.sources.opml import OpmlFeed, build_opml
    from nightcrew.news.sources.registry import list_sources

    # --opml is required so that a second format later cannot change what a script gets
    if not opml:
        _fail("news sources export: give --opml (the one format so far)", 2)
    settings = _settings()

    async def work() -> list[ListedSource]:
        async with open_database(settings) as db:
            return await list_sources(db, shard=shard)

    sources = [_shown(source, show_secrets) for source in _run(work, settings)]
    document = build_opml(
        (OpmlFeed(name=s.name, feed_url=s.feed_url) for s in sources),
        title="nightcrew news sources" + (f" (shard {shard})" if shard else ""),
        created=SystemClock().now(),
    )
    typer.echo(document, nl=False)
