"""Signing in and out: the token form, the sign-in throttle, the session and device cookies."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from nightcrew.log import warning
from nightcrew.web.access import (
    COOKIE,
    DEVICE_COOKIE,
    DEVICE_MAX_AGE_SECONDS,
    SESSION_MAX_AGE_SECONDS,
    delete_strict_cookie,
    set_strict_cookie,
)
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS
from nightcrew.web.pages.base import Pages, read_form
from nightcrew.web.throttle import BUSY_RETRY_AFTER_SECONDS, Verdict

MAX_LOGIN_BODY = 4096
# the form's token and next, and room for a browser's extra field or two
MAX_LOGIN_FIELDS = 4


async def login_form(pages: Pages, request: Request) -> Response:
    return pages.render(
        request,
        "login.html",
        title="Sign in",
        next=safe_next(request.query_params.get("next")),
        problem=None,
    )


async def login(pages: Pages, request: Request) -> Response:
    if (refused := pages.cross_site(request)) is not None:
        return refused
    form = await read_form(request, max_bytes=MAX_LOGIN_BODY, max_fields=MAX_LOGIN_FIELDS)
    if isinstance(form, Response):
        return form
    offered = form.get("token", "")
    target = safe_next(form.get("next", "/"))
    if pages.ctx.access.token is None:
        return RedirectResponse(target, 303)
    client = request.client.host if request.client else None
    now = pages.ctx.clock.now().timestamp()
    verdict = await pages.ctx.throttle.attempt(
        client,
        lambda: pages.ctx.access.token_matches(offered),
        device=pages.ctx.access.device_id(request.cookies.get(DEVICE_COOKIE), now),
    )
    if verdict is Verdict.BUSY:
        busy = pages.render(
            request,
            "login.html",
            429,
            title="Sign in",
            next=target,
            problem="A sign-in from your address is still being checked; try again in a moment.",
        )
        busy.headers["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
        return busy
    if verdict is Verdict.REFUSED:
        warning("dashboard_login_refused", client=client)
        return pages.render(
            request,
            "login.html",
            401,
            title="Sign in",
            next=target,
            problem="That is not the dashboard token.",
        )
    response = RedirectResponse(target, 303, headers=HEADERS)
    access = pages.ctx.access
    set_strict_cookie(
        response, request, COOKIE, access.session_value(now), max_age=SESSION_MAX_AGE_SECONDS
    )
    # sent back to the sign-in form only; kept past sign-out, which ends the session
    set_strict_cookie(
        response,
        request,
        DEVICE_COOKIE,
        access.device_value(now),
        path="/login",
        max_age=DEVICE_MAX_AGE_SECONDS,
    )
    return response


async def logout(pages: Pages, request: Request) -> Response:
    if (refused := pages.cross_site(request)) is not None:
        return refused
    response = RedirectResponse("/login", 303, headers=HEADERS)
    delete_strict_cookie(response, request, COOKIE)
    return response


def safe_next(target: str | None) -> str:
    """Only a path on this site: never another host (an open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
