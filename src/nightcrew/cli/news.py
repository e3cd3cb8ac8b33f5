"""`nightcrew news`: the news run and its feed sources."""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from typing import Annotated, Any

import typer

from nightcrew.cli.common import (
    NowOption,
    _clock,
    _fail,
    _print_json,
    _run,
    _settings,
    dlq_app,
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
    """Run one shard of the news worker once and print its report.

    With NEWS_PIPELINE=rabbitmq this is a pass: the shard's due sources go to the fetch queue,
    held candidates are released into stages with room, and the stage workers do the rest."""
    from nightcrew.news.schedule import run_or_enqueue

    settings = _settings()
    clock = _clock(now)

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime:
            report = await run_or_enqueue(
                runtime, clock, shard, trigger="manual" if manual else "scheduled"
            )
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
        return
    if report.get("pipeline") == "rabbitmq":
        _print_pass(report)
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


def _print_pass(report: dict[str, Any]) -> None:
    state = "deferred" if report["deferredReasons"] else "done"
    typer.echo(f"news shard {report['shard']}: pass {state}, {report['durationMs']:.0f} ms")
    for key in (
        "enqueuedSources",
        "releasedCount",
        "resentCount",
        "relayedCount",
        "queuedCount",
        "deferredCount",
    ):
        typer.echo(f"  {key:<32} {report[key]}")
    for stage, states in report["stages"].items():
        counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "empty"
        typer.echo(f"  stage {stage:<26} {counts}")
    for reason in report["deferredReasons"]:
        typer.echo(f"  deferred: {reason}")


# --- the pipeline's workers and dead letters ------------------------------------------------------
class Stage(StrEnum):
    fetch = "fetch"
    enrich = "enrich"
    review = "review"
    write = "write"
    all = "all"


@news_app.command("worker")
def news_worker(
    stage: Annotated[
        Stage, typer.Option("--stage", help="Which stage's queue to consume (all: every one).")
    ] = Stage.all,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, max=1000, help="Messages handled at once, per stage."),
    ] = 4,
) -> None:
    """Consume the news pipeline's stage queues (NEWS_PIPELINE=rabbitmq) until SIGTERM."""
    import signal

    from nightcrew.news.worker import Worker

    settings = _settings()
    if settings.news_pipeline != "rabbitmq":
        _fail("news worker needs NEWS_PIPELINE=rabbitmq (and QUEUE_URL=amqp://…)", 2)
    clock = SystemClock()
    stages = ["fetch", "enrich", "review", "write"] if stage is Stage.all else [stage.value]

    async def work() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with open_runtime(settings, clock) as runtime:
            summary = await Worker(runtime, clock, stages, concurrency).run(stop)
            return summary.to_json()

    _run(work, settings)


def _stage_option(value: Stage | None) -> str | None:
    if value is Stage.all:
        return None
    return value.value if value is not None else None


@dlq_app.command("list")
def news_dlq_list(
    stage: Annotated[Stage | None, typer.Option("--stage", help="Only this stage.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the letters as JSON.")] = False,
) -> None:
    """List the dead letters: id, stage, deliveries and the last error."""
    from nightcrew.news.dlq import list_dead

    settings = _settings()
    clock = SystemClock()

    async def work() -> list[dict[str, Any]]:
        async with open_runtime(settings, clock) as runtime:
            return [_letter_json(x) for x in await list_dead(runtime, _stage_option(stage))]

    letters = _run(work, settings)
    if as_json:
        typer.echo(json.dumps(letters, indent=2))
        return
    for letter in letters:
        what = letter["body"].get("url") or f"source {letter['body'].get('source_id')}"
        typer.echo(
            f"{letter['id']}  {letter['stage']:<7} x{letter['deliveries']}  {what}\n"
            f"    {letter['error']}"
        )
    if not letters:
        typer.echo("no dead letters")


@dlq_app.command("replay")
def news_dlq_replay(
    stage: Annotated[Stage | None, typer.Option("--stage", help="Only this stage.")] = None,
    message_id: Annotated[str | None, typer.Option("--id", help="The letter to replay.")] = None,
    everything: Annotated[bool, typer.Option("--all", help="Replay every letter.")] = False,
) -> None:
    """Queue dead letters again (after fixing their cause): --id ID or --all."""
    from nightcrew.news.dlq import replay

    if (message_id is None) == (not everything):
        _fail("news dlq replay: give exactly one of --id ID or --all", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> int:
        async with open_runtime(settings, clock) as runtime:
            replayed = await replay(
                runtime, clock, stage=_stage_option(stage), message_id=message_id
            )
            return len(replayed)

    count = _run(work, settings)
    if message_id is not None and count == 0:
        _fail(f"no dead letter with id {message_id}", 1)
    typer.echo(f"replayed {count} dead letter{'s' if count != 1 else ''}")


@dlq_app.command("purge")
def news_dlq_purge(
    stage: Annotated[Stage, typer.Option("--stage", help="The stage whose letters go.")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Really: their candidates are rejected.")
    ] = False,
) -> None:
    """Drop a stage's dead letters for good (their candidates are rejected with the error)."""
    from nightcrew.news.dlq import purge

    if stage is Stage.all:
        _fail("news dlq purge: name one --stage", 2)
    if not yes:
        _fail("news dlq purge drops the letters for good: add --yes", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> int:
        async with open_runtime(settings, clock) as runtime:
            return len(await purge(runtime, clock, stage.value))

    count = _run(work, settings)
    typer.echo(f"purged {count} dead letter{'s' if count != 1 else ''} of {stage.value}")


def _letter_json(letter: Any) -> dict[str, Any]:
    return {
        "id": letter.message_id,
        "stage": letter.stage,
        "deliveries": letter.deliveries,
        "reason": letter.reason,
        "error": letter.error,
        "body": letter.body,
    }
