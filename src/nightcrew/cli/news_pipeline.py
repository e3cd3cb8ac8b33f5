"""`nightcrew news worker` and `nightcrew news dlq`: the pipeline's stage workers and its dead
letters."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from nightcrew.cli.common import (
    _fail,
    _run,
    _settings,
    dlq_app,
    news_app,
    open_runtime,
)
from nightcrew.clock import SystemClock

if TYPE_CHECKING:
    from nightcrew.adapters.broker import DeadLetter
    from nightcrew.jsonable import JsonObject


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

    from nightcrew.news.engines.pipeline.worker import Worker

    settings = _settings()
    if settings.news_pipeline != "rabbitmq":
        _fail("news worker needs NEWS_PIPELINE=rabbitmq (and QUEUE_URL=amqp://…)", 2)
    clock = SystemClock()
    from nightcrew.setting_parsers import STAGES

    stages = list(STAGES) if stage is Stage.all else [stage.value]

    async def work() -> JsonObject:
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
    from nightcrew.news.engines.pipeline.dlq import list_dead

    settings = _settings()
    clock = SystemClock()

    async def work() -> list[DeadLetter]:
        async with open_runtime(settings, clock) as runtime:
            return await list_dead(runtime, _stage_option(stage))

    letters = _run(work, settings)
    if as_json:
        typer.echo(json.dumps([letter.to_json() for letter in letters], indent=2))
        return
    for letter in letters:
        what = letter.body.get("url") or f"source {letter.body.get('source_id')}"
        typer.echo(
            f"{letter.message_id}  {letter.stage:<7} x{letter.deliveries}  {what}\n"
            f"    {letter.error}"
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
    from nightcrew.operator_actions import CLI, replay_letters

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
    from nightcrew.operator_actions import CLI, purge_letters

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
