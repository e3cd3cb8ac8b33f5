"""The operator's dashboard: server-rendered pages of what the crew did, and why.

Read-only HTML from Jinja2 templates (autoescaped: podcast titles, feed names and error texts
are attacker-controlled), one stylesheet served from the package, no JavaScript and nothing
fetched from anywhere else, so it works air-gapped. ``dashboard_routes`` returns the routes;
``http.create_app`` mounts them beside /health and /reconcile, behind ``doors.Doors`` (the Host
check and the headers every answer carries).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from nightcrew import actions as operator_actions
from nightcrew import narrate
from nightcrew.db.database import QueryError
from nightcrew.errors import MIGRATE_HINT, SCHEMA_MISSING_SQLSTATES, NightcrewError
from nightcrew.lifecycle import overage as overage_rules
from nightcrew.log import SecretValues, describe_error, error, redact_url_passwords, warning
from nightcrew.web import actions as action_doors
from nightcrew.web import data
from nightcrew.web.access import (
    COOKIE,
    DEVICE_COOKIE,
    DEVICE_MAX_AGE_SECONDS,
    SESSION_MAX_AGE_SECONDS,
    same_origin,
    secure_cookie,
)
from nightcrew.web.charts import Bar, bar_chart
from nightcrew.web.context import DashboardContext
from nightcrew.web.csrf import CSRF_COOKIE, Csrf
from nightcrew.web.doors import SECURITY_HEADERS as HEADERS
from nightcrew.web.throttle import BUSY_RETRY_AFTER_SECONDS, Verdict

if TYPE_CHECKING:
    pass

HERE = Path(__file__).parent
MAX_LOGIN_BODY = 4096
# Pages share the service's connection pool with the lanes: at most this many at once, so a
# burst of page loads cannot starve a 04:00 run of connections.
CONCURRENT_PAGES = 2
LANE_NAMES = ("daily", "minute")
EFFECT_ACTIONS = ("effects.retry", "effects.retry_dead", "effects.drop")
NEWS_ACTIONS = (
    "news.dlq_replay",
    "news.dlq_purge",
    "news.source_enable",
    "news.source_disable",
    "runs.run_now",
)
RUN_ACTIONS = ("runs.run_now",)


def _environment(secrets: SecretValues | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_shown if not secrets else lambda value: _shown(value, secrets),
    )
    env.filters.update(
        ts=_ts,
        dur=_duration,
        size=_size,
        num=lambda n: f"{int(n or 0):,}",
        tojson=_pretty,
        label=count_label,
    )
    return env


# A report's count as a person reads it: "items_requeued" and "acceptedCount" alike become
# words; the few whose words say too little are named here.
_LABELS = {
    "backpressureDbArticleCount": "articles in the database",
    "backpressureQueueCount": "articles waiting",
    "queuedCount": "new",
    "processedCount": "written",
    "lockedCount": "shard locked",
    "aiPromptTokens": "model tokens in",
    "aiCompletionTokens": "model tokens out",
}
_WORD_EDGE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def count_label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    words = _WORD_EDGE.sub(" ", key).replace("_", " ").lower().split()
    if len(words) > 1 and words[-1] == "count":
        words = words[:-1]
    return " ".join(words)


def _shown(value: Any, secrets: SecretValues | None = None) -> Any:
    """Every printed text loses the passwords of the URLs in it (a feed added as
    ``https://user:pass@host/feed``, an error that quotes one) and, with ``secrets``, every
    configured secret (a row stored before they were kept out of storage). Markup is ours (the
    charts)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return redact_url_passwords(secrets.redact(value) if secrets else value)
    return value


def _ts(value: datetime | str | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value.tzinfo else str(value)


def _duration(value: timedelta | float | None) -> str:
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _size(value: int | float | None) -> str:
    amount = float(value or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(amount) < 1000 or unit == "TB":
            return f"{amount:,.0f} {unit}" if unit == "B" else f"{amount:,.1f} {unit}"
        amount /= 1000
    return f"{amount:,.1f} TB"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def dashboard_routes(ctx: DashboardContext) -> list[BaseRoute]:
    env = _environment(
        SecretValues(ctx.runtime.settings.secret_values()) if ctx.runtime is not None else None
    )
    pages_at_once = asyncio.Semaphore(CONCURRENT_PAGES)
    csrf = Csrf(ctx.access.token)

    def render(request: Request, template: str, status: int = 200, **values: Any) -> Response:
        # Every page hands the browser its CSRF value (once) and its forms the token of it.
        value = request.cookies.get(CSRF_COOKIE)
        fresh = not csrf.well_formed(value)
        if value is None or fresh:
            value = csrf.new_value()
        session = request.cookies.get(COOKIE) if ctx.access.token is not None else None
        body = env.get_template(template).render(
            request=request,
            path=request.url.path,
            label=ctx.label,
            signed_in=ctx.access.token is not None and ctx.session_valid(request),
            now=ctx.clock.now(),
            can_act=ctx.runtime is not None,
            csrf_token=csrf.token(value, session),
            utc=UTC,
            **{"live": False, **values},
        )
        response = HTMLResponse(body, status_code=status, headers=HEADERS)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                value,
                httponly=True,
                samesite="strict",
                secure=secure_cookie(
                    request.url.scheme, request.client.host if request.client else None
                ),
                path="/",
            )
        return response

    def cross_site(request: Request) -> Response | None:
        """403 for a POST sent by another site's page (see access.same_origin), else None."""
        headers = request.headers
        if same_origin(headers.get("origin"), headers.get("referer"), headers.get("host")):
            return None
        warning("dashboard_cross_site_post", path=request.url.path)
        return Response("cross-site request refused\n", 403, media_type="text/plain")

    def page(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """Access first (the Host was checked by doors.Doors; then the session), then the page;
        a database that is gone or a bad filter is a page that says so, not a traceback."""

        async def guarded(request: Request) -> Response:
            if not ctx.session_valid(request):
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(
                    "/login?" + urlencode({"next": target}), 303, headers=HEADERS
                )
            started = time.perf_counter()
            try:
                async with pages_at_once:
                    response = await handler(request)
            except data.BadRequest as exc:
                return render(request, "error.html", 400, title="Bad request", problem=str(exc))
            except NightcrewError as exc:
                problem = describe_error(exc)
                if isinstance(exc, QueryError) and exc.sqlstate in SCHEMA_MISSING_SQLSTATES:
                    problem = f"{problem} — {MIGRATE_HINT}"
                warning("dashboard_unavailable", path=request.url.path, error=problem)
                title = "The database could not answer"
                return render(request, "error.html", 503, title=title, problem=problem)
            except Exception as exc:  # a page bug is a page that says so, never a traceback
                error("dashboard_page_failed", path=request.url.path, error=describe_error(exc))
                return render(
                    request,
                    "error.html",
                    500,
                    title="This page failed",
                    problem="The page could not be drawn; the server's log has the details.",
                )
            response.headers["Server-Timing"] = (
                f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
            )
            return response

        return guarded

    async def overview(request: Request) -> Response:
        # A database that is gone is the guard's 503 page, like every other page's.
        return render(
            request,
            "overview.html",
            title="Overview",
            lanes=await data.latest_per_lane(ctx.db),
            schedules=ctx.schedules() if ctx.schedules else None,
            counts=await data.counts(ctx.db),
            live=True,
        )

    async def live(request: Request) -> Response:
        # What static/live.js writes into the pages' counts (their data-live keys).
        read_at = ctx.clock.now().astimezone(UTC)
        body = {
            "read_at": read_at.isoformat(),
            "read_at_text": read_at.strftime("%H:%M:%S"),
            "values": await data.live_values(ctx.db),
        }
        return Response(json.dumps(body) + "\n", media_type="application/json", headers=HEADERS)

    async def runs(request: Request) -> Response:
        wanted = data.RunFilter.parse(dict(request.query_params))
        # every lane with a run, and every one that can have one (a shard not run yet)
        runnable = [*LANE_NAMES, *await action_doors.news_lanes(ctx)]
        lanes = sorted({*runnable, *(lane.lane for lane in await data.latest_per_lane(ctx.db))})
        if wanted.lane is not None and wanted.lane not in lanes:
            raise data.BadRequest(
                f"lane: no lane {wanted.lane!r} here; the lanes are {', '.join(lanes)}"
            )
        result = await data.runs_page(ctx.db, wanted)
        return render(
            request,
            "runs.html",
            title="Runs",
            wanted=wanted,
            page=result,
            lanes=lanes,
            runnable=runnable,
            recent_actions=await operator_actions.recent(ctx.db, actions=RUN_ACTIONS),
            statuses=data.RUN_STATUSES,
            older_query=urlencode(wanted.query(before=result.older)) if result.older else None,
            newest_query=urlencode(wanted.query(before=None)),
        )

    async def run(request: Request) -> Response:
        wanted = data.run_id(request.path_params["run_id"])
        detail = None if wanted is None else await data.run_detail(ctx.db, wanted)
        if detail is None:
            return render(request, "error.html", 404, title="Not found", problem="no such run")
        names = await data.run_names(ctx.db, detail.report)

        def name(row_id: str, item: Any) -> str:
            # by title, as the CLI says them; a deleted podcast by its slug, else its id
            return names.get(row_id) or narrate.short_name(row_id, item)

        return render(
            request,
            "run.html",
            title=f"Run {detail.id}",
            run=detail,
            sentences=narrate.lane_sentences(detail.lane, detail.report, name),
        )

    async def run_json(request: Request) -> Response:
        wanted = data.run_id(request.path_params["run_id"])
        detail = None if wanted is None else await data.run_detail(ctx.db, wanted)
        if detail is None:
            return Response(
                '{"error": "no such run"}\n', 404, media_type="application/json", headers=HEADERS
            )
        return Response(
            _pretty(detail.raw) + "\n",
            media_type="application/json",
            headers={**HEADERS, "Content-Disposition": f'inline; filename="run-{detail.id}.json"'},
        )

    async def deletions(request: Request) -> Response:
        view = await data.deletions(
            ctx.db, ctx.clock.now(), request.query_params.get("before") or None
        )
        return render(
            request,
            "deletions.html",
            title="Deletions",
            view=view,
            older_query=urlencode({"before": view.older}) if view.older else None,
        )

    async def overage(request: Request) -> Response:
        now = ctx.clock.now()
        return render(
            request,
            "overage.html",
            title="Overage",
            view=await data.overage(ctx.db, now),
            grace_days=overage_rules.OVERAGE_GRACE_DAYS,
            nag_days=overage_rules.NAG_STAGE_DAYS,
            notice_days=overage_rules.SUSPEND_NOTICE_DAYS,
        )

    async def watchdogs(request: Request) -> Response:
        view = await data.watchdogs(ctx.db, ctx.clock.now())
        chart = bar_chart(
            [
                Bar(
                    label=h.hour.astimezone(UTC).strftime("%H"),
                    value=h.resent,
                    tip=f"{h.hour.astimezone(UTC):%Y-%m-%d %H}:00 — {h.resent} re-sent, "
                    f"{h.runs} minute run(s)",
                )
                for h in view.hours
            ],
            title="Messages re-sent per hour, last 24 hours",
            every=3,
        )
        return render(request, "watchdogs.html", title="Watchdogs", view=view, chart=chart)

    async def effects(request: Request) -> Response:
        return render(
            request,
            "effects.html",
            title="Effects",
            view=await data.effects(ctx.db),
            recent_actions=await operator_actions.recent(ctx.db, actions=EFFECT_ACTIONS),
            live=True,
        )

    async def news(request: Request) -> Response:
        view = await data.news(ctx.db)
        charts = {
            s.shard: bar_chart(
                [
                    Bar(
                        label="",
                        value=int(p["queued"]) + int(p["deferred"]),
                        tip=f"{p['started_at'].astimezone(UTC):%Y-%m-%d %H:%M} — "
                        f"{p['queued']} queued, {p['deferred']} deferred",
                    )
                    for p in s.series
                ],
                title=f"Stories queued and deferred per run, shard {s.shard}",
                height=90,
            )
            for s in view.shards
        }
        letters = await data.dead_letters(ctx.runtime)
        return render(
            request,
            "news.html",
            title="News",
            view=view,
            charts=charts,
            sentences={s.shard: narrate.news_sentences(s.latest) for s in view.shards},
            letters=letters,
            refusal_hints=data.refusal_hints(
                view.parked,
                ctx.runtime.settings.news_allowed_private_hosts if ctx.runtime else "",
            ),
            recent_actions=await operator_actions.recent(ctx.db, actions=NEWS_ACTIONS),
            live=True,
        )

    async def login_form(request: Request) -> Response:
        return render(
            request,
            "login.html",
            title="Sign in",
            next=_safe_next(request.query_params.get("next")),
            problem=None,
        )

    async def login(request: Request) -> Response:
        if (refused := cross_site(request)) is not None:
            return refused
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LOGIN_BODY:
                return Response("request too large\n", 413, media_type="text/plain")
        try:
            form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:
            return Response("too many form fields\n", 400, media_type="text/plain")
        offered = (form.get("token") or [""])[0]
        target = _safe_next((form.get("next") or ["/"])[0])
        if ctx.access.token is None:
            return RedirectResponse(target, 303)
        client = request.client.host if request.client else None
        now = ctx.clock.now().timestamp()
        verdict = await ctx.throttle.attempt(
            client,
            lambda: ctx.access.token_matches(offered),
            known_device=ctx.access.device_known(request.cookies.get(DEVICE_COOKIE), now),
        )
        if verdict is Verdict.BUSY:
            busy = render(
                request,
                "login.html",
                429,
                title="Sign in",
                next=target,
                problem="A sign-in from your address is still being checked; try again in a "
                "moment.",
            )
            busy.headers["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
            return busy
        if verdict is Verdict.REFUSED:
            warning("dashboard_login_refused", client=client)
            return render(
                request,
                "login.html",
                401,
                title="Sign in",
                next=target,
                problem="That is not the dashboard token.",
            )
        response = RedirectResponse(target, 303, headers=HEADERS)
        secure = secure_cookie(request.url.scheme, client)
        response.set_cookie(
            COOKIE,
            ctx.access.session_value(now),
            max_age=SESSION_MAX_AGE_SECONDS,
            httponly=True,
            samesite="strict",
            secure=secure,
            path="/",
        )
        # sent back to the sign-in form only; kept past sign-out, which ends the session
        response.set_cookie(
            DEVICE_COOKIE,
            ctx.access.device_value(now),
            max_age=DEVICE_MAX_AGE_SECONDS,
            httponly=True,
            samesite="strict",
            secure=secure,
            path="/login",
        )
        return response

    async def logout(request: Request) -> Response:
        if (refused := cross_site(request)) is not None:
            return refused
        response = RedirectResponse("/login", 303, headers=HEADERS)
        response.delete_cookie(
            COOKIE,
            path="/",
            httponly=True,
            samesite="strict",
            secure=secure_cookie(
                request.url.scheme, request.client.host if request.client else None
            ),
        )
        return response

    return [
        *action_doors.action_routes(ctx, csrf, render, page),
        Route("/", page(overview), methods=["GET"]),
        Route("/live.json", page(live), methods=["GET"]),
        Route("/runs", page(runs), methods=["GET"]),
        Route("/runs/{run_id}", page(run), methods=["GET"]),
        Route("/runs/{run_id}/report.json", page(run_json), methods=["GET"]),
        Route("/deletions", page(deletions), methods=["GET"]),
        Route("/overage", page(overage), methods=["GET"]),
        Route("/watchdogs", page(watchdogs), methods=["GET"]),
        Route("/effects", page(effects), methods=["GET"]),
        Route("/news", page(news), methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", _Static(directory=HERE / "static"), name="static"),
    ]


class _Static(StaticFiles):
    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        try:
            return super().lookup_path(path)
        except ValueError:  # a NUL byte in the path, which os.stat refuses: no such file
            return "", None


def _safe_next(target: str | None) -> str:
    """Only a path on this site: never another host (an open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
