"""The command line. Thin: parse, build a Runtime, call a lane, print its report.

Exit codes: 0 when a run completed (items that failed are in its report), 1 when a check found
problems or a run failed outright, 2 when nothing could start (bad flag, bad configuration,
database unreachable) — always with one line on stderr that names the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import uvicorn

from nightcrew import __version__
from nightcrew.clock import Clock, FrozenClock, SystemClock, parse_instant
from nightcrew.config import Settings, load_settings, reveal
from nightcrew.db.contract import check_schema
from nightcrew.db.migrate import migrate
from nightcrew.errors import (
    ConfigError,
    DatabaseUnavailableError,
    NightcrewError,
    QueueUnavailableError,
)
from nightcrew.log import SecretScrubber, configure_logging, describe_error, event
from nightcrew.runtime import open_database, open_runtime

T = TypeVar("T")

app = typer.Typer(
    name="nightcrew",
    help="The background crew: lifecycle lanes and self-healing watchdogs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Apply or verify the database schema.", no_args_is_help=True)
lifecycle_app = typer.Typer(help="The podcast platform's lifecycle lanes.", no_args_is_help=True)
news_app = typer.Typer(help="The news platform's RSS ingestion worker.", no_args_is_help=True)
sources_app = typer.Typer(help="Feed sources: add, list, disable, enable.", no_args_is_help=True)
news_app.add_typer(sources_app, name="sources")
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


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"nightcrew: {message}", err=True)
    raise typer.Exit(code)


def _settings() -> Settings:
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
    except NightcrewError as exc:
        _fail(scrub.text(str(exc)), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # last resort: still one line, never a traceback
        _fail(scrub.text(f"unexpected error: {describe_error(exc)}"), 1)


async def _call(work: Callable[[], Awaitable[T]]) -> T:
    return await work()


def _print_json(payload: dict[str, Any]) -> None:
    typer.echo(json.dumps(payload, indent=2, default=str))


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


# --- db ------------------------------------------------------------------------------------------
@db_app.command("migrate")
def db_migrate(
    skip_reference: Annotated[
        bool,
        typer.Option(
            "--skip-reference",
            help="Apply only nightcrew's own tables (a production platform database).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Apply the numbered migrations that have not been applied yet."""
    settings = _settings()

    async def work() -> dict[str, list[str]]:
        async with open_database(settings) as db:
            return (await migrate(db, skip_reference=skip_reference)).to_json()

    result = _run(work, settings)
    if as_json:
        _print_json(result)
        return
    for label in result["applied"]:
        typer.echo(f"applied  {label}")
    for label in result["skipped"]:
        typer.echo(f"skipped  {label} (reference schema)")
    if not result["applied"]:
        typer.echo(f"up to date ({len(result['already_applied'])} migrations already applied)")


@db_app.command("check")
def db_check(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Report, table by table, what the database lacks that nightcrew needs. Exit 1 if any."""
    settings = _settings()

    async def work() -> dict[str, Any]:
        async with open_database(settings) as db:
            return (await check_schema(db)).to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
    else:
        for table, result in report["tables"].items():
            typer.echo(f"{'ok     ' if result['ok'] else 'MISSING'} {table}")
            for problem in result["problems"]:
                typer.echo(f"          - {problem}")
            for advice in result["advice"]:
                typer.echo(f"          ~ {advice}")
        for problem in report["problems"]:
            typer.echo(f"MISSING {problem}")
        typer.echo("schema ok" if report["ok"] else "schema incomplete")
    if not report["ok"]:
        raise typer.Exit(1)


# --- effects -------------------------------------------------------------------------------------
KindOption = Annotated[EffectKind | None, typer.Option("--kind", help="Only effects of this kind.")]


@effects_app.command("list")
def effects_list(
    kind: KindOption = None,
    dead: Annotated[bool, typer.Option("--dead", help="Only dead effects (given up).")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """Effects not yet delivered: pending (being retried) and dead, oldest first."""
    from nightcrew.effects import outbox

    settings = _settings()

    async def work() -> list[dict[str, Any]]:
        async with open_database(settings) as db:
            found = await outbox.list_undelivered(
                db, kind=kind.value if kind else None, dead=True if dead else None, limit=limit
            )
            return [e.to_json() for e in found]

    found = _run(work, settings)
    if as_json:
        typer.echo(json.dumps(found, indent=2, default=str))
        return
    if not found:
        typer.echo("no dead effects" if dead else "nothing owed: every effect is delivered")
        return
    for e in found:
        state = f"dead since {e['dead_at']}" if e["dead_at"] else "pending"
        typer.echo(
            f"{e['id']:>8}  {e['kind']:<15} {state:<40} attempts={e['attempts']}  {e['key']}"
        )
        if e["last_error"]:
            typer.echo(f"          last error: {e['last_error']}")
    if any(e["dead_at"] for e in found):
        typer.echo("re-drive with: nightcrew effects retry ID  (or --dead [--kind K])")


@effects_app.command("retry")
def effects_retry(
    effect_id: Annotated[int | None, typer.Argument(help="The effect to re-drive.")] = None,
    dead: Annotated[bool, typer.Option("--dead", help="Re-drive every dead effect.")] = False,
    kind: KindOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Make undelivered effects due now with a fresh maximum age, and attempt them at once.

    A retry more than 24 hours after the first attempt is outside the providers' idempotency
    window: an email that did arrive (but was never confirmed) may arrive twice.
    """
    from nightcrew.effects import outbox
    from nightcrew.effects.deliver import deliver_now

    if (effect_id is None) == (not dead):
        _fail("effects retry: give an effect ID or --dead (not both)", 2)
    if kind is not None and not dead:
        _fail("effects retry: --kind goes with --dead", 2)
    settings = _settings()
    clock = SystemClock()

    async def work() -> list[dict[str, Any]]:
        async with open_runtime(settings, clock) as runtime:
            rows = await outbox.retry(
                runtime.db,
                clock.now(),
                ids=[effect_id] if effect_id is not None else [],
                all_dead=dead,
                kind=kind.value if kind else None,
            )
            effects = [e for r in rows if (e := await outbox.get(runtime.db, int(r["id"])))]
            deliveries = await deliver_now(runtime, clock, effects)
            for effect, delivery in zip(effects, deliveries, strict=True):
                event(
                    "effect_retried",
                    effect_id=effect.id,
                    kind=effect.kind,
                    key=effect.key,
                    outcome=delivery.status,
                    error=delivery.error,
                )
            return [
                {"id": e.id, "kind": e.kind, "key": e.key, "outcome": d.status, "error": d.error}
                for e, d in zip(effects, deliveries, strict=True)
            ]

    outcomes = _run(work, settings)
    if effect_id is not None and not outcomes:
        _fail(
            f"effects retry: no undelivered effect {effect_id} at rest "
            "(delivered, being delivered right now, or no such effect)",
            1,
        )
    if as_json:
        typer.echo(json.dumps(outcomes, indent=2))
        return
    for o in outcomes:
        detail = "delivered" if o["outcome"] == "delivered" else f"{o['outcome']}: {o['error']}"
        typer.echo(f"{o['id']:>8}  {o['kind']:<15} {detail}")
    if not outcomes:
        typer.echo("no dead effects to retry")


@effects_app.command("drop")
def effects_drop(
    effect_id: Annotated[int, typer.Argument(help="The undelivered effect to forget.")],
) -> None:
    """Forget an undelivered effect for good: it will never be delivered."""
    from nightcrew.effects import outbox

    settings = _settings()

    async def work() -> dict[str, Any] | None:
        async with open_database(settings) as db:
            dropped = await outbox.drop(db, effect_id, SystemClock().now())
        if dropped is not None:  # the row is gone: the log keeps what it was
            event(
                "effect_dropped",
                **{k: v for k, v in dropped.items() if k != "id"},
                effect_id=effect_id,
            )
        return dropped

    dropped = _run(work, settings)
    if dropped is None:
        _fail(f"effects drop: no undelivered effect {effect_id}", 1)
    typer.echo(f"dropped effect {effect_id} ({dropped['kind']} {dropped['key']})")


# Every command that decides by time takes --now the same way.
NowOption = Annotated[
    str | None,
    typer.Option(
        "--now",
        help="Run as of this ISO 8601 instant (with offset), e.g. 2026-11-29T04:00:00Z.",
    ),
]


# --- lifecycle -----------------------------------------------------------------------------------
@lifecycle_app.command("run")
def lifecycle_run(
    lane: Annotated[Lane, typer.Argument(help="Which lane to run once.")],
    now: NowOption = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Report what the run would do; change nothing."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run one lane once and print its report."""
    from nightcrew.lifecycle.lanes import run_lane

    settings = _settings()
    clock = _clock(now)

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime:
            report = await run_lane(runtime, clock, lane.value, dry_run=dry_run)
            assert report is not None  # manual runs always run
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
    else:
        _print_lane_summary(report)


def _print_lane_summary(report: dict[str, Any]) -> None:
    run = "dry run (nothing changed)" if report["dry_run"] else f"run {report['run_id']}"
    typer.echo(
        f"{report['lane']} lane as of {report['now']} — {run}, {report['duration_ms']:.0f} ms"
    )
    for name, job in report["jobs"].items():
        counts = ", ".join(
            f"{k}={v}"
            for k, v in job.items()
            if isinstance(v, int) and not isinstance(v, bool) and k != "duration_ms"
        )
        status = {"ok": "ok     ", "skipped": "skipped", "failed": "FAILED "}[job["status"]]
        detail = job.get("error") or (
            f"skipped: {job['skipped']}" if job.get("skipped") else counts
        )
        typer.echo(f"  {status} {name:<36} {job['duration_ms']:>7.1f} ms  {detail}")
    for failure in report["errors"]:
        ids = ", ".join(
            f"{k}={v}"
            for k, v in failure.items()
            if k not in ("job", "event", "error") and isinstance(v, str | int)
        )
        typer.echo(f"  ! {failure['event']}: {failure['error']}" + (f" ({ids})" if ids else ""))


@lifecycle_app.command("reconcile")
def lifecycle_reconcile(
    apply: Annotated[
        bool, typer.Option("--apply", help="Perform mutations (default: dry run).")
    ] = False,
    quarantine_missing: Annotated[
        bool,
        typer.Option(
            "--quarantine-missing", help="(apply) Null the audio of episodes whose object is gone."
        ),
    ] = False,
    skip_orphan_delete: Annotated[
        bool, typer.Option("--skip-orphan-delete", help="Report orphans only, even with --apply.")
    ] = False,
    bypass_cap_for_backfill: Annotated[
        bool,
        typer.Option(
            "--bypass-cap-for-backfill",
            help="(apply) Disable only the storage-cap trigger for the backfill.",
        ),
    ] = False,
    min_orphan_age_hours: Annotated[
        int,
        typer.Option(
            "--min-orphan-age-hours", help="Minimum orphan age in hours (clamped to 24-720)."
        ),
    ] = 24,
    now: NowOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Reconcile stored audio with the episodes table: dry run first, read, then --apply."""
    from nightcrew.lifecycle.reconcile.core import ReconcileOptions
    from nightcrew.lifecycle.reconcile.engine import run_reconcile

    settings = _settings()
    clock = _clock(now)
    options = ReconcileOptions(
        mode="apply" if apply else "dryrun",
        quarantine_missing=quarantine_missing,
        skip_orphan_delete=skip_orphan_delete,
        bypass_cap_for_backfill=bypass_cap_for_backfill,
        min_orphan_age_hours=min_orphan_age_hours,
    )

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime:
            if as_json or not sys.stderr.isatty():
                report = await run_reconcile(runtime, clock, options)
            else:
                report = await _with_progress(runtime, clock, options, run_reconcile)
            event("reconcile_completed", **report.summary().to_json())
            return report.to_json()

    report = _run(work, settings)
    if as_json:
        _print_json(report)
    else:
        _print_reconcile_summary(report)


async def _with_progress(runtime: Any, clock: Clock, options: Any, run: Any) -> Any:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
    ) as bar:
        task = bar.add_task("starting", total=None)

        def tick(phase: str, count: int) -> None:
            bar.update(task, description=f"{phase}: {count:,}")

        return await run(runtime, clock, options, progress=tick)


def _print_reconcile_summary(report: dict[str, Any]) -> None:
    mode = "APPLY" if report["mode"] == "apply" else "dry run (nothing changed)"
    listing, size, missing = report["listing"], report["sizeBackfill"], report["missing"]
    typer.echo(f"storage reconcile — {mode}, as of {report['now']}, {report['durationMs']:.0f} ms")
    typer.echo(
        f"  listing        {listing.get('objects', 0):,} objects, "
        f"{listing.get('bytes', 0):,} bytes, {listing.get('listRequests', 0)} list requests"
    )
    typer.echo(
        f"  size backfill  {size.get('mismatched', 0):,} wrong or missing sizes, "
        f"{size.get('written', 0):,} written, "
        f"{len(size.get('blockedOverCap', [])):,} blocked by the storage cap"
    )
    typer.echo(
        f"  missing        {missing.get('count', 0):,} episodes without their object, "
        f"{missing.get('quarantined', 0):,} quarantined"
    )
    if report["outbox"]:
        o = report["outbox"]
        typer.echo(f"  outbox         {o['delivered']:,} delivered, {o['failed']:,} failed")
    for key, label in (
        ("orphans", "orphan audio"),
        ("episodeImages", "episode images"),
        ("transcribePrep", "expired prep"),
    ):
        s = report[key]
        typer.echo(
            f"  {label:<14} {s['count']:,} found ({s['bytes']:,} bytes), "
            f"{s['tooYoung']:,} too young, {s['eligible']:,} eligible, "
            f"{s['deleted']:,} deleted"
        )
        for sample in s["sample"][:5]:
            typer.echo(f"                   {sample['key']}")
    typer.echo(f"  media jobs     {report['mediaJobs'].get('flagged', 0)} wedged")
    typer.echo(f"  over cap       {len(report['overCap'])} billing accounts (report only)")
    for failure in report["errors"]:
        typer.echo(f"  ! {failure.get('event')}: {failure.get('error')}")
    if report["mode"] != "apply":
        typer.echo("  (--json shows up to 20 sample keys per category; --apply to act)")


@lifecycle_app.command("overage")
def lifecycle_overage(
    account: Annotated[str, typer.Option("--account", help="The billing account's id.")],
    now: NowOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would happen; change nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the overage escalation for one account (what the payment webhook calls)."""
    import uuid

    from nightcrew.lifecycle.overage import reconcile_account_overage

    try:
        account_id = str(uuid.UUID(account))
    except ValueError:
        _fail(f"--account: {account!r} is not a billing account id (a UUID)", 2)
    settings = _settings()
    clock = _clock(now)

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime:
            view = runtime.dry_run_view(clock) if dry_run else runtime
            report = await reconcile_account_overage(view, clock, account_id)
            if report.scanned == 0:
                raise NightcrewError(f"no billing account {account_id}")
            return {"account_id": account_id, "dry_run": dry_run, **report.to_json()}

    report = _run(work, settings)
    if as_json:
        _print_json(report)
        return
    mode = "dry run (nothing changed)" if dry_run else "done"
    typer.echo(f"overage escalation for {account_id} — {mode}")
    for key in ("armed", "emails_sent", "suspended_podcasts", "restored_podcasts"):
        typer.echo(f"  {key:<20} {report[key]}")
    for claim in report["claims"]:
        typer.echo(f"  claimed stage {claim['stage']}")
    for failure in report["errors"]:
        typer.echo(f"  ! {failure.get('event')}: {failure.get('error')}")


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
    from nightcrew.news.run import open_news_deps, run_shard

    settings = _settings()
    clock = _clock(now)

    async def work() -> dict[str, Any]:
        async with open_runtime(settings, clock) as runtime, open_news_deps(runtime, clock) as deps:
            report = await run_shard(
                runtime, clock, deps, shard, trigger="manual" if manual else "scheduled"
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


# --- demo ----------------------------------------------------------------------------------------
@app.command("demo")
def demo() -> None:
    """Build a small sample podcast platform (embedded PostgreSQL, local files), run both lanes
    on it and show what changed and why. Never touches DATABASE_URL or STORAGE_URL."""
    from nightcrew.demo import run_demo

    settings = _settings()
    # The story is told on stdout; only warnings and failures are worth interleaving with it.
    configure_logging(
        "warning" if settings.log_level in ("debug", "info") else settings.log_level,
        settings.secret_values(),
    )
    if settings.database_url or settings.storage_url:
        typer.echo(
            "note: the demo ignores DATABASE_URL and STORAGE_URL; it uses its own "
            "embedded database and local files.",
            err=True,
        )
    lines = _run(lambda: run_demo(settings, FrozenClock(SystemClock().now())), settings)
    typer.echo("\n".join(lines))


# --- serve ---------------------------------------------------------------------------------------
@app.command("serve")
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8787,
) -> None:
    """Serve /health and run every lane on its schedule until stopped (Ctrl-C / SIGTERM)."""
    settings = _settings()
    _run(lambda: _serve(settings, host, port), settings)


async def _serve(settings: Settings, host: str, port: int) -> None:
    from nightcrew.http import Readiness, create_app
    from nightcrew.lifecycle.lanes import lifecycle_schedules
    from nightcrew.lifecycle.reconcile.core import ReconcileOptions
    from nightcrew.lifecycle.reconcile.engine import run_reconcile
    from nightcrew.log import warning
    from nightcrew.news.run import latest_reports, news_schedules, open_news_deps
    from nightcrew.scheduler import Scheduler

    # Bind first: a port in use is one line and exit 2, before anything starts ticking.
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    clock = SystemClock()
    async with contextlib.AsyncExitStack() as stack:
        runtime = await stack.enter_async_context(open_runtime(settings, clock))
        secret = settings.reconciler_secret
        schedules = lifecycle_schedules(runtime, clock)
        if settings.news_shard_list:
            deps = await stack.enter_async_context(open_news_deps(runtime, clock))
            schedules = (*schedules, *news_schedules(runtime, clock, deps))

        async def reconcile(options: ReconcileOptions) -> dict[str, Any]:
            return (await run_reconcile(runtime, clock, options)).to_json()

        async def reports() -> list[dict[str, Any]]:
            return await latest_reports(runtime.db)

        async def ping_database() -> None:
            await runtime.db.fetch_one("SELECT 1")

        server = _QuietServer(
            uvicorn.Config(
                create_app(
                    runtime.metrics,
                    reconcile=reconcile,
                    reconciler_secret=reveal(secret),
                    news_reports=reports,
                    readiness=Readiness(
                        ping_database=ping_database,
                        started_at=clock.now().timestamp(),
                        now=lambda: clock.now().timestamp(),
                    ),
                ),
                host=host,
                port=port,
                log_level="warning",
                log_config=None,  # uvicorn's loggers go through nightcrew's JSON pipeline
                access_log=False,
                lifespan="off",
            )
        )
        # SIGTERM / SIGINT ask for a graceful stop: the HTTP server drains, the scheduler
        # lets in-flight runs finish, the pool closes, the process exits 0.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit)
        scheduler = asyncio.create_task(Scheduler(runtime, clock, schedules).run())
        event("serve_started", host=host, port=port, database=runtime.db.target)
        if secret is None:
            warning(
                "reconcile_endpoint_disabled",
                reason="RECONCILER_SECRET is unset: POST /reconcile answers 401 to everyone",
            )
        try:
            await server.serve(sockets=[listener])
        finally:
            scheduler.cancel()
            await asyncio.gather(scheduler, return_exceptions=True)
            event("serve_stopped")


class _QuietServer(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after shutdown (killing us with -15); we own the
    signals instead and exit normally."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `nightcrew … | head` is not an error
        sys.stderr.close()
