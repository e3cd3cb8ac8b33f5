"""`nightcrew news`: the news run and its feed sources."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

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

if TYPE_CHECKING:
    from nightcrew.news.sources import ImportReport


# --- news ----------------------------------------------------------------------------------------
@news_app.command("run")
def news_run(
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            help="Which shard to run (default: the one NEWS_SHARDS names, else 'default').",
        ),
    ] = None,
    manual: Annotated[
        bool,
        typer.Option(
            "--manual",
            help="A manual run, recorded in the run history as lane news:SHARD (refused while"
            " a run of it is running; a held lock is answered with a skipped report).",
        ),
    ] = False,
    now: NowOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run one shard of the news worker once and print its report.

    With NEWS_PIPELINE=rabbitmq this is a pass: the shard's due sources go to the fetch queue,
    held candidates are released into stages with room, and the stage workers do the rest.
    A run fenced out by a newer holder of the shard's lease ends as superseded (exit 0)."""
    from nightcrew.actions import CLI, run_lane_now
    from nightcrew.news.schedule import run_or_enqueue, shard_lane

    settings = _settings()
    clock = _clock(now)
    if shard is None:
        shard = _default_shard(settings.news_shard_list)

    async def work() -> dict[str, Any]:
        assert shard is not None  # chosen above; mypy cannot see into the closure
        async with open_runtime(settings, clock) as runtime:
            if manual:  # the dashboard's "run now": in the run history, one at a time
                return await run_lane_now(runtime, clock, CLI, shard_lane(shard))
            report = await run_or_enqueue(runtime, clock, shard, trigger="scheduled")
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
        return
    _print_report(report)


def _default_shard(configured: list[str]) -> str:
    """The shard a `news run` without --shard runs, said on stderr (never a silent guess); with
    several in NEWS_SHARDS there is no right guess, and the command asks."""
    if len(configured) > 1:
        _fail(f"news run: give --shard (NEWS_SHARDS names {', '.join(configured)})", 2)
    shard = configured[0] if configured else "default"
    source = "the one NEWS_SHARDS names" if configured else "NEWS_SHARDS is not set"
    typer.echo(
        f"nightcrew: news run: no --shard given: running shard {shard!r} ({source})", err=True
    )
    return shard


def _print_report(report: dict[str, Any]) -> None:
    """Either engine's report in words: an inline run's, or a pipeline pass's with its own
    figures after spec 001's (--json keeps the spec's field names)."""
    pipeline = report.get("pipeline") == "rabbitmq"
    status = report.get("status") or ("skipped" if report.get("skipped") else "completed")
    if status == "skipped":
        state = "skipped (locked)"
    elif status == "superseded":
        state = "superseded (a newer holder of the shard's lease wrote first)"
    else:
        state = "deferred" if report["deferredReasons"] else "done"
    what = "pass " if pipeline else ""
    typer.echo(f"news shard {report['shard']}: {what}{state}, {report['durationMs']:.0f} ms")
    # aiReviewedCount counts every verdict, the offline rules' too: the label says whose
    reviewer = report.get("reviewer") or "model"
    rows: list[tuple[str, object]] = []
    if pipeline:
        since = report.get("resultsSince")
        rows.append(("workers' results", f"since {since}" if since else "since the start"))
    rows += [
        ("queued", report["queuedCount"]),
        ("processed (written)", report["processedCount"]),
        (f"reviewed ({reviewer})", report["aiReviewedCount"]),
        ("accepted", report["acceptedCount"]),
        ("rejected", report["rejectedCount"]),
        ("translated", report.get("translatedCount", 0)),
        ("deferred", report["deferredCount"]),
        ("retried (no thumbnail)", report["retriedCount"]),
        ("locked", report["lockedCount"]),
        ("review locks held elsewhere", report["redisAiReviewLockSkippedCount"]),
        ("Redis", "yes" if report["redisEnabled"] else "no (PostgreSQL leases)"),
    ]
    if pipeline:
        rows += [
            ("sources enqueued", report["enqueuedSources"]),
            ("released into stages", report["releasedCount"]),
            ("sent again (presumed lost)", report["resentCount"]),
            ("relayed from the outbox", report["relayedCount"]),
            ("waiting for a review retry", report.get("reviewRetryCount", 0)),
        ]
        for stage, states in report["stages"].items():
            counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "empty"
            rows.append((f"stage {stage}", counts))
    for label, value in rows:
        typer.echo(f"  {label:<32} {value}")
    if report.get("backpressureDbArticleCountError"):
        typer.echo(f"  ! article count failed: {report['backpressureDbArticleCountError']}")
    for reason in report["deferredReasons"]:
        typer.echo(f"  deferred: {reason}")
    for failure in report["fetchErrors"]:
        typer.echo(f"  ! {failure['source']}: {failure['error']}")
    for failure in report.get("writeErrors", []):
        typer.echo(f"  ! {failure['url']}: {failure['error']}")
    for dropped in report.get("droppedItems", []):
        typer.echo(f"  - {dropped['source']}: {dropped['count']} dropped ({dropped['reason']})")


@sources_app.command("add")
def news_sources_add(
    url: Annotated[str, typer.Argument(help="The feed's http(s) URL.")],
    name: Annotated[str, typer.Option("--name", help="A name for reports.")],
    shard: Annotated[str, typer.Option("--shard", help="Which shard fetches it.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print the source as JSON.")] = False,
) -> None:
    """Add a feed source."""
    from nightcrew.news.sources import SourceError, add_source, validate_feed_url

    # a URL that can never be fetched is a bad argument (exit 2), refused before any database
    try:
        validate_feed_url(url)
    except SourceError as exc:
        _fail(str(exc), 2)
    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return await add_source(db, url=url, name=name, shard=shard, now=SystemClock().now())

    row = _run(work, settings)
    if as_json:
        _print_json(row)
    else:
        typer.echo(f"added source {row['id']} ({row['name']}) on shard {row['shard']}")
    _warn_refused([row["feed_url"]], settings.news_allowed_private_hosts)


def _warn_refused(urls: list[str], allowed_private_hosts: str) -> None:
    """On stderr (a --json answer stays one document): a source added for a host the runs
    will refuse, with the setting that allows it."""
    from nightcrew.news.sources import refusal_hint

    for hint in refusal_hint(urls, allowed_private_hosts):
        typer.echo(f"note: {hint}", err=True)


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
        _print_json(rows)
        return
    if not rows:
        typer.echo("no sources yet: nightcrew news sources add URL --name NAME")
        return
    table = [("ID", "SHARD", "STATE", "FAILURES", "NAME", "FEED URL")] + [
        (
            str(row["id"]),
            row["shard"],
            "parked" if row["parked_at"] else "enabled" if row["enabled"] else "disabled",
            str(row["consecutive_failures"] or 0),
            row["name"],
            row["feed_url"],
        )
        for row in rows
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
    from nightcrew.actions import CLI, set_source_enabled

    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return await set_source_enabled(db, SystemClock(), CLI, ref, enabled=enabled)

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
    from nightcrew.news.opml import FeedListError, parse_feed_list
    from nightcrew.news.sources import import_sources

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
    from nightcrew.news.opml import MAX_FILE_BYTES

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
) -> None:
    """Write the feed sources to stdout as OPML (disabled and parked ones too): any feed reader,
    and `news sources import`, reads it back."""
    from nightcrew.news.opml import OpmlFeed, build_opml
    from nightcrew.news.sources import list_sources

    # --opml is required so that a second format later cannot change what a script gets
    if not opml:
        _fail("news sources export: give --opml (the one format so far)", 2)
    settings = _settings()

    async def work() -> list[dict[str, Any]]:
        async with open_database(settings) as db:
            return await list_sources(db, shard=shard)

    rows = _run(work, settings)
    document = build_opml(
        (OpmlFeed(name=row["name"], feed_url=row["feed_url"]) for row in rows),
        title="nightcrew news sources" + (f" (shard {shard})" if shard else ""),
        created=SystemClock().now(),
    )
    typer.echo(document, nl=False)


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
        typer.Option(
            "--concurrency",
            min=1,
            max=1000,
            metavar="N",
            help="Messages handled at once, per stage (NEWS_STAGE_PREFETCH overrides a stage).",
        ),
    ] = 4,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            max=3600,
            metavar="SECONDS",
            help="On SIGTERM: how long the messages in hand may take to finish before they are"
            " handed back to their queue. Default: long enough for a review in hand to end"
            " (the model's timeout, for the verdict and the translation: 140 s).",
        ),
    ] = None,
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
            worker = Worker(runtime, clock, stages, concurrency)
            summary = await (worker.run(stop) if grace is None else worker.run(stop, grace=grace))
            return summary.to_json()

    _run(work, settings)
    # Stopped cleanly: every connection, pool and parser worker is closed and the last line
    # (news.worker_stopped) written. Leave without the interpreter's teardown, where a native
    # module aborted about one exit in a few dozen under load (-6, "Fatal Python error:
    # Aborted", no Python frame; psycopg's libpq, greenlet via structlog and selectolax were
    # loaded): a supervisor must read a clean stop as 0, never as a crash.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    from nightcrew.actions import CLI, replay_letters

    if (message_id is None) == (not everything):
        _fail("news dlq replay: give exactly one of --id ID or --all", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> tuple[int, int, int]:
        async with open_runtime(settings, clock) as runtime:
            done = await replay_letters(
                runtime, clock, CLI, stage=_stage_option(stage), message_id=message_id
            )
            return len(done.replayed), len(done.dropped), len(done.kept)

    count, dropped, kept = _run(work, settings)
    if message_id is not None and count + dropped + kept == 0:
        _fail(f"no dead letter with id {message_id}", 1)
    typer.echo(f"replayed {count} dead letter{'s' if count != 1 else ''}")
    if dropped:  # counted apart: nothing of theirs went back to work
        typer.echo(
            f"dropped {dropped} dead letter{'s' if dropped != 1 else ''} whose candidate no"
            " longer waits (written or rejected meanwhile)"
        )
    if kept:
        typer.echo(
            f"kept {kept} dead letter{'s' if kept != 1 else ''} naming nothing to replay"
            " (unreadable): `news dlq purge` removes them"
        )


@dlq_app.command("purge")
def news_dlq_purge(
    stage: Annotated[Stage, typer.Option("--stage", help="The stage whose letters go.")],
    message_id: Annotated[
        str | None, typer.Option("--id", help="Only this letter (default: every one).")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Really: their candidates are rejected.")
    ] = False,
) -> None:
    """Drop a stage's dead letters (or one, --id) for good (their candidates are rejected with
    the error)."""
    from nightcrew.actions import CLI, purge_letters

    if stage is Stage.all:
        _fail("news dlq purge: name one --stage", 2)
    if not yes:
        _fail("news dlq purge drops the letters for good: add --yes", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> int:
        async with open_runtime(settings, clock) as runtime:
            done = await purge_letters(
                runtime, clock, CLI, stage=stage.value, message_id=message_id
            )
            return len(done.purged)

    count = _run(work, settings)
    if message_id is not None and count == 0:
        _fail(f"no dead letter with id {message_id} in {stage.value}", 1)
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
