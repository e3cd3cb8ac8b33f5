"""The HTTP door: health checks, metrics, and the secret-guarded storage reconciler.

``POST /reconcile`` checks ``Authorization: Bearer $RECONCILER_SECRET`` first, in constant time,
under the sign-in throttle's rules (web/throttle.py: about two wrong bearers checked a second,
each logged as ``reconcile_auth_failed``), and fails closed when the secret is unset — nothing
about the request (not even its flags) is read before that. Then the flags (query parameters)
are validated: an unknown flag or a bad value is a 400 that names it. The response is the
reconciler's JSON report.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from nightcrew.errors import DatabaseUnavailableError, NightcrewError
from nightcrew.jsonable import JsonObject
from nightcrew.lifecycle.reconcile.core import (
    MAX_ORPHAN_AGE_HOURS,
    MIN_ORPHAN_AGE_HOURS,
    OptionError,
    ReconcileOptions,
    parse_flags,
)
from nightcrew.log import describe_error, event, warning
from nightcrew.metrics import Metrics
from nightcrew.web.app import dashboard_routes
from nightcrew.web.context import DashboardContext
from nightcrew.web.host_and_headers import HostAndHeaders
from nightcrew.web.throttle import BUSY_RETRY_AFTER_SECONDS, SignInThrottle, Verdict

HEALTH_BODY = {"status": "ok", "service": "lifecycle-manager"}
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

Reconcile = Callable[[ReconcileOptions], Awaitable[JsonObject]]


async def health(request: Request) -> JSONResponse:
    return JSONResponse(HEALTH_BODY)


def authorized(header: str | None, secret: str | None) -> bool:
    """Bearer check in constant time; an unset secret authorizes nobody."""
    if not secret or not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), secret.encode())


def _unauthorized() -> JSONResponse:
    return JSONResponse(
        {"error": "unauthorized"},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="reconcile"'},
    )


# /ready answers 503 when no slot has fired for this long (the minute lane fires every 60 s).
SCHEDULER_STALE_SECONDS = 180.0
DB_CHECK_TIMEOUT_SECONDS = 2.0


class SingleFlight:
    """At most one run of ``work`` at a time: a caller that comes while one runs waits for
    that one, and a caller that gives up (its timeout) leaves it running. 800 clients polling
    /ready cost one database ping at a time, not 800 pool waits each cancelled after 2 s (a
    cancelled pool wait can lose its connection: ``Database._checkout``)."""

    def __init__(self, work: Callable[[], Awaitable[None]]) -> None:
        self._work = work
        self._running: asyncio.Future[None] | None = None

    async def run(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._work())
            self._running.add_done_callback(_retrieved)
        await asyncio.shield(self._running)


def _retrieved(done: asyncio.Future[None]) -> None:
    """Its outcome is read by whoever awaited it; none left is no "never retrieved" warning."""
    if not done.cancelled():
        done.exception()


@dataclass(frozen=True, kw_only=True)
class Readiness:
    """What /ready checks: the database answers, and the scheduler fires slots."""

    ping_database: Callable[[], Awaitable[None]]
    started_at: float  # unix time the scheduler started (its grace before a first tick)
    now: Callable[[], float]


@dataclass(frozen=True, kw_only=True)
class ServiceParts:
    """What ``create_app`` serves beside the probes, each optional: the reconciler's door
    (``reconcile`` behind ``reconciler_secret``, paced by ``reconcile_throttle``), the news
    reports, readiness, the metrics' collection before a scrape, and the dashboard."""

    reconcile: Reconcile | None = None
    reconciler_secret: str | None = None
    news_reports: Callable[[], Awaitable[list[JsonObject]]] | None = None
    readiness: Readiness | None = None
    collect: Callable[[], Awaitable[None]] | None = None
    dashboard: DashboardContext | None = None
    reconcile_throttle: SignInThrottle | None = None


class ServiceApp:
    """What ``create_app`` serves beside the dashboard: the probes, the reconciler's door and
    the news reports, each a method over the service's parts."""

    def __init__(self, metrics: Metrics, parts: ServiceParts) -> None:
        self.metrics = metrics
        self.reconcile = parts.reconcile
        self.reconciler_secret = parts.reconciler_secret
        self.news_reports = parts.news_reports
        self.readiness = readiness = parts.readiness
        self.dashboard = parts.dashboard
        self.reconcile_throttle = parts.reconcile_throttle or SignInThrottle()
        self.ping = SingleFlight(readiness.ping_database) if readiness is not None else None
        collect = parts.collect
        self.collected = SingleFlight(collect) if collect is not None else None
        self.last_cause: str | None = None

    async def database_up(self) -> str | None:
        """None when PostgreSQL answered; else why not, in words that name no address (the
        answer is for a probe; the log line, once per new cause, has the details).
        Sets ``nightcrew_db_up``."""
        if self.ping is None:
            return None
        cause = None
        try:
            async with asyncio.timeout(DB_CHECK_TIMEOUT_SECONDS):
                await self.ping.run()
        except TimeoutError:
            problem: str | None = f"PostgreSQL did not answer within {DB_CHECK_TIMEOUT_SECONDS:g} s"
        except DatabaseUnavailableError as exc:
            problem, cause = "PostgreSQL is unreachable", describe_error(exc)
        except NightcrewError as exc:
            problem = f"PostgreSQL refused the check ({type(exc).__name__})"
            cause = describe_error(exc)
        else:
            problem = None
        if cause is not None and cause != self.last_cause:
            warning("ready_database_down", error=cause)
        self.last_cause = cause
        self.metrics.set("nightcrew_db_up", 0.0 if problem else 1.0)
        return problem

    async def render_metrics(self, request: Request) -> PlainTextResponse:
        if await self.database_up() is None and self.collected is not None:
            try:
                await self.collected.run()
            except Exception as exc:  # a scrape still answers, with what it has
                warning("metrics_collect_failed", error=describe_error(exc))
        return PlainTextResponse(self.metrics.render(), media_type=PROMETHEUS_TEXT)

    async def ready(self, request: Request) -> JSONResponse:
        if self.readiness is None:
            return JSONResponse({"status": "ready"})
        problems = []
        if (problem := await self.database_up()) is not None:
            problems.append(f"database: {problem}")
        last_tick = self.metrics.value("nightcrew_scheduler_last_tick_timestamp_seconds")
        since = self.readiness.now() - max(last_tick, self.readiness.started_at)
        if since > SCHEDULER_STALE_SECONDS:
            problems.append(f"scheduler: no slot fired for {since:.0f} s")
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def reconcile_endpoint(self, request: Request) -> JSONResponse:
        header = request.headers.get("authorization")
        if not self.reconciler_secret or header is None:
            # the door is closed, or nothing was offered: there is no guess to slow down
            return _unauthorized()
        # a bearer is a guess like a sign-in's: the same throttle (its own instance), and each
        # wrong one logged with the client it came from
        client = request.client.host if request.client else None
        verdict = await self.reconcile_throttle.attempt(
            client, lambda: authorized(header, self.reconciler_secret)
        )
        if verdict is Verdict.BUSY:
            return _busy()
        if verdict is Verdict.REFUSED:
            warning("reconcile_auth_failed", client=client)
            return _unauthorized()
        repeated = [k for k in request.query_params if len(request.query_params.getlist(k)) > 1]
        if repeated:
            return JSONResponse({"error": f"{repeated[0]}: given more than once"}, status_code=400)
        try:
            options = parse_flags(dict(request.query_params))
        except OptionError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if self.reconcile is None:
            return JSONResponse({"error": "the reconciler is not available here"}, status_code=503)
        event("reconcile_requested", **options.to_json())
        try:
            report = await self.reconcile(options)
        except NightcrewError as exc:
            warning("reconcile_unavailable", error=describe_error(exc))
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse(report)

    async def openapi(self, request: Request) -> JSONResponse:
        return JSONResponse(OPENAPI)

    async def reports(self, request: Request) -> JSONResponse:
        # The same data as the dashboard's news page, under the same access: a loopback Host
        # when open; the dashboard's cookie or `Authorization: Bearer <token>` when it has one.
        # A bearer token is a guess like a sign-in's, under the same throttle; no token at all
        # guesses nothing and is refused at once. (The Host was checked by HostAndHeaders.)
        dashboard = self.dashboard
        if dashboard is not None and not dashboard.session_valid(request):
            bearer = request.headers.get("authorization")
            client = request.client.host if request.client else None
            verdict = (
                Verdict.REFUSED
                if bearer is None
                else await dashboard.throttle.attempt(
                    client, lambda: dashboard.access.bearer_valid(bearer)
                )
            )
            if verdict is Verdict.BUSY:
                return _busy()
            if verdict is Verdict.REFUSED:
                return JSONResponse(
                    {"error": "unauthorized"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="nightcrew"'},
                )
        if self.news_reports is None:
            return JSONResponse({"reports": []})
        return JSONResponse({"reports": await self.news_reports()})


def create_app(metrics: Metrics, parts: ServiceParts | None = None) -> Starlette:
    app = ServiceApp(metrics, parts or ServiceParts())
    dashboard = app.dashboard
    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/_health", health, methods=["GET"]),
            Route("/ready", app.ready, methods=["GET"]),
            Route("/metrics", app.render_metrics, methods=["GET"]),
            Route("/reconcile", app.reconcile_endpoint, methods=["POST"]),
            Route("/openapi.json", app.openapi, methods=["GET"]),
            Route("/news/reports", app.reports, methods=["GET"]),
            *(dashboard_routes(dashboard) if dashboard is not None else []),
        ],
        middleware=[Middleware(HostAndHeaders, access=dashboard.access if dashboard else None)],
    )


def _busy() -> JSONResponse:
    """A bearer from this address is being checked already (the sign-in throttle's gate)."""
    return JSONResponse(
        {"error": "a check from your address is in progress; retry"},
        status_code=429,
        headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)},
    )


def _error(description: str) -> JsonObject:
    """A response of the ``Error`` schema: ``{"error": "..."}``."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _flag(name: str, description: str, schema: JsonObject) -> JsonObject:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_HEALTH = {
    "type": "object",
    "required": ["status", "service"],
    "properties": {
        "status": {"type": "string", "enum": ["ok"]},
        "service": {"type": "string", "enum": ["lifecycle-manager"]},
    },
}
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_BOOL = {"type": "string", "enum": ["true", "false", "1", "0"]}

OPENAPI: JsonObject = {
    "openapi": "3.0.3",
    "info": {
        "title": "nightcrew lifecycle manager",
        "version": "0.1.0",
        "description": "Health, metrics and the secret-guarded storage reconciler.",
    },
    "components": {
        "securitySchemes": {
            "reconcilerSecret": {
                "type": "http",
                "scheme": "bearer",
                "description": "RECONCILER_SECRET",
            }
        },
        "schemas": {"Health": _HEALTH, "Error": _ERROR},
    },
    "paths": {
        "/health": {
            "get": {
                "summary": "Liveness",
                "responses": {
                    "200": {
                        "description": "up",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                        },
                    }
                },
            }
        },
        "/_health": {
            "get": {
                "summary": "Liveness (alias)",
                "responses": {
                    "200": {
                        "description": "up",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                        },
                    }
                },
            }
        },
        "/ready": {
            "get": {
                "summary": "Readiness: the database answers and the scheduler fires slots",
                "responses": {
                    "200": {
                        "description": "ready",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "503": {
                        "description": "not ready; `problems` says why",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/reconcile": {
            "post": {
                "summary": "Run the storage reconciler (dry run unless mode=apply)",
                "security": [{"reconcilerSecret": []}],
                "parameters": [
                    _flag(
                        "mode",
                        "dryrun (default) reports only; apply performs mutations",
                        {"type": "string", "enum": ["dryrun", "apply"]},
                    ),
                    _flag(
                        "quarantineMissing",
                        "(apply) null the audio of episodes whose object "
                        "is gone, demoting published/scheduled ones to draft",
                        _BOOL,
                    ),
                    _flag("skipOrphanDelete", "report orphans only, even in apply mode", _BOOL),
                    _flag(
                        "bypassCapForBackfill",
                        "(apply) disable only the storage-cap trigger during the size backfill",
                        _BOOL,
                    ),
                    _flag(
                        "minOrphanAgeHours",
                        f"minimum orphan age, clamped to "
                        f"{MIN_ORPHAN_AGE_HOURS}-{MAX_ORPHAN_AGE_HOURS}",
                        {"type": "integer"},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "the reconcile report",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "400": _error("unknown flag or malformed value"),
                    "401": _error("missing or wrong bearer token, or no secret set"),
                    "429": _error(
                        "a bearer from this address is being checked: retry after the"
                        " Retry-After seconds (wrong bearers are throttled as sign-ins are)"
                    ),
                    "503": _error("the reconciler cannot run (configuration, database)"),
                },
            }
        },
        "/news/reports": {
            "get": {
                "summary": "The latest news-worker report of each shard",
                "description": "Under the dashboard's access: with NIGHTCREW_DASHBOARD_TOKEN "
                "set, its cookie or `Authorization: Bearer <token>`; open, loopback Hosts only.",
                "responses": {
                    "200": {
                        "description": "reports",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "401": _error("the dashboard has a token and none was given"),
                    "421": {
                        "description": "a Host that is not this dashboard's",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "429": {
                        "description": "a token check from this address is still in progress "
                        "(the sign-in throttle); retry after `Retry-After` seconds",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                        },
                    },
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This description",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    },
}
