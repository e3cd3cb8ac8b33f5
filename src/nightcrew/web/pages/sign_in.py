"""Signing in and out: the token form, the sign-in throttle, the session and device cookies."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from nightcrew.log import warning
from nightcrew.web.access import (
    COOKIE,
    DEVICE_COOKIE,
    DEVICE_MAX_AGE_SECONDS,
    SESSION_MAX_AGE_SECONDS,
    secure_cookie,
)
from nightcrew.web.host_and_headers import SECURITY_HEADERS as HEADERS
from nightcrew.web.pages.base import (
    Pages,
)
from nightcrew.web.throttle import BUSY_RETRY_AFTER_SECONDS, Verdict

MAX_LOGIN_BODY = 4096


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
    target = safe_next((form.get("next") or ["/"])[0])
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
    secure = secure_cookie(request.url.scheme, client)
    response.set_cookie(
        COOKIE,
        pages.ctx.access.session_value(now),
        max_age=SESSION_MAX_AGE_SECONDS,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    # sent back to the sign-in form only; kept past sign-out, which ends the session
    response.set_cookie(
        DEVICE_COOKIE,
        pages.ctx.access.device_value(now),
        max_age=DEVICE_MAX_AGE_SECONDS,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/login",
    )
    return response


async def logout(pages: Pages, request: Request) -> Response:
    if (refused := pages.cross_site(request)) is not None:
        return refused
    response = RedirectResponse("/login", 303, headers=HEADERS)
    response.delete_cookie(
        COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request.url.scheme, request.client.host if request.client else None),
    )
    return response


def safe_next(target: str | None) -> str:
    """Only a path on this site: never another host (an open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
