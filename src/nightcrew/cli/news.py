"""`nightcrew news`: the news run and its feed sources."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from nightcrew.cli.common import (
    NowOption,
    _clock,
    _print_json,
    _run,
    _settings,
    news_app,
    sources_app,
)
from nightcrew.clock import SystemClock
from nightcrew.runtime import open_database, open_runtime


# --- news ----------------------------------------------------------------------------------------
@news_app.command("run")
def news_run(
    shard: Annotated[str, typer.Option("--shard", help="Which shard to run.")] = "default",
    manual: Annotated[
        bool,
        typer.Option(
            "--manual", help="A manual run (a held lock is answered with a skipped report)."
        ),
    ] = False,
    now: NowOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run one shard of the news worker once and print its report."""
    from nightcrew.news.run import run_shard

    settings = _settings()
    clock = _clock(now)

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime:
            report = await run_shard(
                runtime, clock, shard, trigger="manual" if manual else "scheduled"
            )
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
        return
    state = (
        "skipped (locked)"
        if report["skipped"]
        else ("deferred" if report["deferredReasons"] else "done")
    )
    typer.echo(f"news shard {report['shard']}: {state}, {report['durationMs']:.0f} ms")
    for key in (
        "queuedCount",
        "processedCount",
        "aiReviewedCount",
        "acceptedCount",
        "rejectedCount",
        "deferredCount",
        "retriedCount",
        "lockedCount",
        "redisAiReviewLockSkippedCount",
        "redisEnabled",
    ):
        typer.echo(f"  {key:<32} {report[key]}")
    for reason in report["deferredReasons"]:
        typer.echo(f"  deferred: {reason}")
    for failure in report["fetchErrors"]:
        typer.echo(f"  ! {failure['source']}: {failure['error']}")


@sources_app.command("add")
def news_sources_add(
    url: Annotated[str, typer.Argument(help="The feed's http(s) URL.")],
    name: Annotated[str, typer.Option("--name", help="A name for reports.")],
    shard: Annotated[str, typer.Option("--shard", help="Which shard fetches it.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print the source as JSON.")] = False,
) -> None:
    """Add a feed source."""
    from nightcrew.news.sources import add_source

    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return await add_source(db, url=url, name=name, shard=shard, now=SystemClock().now())

    row = _run(work, settings)
    if as_json:
        _print_json(row)
    else:
        typer.echo(f"added source {row['id']} ({row['name']}) on shard {row['shard']}")


@sources_app.command("list")
def news_sources_list(
    shard: Annotated[str | None, typer.Option("--shard", help="Only this shard.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the sources as JSON.")] = False,
) -> None:
    """List feed sources, with their fetch health."""
    from nightcrew.news.sources import list_sources

    settings = _settings()

    async def work() -> list[dict[str, Any]]:
        async with open_database(settings) as db:
            return await list_sources(db, shard=shard)

    rows = _run(work, settings)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        state = "parked" if row["parked_at"] else "enabled" if row["enabled"] else "disabled"
        failures = (
            f", {row['consecutive_failures']} failures" if row["consecutive_failures"] else ""
        )
        typer.echo(
            f"{row['id']:>5}  {row['shard']:<10} {state:<9} {row['name']}  "
            f"{row['feed_url']}{failures}"
        )
    if not rows:
        typer.echo("no sources yet: nightcrew news sources add URL --name NAME")


def _set_source(ref: str, enabled: bool) -> None:
    from nightcrew.news.sources import set_enabled

    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return await set_enabled(db, ref, enabled=enabled)

    row = _run(work, settings)
    typer.echo(f"{'enabled' if enabled else 'disabled'} source {row['id']} ({row['name']})")


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
