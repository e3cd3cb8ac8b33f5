"""`nightcrew demo` and `nightcrew serve`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nightcrew.cli.common import (
    _run,
    _settings,
    app,
    open_runtime,
)
from nightcrew.clock import FrozenClock, SystemClock
from nightcrew.errors import (
    ConfigError,
)
from nightcrew.log import configure_logging, event
from nightcrew.web.access import Access, check_secret
from nightcrew.web.proxies import uvicorn_proxy_options

if TYPE_CHECKING:
    from datetime import datetime

    from starlette.applications import Starlette

    from nightcrew.clock import Clock
    from nightcrew.config import Settings
    from nightcrew.lifecycle.reconcile.core import ReconcileOptions
    from nightcrew.runtime import Runtime
    from nightcrew.scheduler import Schedule
    from nightcrew.web.context import DashboardContext

# a stop waits this long for connections to finish, not for ever
GRACEFUL_SHUTDOWN_SECONDS = 15


# --- demo ----------------------------------------------------------------------------------------
@app.command("demo")
def demo(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Show the run's JSON events on stderr as they happen, instead of writing them "
            "to the demo's events file.",
        ),
    ] = False,
) -> None:
    """Build a small sample podcast platform (embedded PostgreSQL, local files), run both lanes
    on it and show what changed and why. Never touches DATABASE_URL or STORAGE_URL."""
    from nightcrew.demo import run_demo

    settings = _settings()
    if settings.database_url or settings.storage_url:
        typer.echo(
            "note: the demo ignores DATABASE_URL and STORAGE_URL; it uses its own "
            "embedded database and local files.",
            err=True,
        )
    clock = FrozenClock(SystemClock().now())
    if verbose:  # _settings() has sent the events to stderr
        lines = _run(lambda: run_demo(settings, clock), settings)
    else:
        # The story on stdout reads best alone: the warnings a sample run is bound to log (the
        # effects given up because Stripe is not configured here) go to a file it names.
        path = (settings.data_dir / "demo" / "events.jsonl").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        where = f"in {path} (--verbose shows them on stderr)"
        with path.open("w", encoding="utf-8") as events:
            configure_logging(settings.log_level, settings.secret_values(), stream=events)
            lines = _run(lambda: run_demo(settings, clock, events=where), settings)
    typer.echo("\n".join(lines))


# --- serve ---------------------------------------------------------------------------------------
@app.command("serve")
def serve(
    host: Annotated[
        str, typer.Option("--host", metavar="ADDRESS", help="Interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8787,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Show the last `nightcrew demo`'s night on the dashboard (its embedded "
            "database); only its minute lane runs on schedule, the rest when asked.",
        ),
    ] = False,
) -> None:
    """Serve the dashboard at /, /health and /metrics, and run every lane (and NEWS_SHARDS) on
    its schedule until stopped (Ctrl-C / SIGTERM). Beyond 127.0.0.1 it needs
    NIGHTCREW_DASHBOARD_TOKEN."""
    settings = _settings()
    _run(lambda: _serve(settings, host, port, demo=demo), settings)


def _listen(host: str, port: int) -> socket.socket:
    # Bind first: a port in use is one line and exit 2, before anything starts ticking.
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return listener


async def _serve(settings: Settings, host: str, port: int, *, demo: bool) -> None:
    from nightcrew.config import reveal

    access = Access.for_bind(host, reveal(settings.dashboard_token))
    # it unlocks mode=apply&quarantineMissing=true: refused at start when weak, as the
    # dashboard's token is
    check_secret("RECONCILER_SECRET", reveal(settings.reconciler_secret))
    listener = _listen(host, port)
    try:
        if demo:
            from nightcrew.demo import demo_database
            from nightcrew.demo.feeds import serve_sample_feeds

            # the demo's sample feeds again, for the page's "Run shard now"
            with demo_database(settings) as demo_settings, serve_sample_feeds() as feeds:
                await _serve_on(
                    demo_settings, listener, access, host, port, demo=True, demo_feeds=feeds
                )
        else:
            await _serve_on(settings, listener, access, host, port, demo=False)
    finally:
        listener.close()


async def _serve_on(
    settings: Settings,
    listener: socket.socket,
    access: Access,
    host: str,
    port: int,
    *,
    demo: bool,
    demo_feeds: str | None = None,
) -> None:
    import uvicorn

    from nightcrew.config import reveal
    from nightcrew.demo import repoint_sample_feeds
    from nightcrew.lifecycle.lanes import lane_schedule, lifecycle_schedules
    from nightcrew.log import warning
    from nightcrew.news.schedule import news_schedules
    from nightcrew.scheduler import Scheduler
    from nightcrew.web.connections import (
        BACKLOG,
        KEEP_ALIVE_GRACE,
        QuietServer,
        ServerGuards,
    )
    from nightcrew.web.context import DashboardContext

    clock = SystemClock()
    async with contextlib.AsyncExitStack() as stack:
        if demo_feeds is not None:
            # its feeds are on this machine: the one private address the demo may fetch
            settings = settings.model_copy(update={"news_allowed_private_hosts": "127.0.0.1"})
        runtime = await stack.enter_async_context(open_runtime(settings, clock))
        secret = (
            None if demo else check_secret("RECONCILER_SECRET", reveal(settings.reconciler_secret))
        )
        if demo_feeds is not None:
            await repoint_sample_feeds(runtime.db, demo_feeds)
        # the demo's minute lane runs (a retried effect moves, /ready is ready); its daily lane
        # is the demo's night, not scheduled again
        schedules = (
            (lane_schedule(runtime, clock, "minute"),)
            if demo
            else lifecycle_schedules(runtime, clock)
        )
        if settings.news_shard_list and not demo:
            schedules = (*schedules, *news_schedules(runtime, clock))
        scheduler = Scheduler(runtime, clock, schedules)

        guards = ServerGuards(
            read_timeout=settings.http_read_timeout_seconds,
            max_connections=settings.http_max_connections,
        )
        dashboard = DashboardContext(
            db=runtime.db,
            clock=clock,
            access=access,
            schedules=scheduler.status,
            label="the demo's night" if demo else "",
            runtime=runtime,  # the page's actions act with it
            proxies_trusted=bool(settings.trusted_proxy_networks),
        )
        server = QuietServer(
            uvicorn.Config(
                _service_app(runtime, clock, secret, dashboard),
                host=host,
                port=port,
                # no connection held by a client that never finishes its request
                http=guards.protocol(),
                timeout_keep_alive=KEEP_ALIVE_GRACE,
                backlog=BACKLOG,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                # X-Forwarded-For/-Proto believed from NIGHTCREW_TRUSTED_PROXIES only (none
                # by default): they decide the throttle's client address and the cookie's Secure
                **uvicorn_proxy_options(settings.trusted_proxy_networks),
                log_level="warning",
                log_config=None,  # uvicorn's loggers go through nightcrew's JSON pipeline
                access_log=False,
                lifespan="off",
            )
        )
        # SIGTERM / SIGINT ask for a graceful stop: the HTTP server drains, the scheduler
        # lets in-flight runs finish, the pool closes, the process exits 0.
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(guards.loop_exception_handler(loop.get_exception_handler()))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit)
        owed = await scheduler.owed()  # before the scheduler starts, and so runs them
        ticking = asyncio.create_task(scheduler.run())
        event("serve_started", host=host, port=port, database=runtime.db.target)
        _announce(host, port, access, runtime.db.target, schedules, owed, clock, demo=demo)
        if secret is None and not demo:
            warning(
                "reconcile_endpoint_disabled",
                reason="RECONCILER_SECRET is unset or empty: POST /reconcile answers 401 to"
                " everyone",
            )
        try:
            await server.serve(sockets=[listener])
        finally:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
            event("serve_stopped")


def _service_app(
    runtime: Runtime, clock: Clock, secret: str | None, dashboard: DashboardContext
) -> Starlette:
    """The HTTP app over ``runtime``: probes, /reconcile, the news reports, the dashboard."""
    from nightcrew.http import Readiness, ServiceParts, create_app
    from nightcrew.lifecycle.reconcile.engine import run_reconcile
    from nightcrew.news.engines.pipeline.metrics import collect_metrics
    from nightcrew.news.report import latest_reports

    async def reconcile(options: ReconcileOptions) -> dict[str, Any]:
        return (await run_reconcile(runtime, clock, options)).to_json()

    async def reports() -> list[dict[str, Any]]:
        return await latest_reports(runtime.db)

    async def ping_database() -> None:
        await runtime.db.fetch_one("SELECT 1")

    pipeline = runtime.settings.news_pipeline == "rabbitmq"
    return create_app(
        runtime.metrics,
        ServiceParts(
            reconcile=reconcile,
            reconciler_secret=secret,
            news_reports=reports,
            collect=(lambda: collect_metrics(runtime, clock)) if pipeline else None,
            readiness=Readiness(
                ping_database=ping_database,
                started_at=clock.now().timestamp(),
                now=lambda: clock.now().timestamp(),
            ),
            dashboard=dashboard,
        ),
    )


def _announce(
    host: str,
    port: int,
    access: Access,
    database: str,
    schedules: tuple[Schedule, ...],
    owed: list[tuple[Schedule, datetime]],
    clock: Clock,
    *,
    demo: bool,
) -> None:
    """The lines `serve` prints when it starts: where, how guarded, what it schedules, and
    each slot it is about to run late."""
    where = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    what = (
        "the last demo's night (its minute lane scheduled)"
        if demo
        else "scheduling " + ", ".join(s.name for s in schedules)
    )
    guard = "sign-in with NIGHTCREW_DASHBOARD_TOKEN" if access.token else "open to this machine"
    typer.echo(f"nightcrew serve: dashboard on {where} ({guard}); {what}; database {database}")
    for schedule, slot in owed:
        # a first start (no run history) or a start after a missed night runs the slot at
        # once: said before it happens, not discovered in the run history
        late = clock.now() - slot
        typer.echo(
            f"nightcrew serve: the {schedule.name} lane's slot of {slot:%Y-%m-%d %H:%M} UTC"
            f" has not run: running it now ({_hours(late)} late; a missed slot is run"
            f" within {_hours(schedule.catch_up)}; `nightcrew lifecycle run"
            f" {schedule.name} --dry-run` shows what it does)"
        )


def _hours(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 10 else f"{hours:.0f} h"
