"""What every dashboard page shares: ``Pages`` (the context, the templates, the CSRF values
and the guard every page passes through), the template filters, and the read models' small
helpers (cursors, a bad filter, a stored number read defensively).

A page is a module of ``web/pages/`` with its handler — ``async def show(pages, request)`` —
its read model and its SQL beside it; ``web/app.py`` holds the one route table.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from nightcrew.db.database import QueryError
from nightcrew.errors import MIGRATE_HINT, SCHEMA_MISSING_SQLSTATES, NightcrewError
from nightcrew.log import SecretValues, describe_error, error, redact_url_passwords, warning
from nightcrew.web.access import COOKIE, same_origin, set_strict_cookie
from nightcrew.web.context import DashboardContext
from nightcrew.web.csrf import CSRF_COOKIE, Csrf
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
PAGE_SIZE = 50
# the ends of a keyset: a first page's cursor is "before the end of time"
FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
MAX_ID = 2**63 - 1
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
# Pages share the service's connection pool with the lanes: at most this many at once, so a
# burst of page loads cannot starve a 04:00 run of connections.
CONCURRENT_PAGES = 2

Handler = Callable[[Request], Awaitable[Response]]
PageHandler = Callable[["Pages", Request], Awaitable[Response]]


async def read_form(
    request: Request, *, max_bytes: int, max_fields: int
) -> dict[str, str] | Response:
    """A POSTed form's fields (the first value of each), read no further than ``max_bytes``;
    or the 413 or 400 that refuses it."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return Response("request too large\n", 413, media_type="text/plain")
    try:
        parsed = parse_qs(body.decode("utf-8", "replace"), max_num_fields=max_fields)
    except ValueError:
        return Response("too many form fields\n", 400, media_type="text/plain")
    return {k: v[0] for k, v in parsed.items()}


class BadRequest(NightcrewError, ValueError):
    """A filter or cursor the dashboard cannot use; the message names it."""


class Pages:
    """One dashboard's shared parts: made once per app (``web/app.py``), handed to every page
    handler and action."""

    def __init__(self, ctx: DashboardContext) -> None:
        self.ctx = ctx
        self.csrf = Csrf(ctx.access.token)
        self.secrets = (
            SecretValues(ctx.runtime.settings.secret_values()) if ctx.runtime is not None else None
        )
        self._env = _environment(self.secrets)
        self._at_once = asyncio.Semaphore(CONCURRENT_PAGES)

    def render(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        # Every page hands the browser its CSRF value (once) and its forms the token of it.
        ctx, csrf = self.ctx, self.csrf
        value = request.cookies.get(CSRF_COOKIE)
        fresh = not csrf.well_formed(value)
        if value is None or fresh:
            value = csrf.new_value()
        session = request.cookies.get(COOKIE) if ctx.access.token is not None else None
        body = self._env.get_template(template).render(
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
            set_strict_cookie(response, request, CSRF_COOKIE, value)
        return response

    def shown(self, text: str) -> str:
        """Text as every page shows it: no URL password, no configured secret (a row stored
        before they were kept out of storage)."""
        return str(_shown(text, self.secrets))

    def cross_site(self, request: Request) -> Response | None:
        """403 for a POST sent by another site's page (see access.same_origin), else None."""
        headers = request.headers
        if same_origin(headers.get("origin"), headers.get("referer"), headers.get("host")):
            return None
        warning("dashboard_cross_site_post", path=request.url.path)
        return Response("cross-site request refused\n", 403, media_type="text/plain")

    def view(self, handler: PageHandler) -> Handler:
        """A page's handler behind the guard, with these Pages."""
        return self.guard(partial(handler, self))

    def plain(self, handler: PageHandler) -> Handler:
        """A handler with these Pages and no guard (the sign-in form and its POSTs)."""
        return partial(handler, self)

    def guard(self, handler: Handler) -> Handler:
        """Access first (the Host was checked by HostAndHeaders; then the session), then the page;
        a database that is gone or a bad filter is a page that says so, not a traceback."""

        async def guarded(request: Request) -> Response:
            if not self.ctx.session_valid(request):
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(
                    "/login?" + urlencode({"next": target}), 303, headers=HEADERS
                )
            started = time.perf_counter()
            try:
                async with self._at_once:
                    response = await handler(request)
            except BadRequest as exc:
                return self.render(
                    request, "error.html", 400, title="Bad request", problem=str(exc)
                )
            except NightcrewError as exc:
                problem = describe_error(exc)
                if isinstance(exc, QueryError) and exc.sqlstate in SCHEMA_MISSING_SQLSTATES:
                    problem = f"{problem} — {MIGRATE_HINT}"
                warning("dashboard_unavailable", path=request.url.path, error=problem)
                title = "The database could not answer"
                return self.render(request, "error.html", 503, title=title, problem=problem)
            except Exception as exc:  # a page bug is a page that says so, never a traceback
                error("dashboard_page_failed", path=request.url.path, error=describe_error(exc))
                return self.render(
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


def _environment(secrets: SecretValues | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
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
        tojson=pretty,
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


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def finite_ms(value: object) -> float | None:
    """A finite duration in milliseconds from a report, or None (a report is not trusted)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and 0 <= number < 1e12 else None


def encode_cursor(at: datetime, key: object) -> str:
    raw = f"{at.isoformat()}|{key}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, _, key = raw.partition("|")
        when = datetime.fromisoformat(at)
    except ValueError as exc:
        raise BadRequest("before: not a cursor this page made") from exc
    if when.tzinfo is None or not key:
        raise BadRequest("before: not a cursor this page made")
    return when, key
