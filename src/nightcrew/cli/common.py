"""The command line's shared parts: the Typer apps, the exit-code discipline, ``--now``.

Exit codes: 0 when a run completed (items that failed are in its report), 1 when a check found
problems or a run failed outright, 2 when nothing could start (bad flag, bad configuration,
database unreachable) — always with one line on stderr that names the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from nightcrew import __version__
from nightcrew.clock import Clock, FrozenClock, SystemClock, parse_instant
from nightcrew.errors import (
    MIGRATE_HINT,
    SCHEMA_MISSING_SQLSTATES,
    ConfigError,
    DatabaseUnavailableError,
    NightcrewError,
    QueryError,
    QueueUnavailableError,
)
from nightcrew.gc_tuning import tune_for_bursts
from nightcrew.log import SecretScrubber, configure_logging, describe_error

if TYPE_CHECKING:  # the commands import what they use when they run: `--help` imports none
    from nightcrew.config import Settings
    from nightcrew.jsonable import JsonObject
    from nightcrew.runtime import Runtime

T = TypeVar("T")

# A label that only repeats the parameter's Python type: Typer writes one for every parameter
# (`--json <bool>`, `--shard <str>`, even `--help <bool>`).
_TYPE_ONLY = re.compile(r"<(?:str|int|float|bool)(?: range)?>")


def _help_labels_that_say_something() -> None:
    """A flag takes no value, so it gets no label; an option's value without a metavar is named
    after the option, as manuals write it (`--shard SHARD`); an argument's name is already
    beside it. Choices (`<minute|daily>`), ranges and explicit metavars stay. Typer offers no
    setting for this, so its one labelling method is wrapped (a test reads every help page)."""
    from typer.core import TyperArgument, TyperOption

    def wrap(original: Callable[..., str | None]) -> Callable[..., str | None]:
        def label(param: Any, ctx: Any) -> str | None:
            shown = original(param, ctx)
            if shown is None or not _TYPE_ONLY.fullmatch(shown):
                return shown
            if isinstance(param, TyperArgument) or getattr(param, "is_flag", False):
                return None
            return str(max(param.opts, key=len)).lstrip("-").replace("-", "_").upper()

        return label

    for kind in (TyperOption, TyperArgument):
        original = getattr(kind, "display_type_rich", None)
        if original is not None:  # older Typer: click's own labels (TEXT), never <bool>
            kind.display_type_rich = wrap(original)  # type: ignore[method-assign]


_help_labels_that_say_something()

app = typer.Typer(
    name="nightcrew",
    help=(
        "The background crew, two workers on one runtime.\n\n"
        "lifecycle: the podcast platform's lanes — the minute lane's self-healing watchdogs and "
        "the daily lane (pauses, deletions, signups, the storage reconciler, overage).\n\n"
        "news: the news platform's RSS ingestion — `news run` for one shard, `news worker` for "
        "the stage queues of the RabbitMQ pipeline.\n\n"
        "serve: the dashboard, /health and /metrics, and every lane and news shard on its "
        "schedule. New here? Try `nightcrew demo`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # help text is reflowed to the terminal (a docstring's line breaks are not the reader's)
    # and `code` is shown as code
    rich_markup_mode="markdown",
)
db_app = typer.Typer(help="Apply or verify the database schema.", no_args_is_help=True)
lifecycle_app = typer.Typer(
    help="The podcast platform's lifecycle lanes, the storage reconciler and the overage machine.",
    no_args_is_help=True,
)
news_app = typer.Typer(help="The news platform's RSS ingestion worker.", no_args_is_help=True)
sources_app = typer.Typer(
    help="Feed sources: add, list, disable, enable, import (OPML or URLs), export --opml.",
    no_args_is_help=True,
)
news_app.add_typer(sources_app, name="sources")
dlq_app = typer.Typer(
    help="The news pipeline's dead letters: list, replay, purge.", no_args_is_help=True
)
news_app.add_typer(dlq_app, name="dlq")
effects_app = typer.Typer(
    help="The effects outbox: what is owed outside the database, and its dead letters.",
    no_args_is_help=True,
)
app.add_typer(effects_app, name="effects")
app.add_typer(db_app, name="db")
app.add_typer(lifecycle_app, name="lifecycle")
app.add_typer(news_app, name="news")


class Lane(StrEnum):
    minute = "minute"
    daily = "daily"


class EffectKind(StrEnum):
    queue = "queue"
    mail = "mail"
    billing_resume = "billing_resume"
    feed_invalidate = "feed_invalidate"


def open_runtime(settings: Settings, clock: Clock, **adapters: Any) -> Any:
    """``nightcrew.assembly.open_runtime``, imported when a command runs: every adapter (the
    database driver, the store, the SDKs) is a second of imports that `--help` never needs."""
    from nightcrew.assembly import open_runtime as opened

    return opened(settings, clock, **adapters)


def open_database(settings: Settings) -> Any:
    """``nightcrew.runtime.open_database``, imported when a command runs (see open_runtime)."""
    from nightcrew.runtime import open_database as opened

    return opened(settings)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"nightcrew: {message}", err=True)
    raise typer.Exit(code)


def _settings() -> Settings:
    from nightcrew.config import load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        _fail(str(exc), 2)
    configure_logging(settings.log_level, settings.secret_values())
    return settings


def _clock(now: str | None) -> Clock:
    if now is None:
        return SystemClock()
    try:
        return FrozenClock(parse_instant(now))
    except ValueError as exc:
        _fail(f"--now: {exc}", 2)


def _run(work: Callable[[], Awaitable[T]], settings: Settings) -> T:
    """Run a coroutine, turning every failure into one scrubbed line and an exit code."""
    scrub = SecretScrubber(settings.secret_values())
    try:
        return asyncio.run(_call(work))
    except (DatabaseUnavailableError, QueueUnavailableError, ConfigError) as exc:
        _fail(scrub.text(str(exc)), 2)
    except QueryError as exc:
        if exc.sqlstate in SCHEMA_MISSING_SQLSTATES:
            _fail(scrub.text(f"{exc} — {MIGRATE_HINT}"), 2)
        _fail(scrub.text(str(exc)), 1)
    except NightcrewError as exc:
        _fail(scrub.text(str(exc)), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except asyncio.CancelledError:  # SIGTERM (``_call``)
        _fail("terminated (SIGTERM): the work in hand was cancelled", 143)
    except Exception as exc:  # last resort: still one line, never a traceback
        _fail(scrub.text(f"unexpected error: {describe_error(exc)}"), 1)


def _run_and_print(
    job: Callable[[Runtime, Clock], Awaitable[JsonObject]],
    *,
    now: str | None,
    as_json: bool,
    summary: Callable[[JsonObject], None],
    cannot_start: Callable[[BaseException], None] | None = None,
) -> None:
    """Run ``job`` on the runtime (one failure: one line and an exit code), then print its
    report: as JSON, or ``summary`` for a person. ``cannot_start`` is told when the runtime
    itself cannot open (the database unreachable), before the one line."""
    settings = _settings()
    clock = _clock(now)

    async def work() -> JsonObject:
        opened = False
        try:
            async with open_runtime(settings, clock) as runtime:
                opened = True
                return await job(runtime, clock)
        except Exception as exc:
            if not opened and cannot_start is not None:
                cannot_start(exc)
            raise

    report = _run(work, settings)
    if as_json:
        _print_json(report)
    else:
        summary(report)


async def _call(work: Callable[[], Awaitable[T]]) -> T:
    """``work`` as the main task, which SIGTERM cancels as Ctrl-C does: what is in hand is
    cancelled cleanly — a news run's model calls, its review locks released — not killed."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _json_default(value: object) -> str:
    # str() of a datetime has a space where ISO 8601 has its "T": not every reader parses it
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _print_json(payload: JsonObject | list[Any]) -> None:
    typer.echo(json.dumps(payload, indent=2, default=_json_default))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nightcrew {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """nightcrew: the work that runs at 04:00 while everyone sleeps."""


# Every command that decides by time takes --now the same way.
NowOption = Annotated[
    str | None,
    typer.Option(
        "--now",
        metavar="ISO",
        help="Run as of this ISO 8601 instant (with offset), e.g. 2026-11-29T04:00:00Z.",
    ),
]


def main() -> None:
    # a death by signal in native code (SIGSEGV, SIGABRT, …) leaves every thread's Python stack
    # on stderr, where the operator's logs are: without it a worker just vanishes with -6
    with contextlib.suppress(RuntimeError, ValueError, OSError):  # no stderr to write to
        faulthandler.enable()
    tune_for_bursts()  # the commands' imports are done: the collector need not walk them
    try:
        app()
    except BrokenPipeError:  # `nightcrew … | head` is not an error
        sys.stderr.close()
