"""The doors of `serve` against a real database, in-process: the Host check on every route but
the liveness probes, the headers every answer carries, sessions that expire, cross-site POSTs,
odd static paths, throttled guesses, and passwords kept out of the pages."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

import httpx
import pytest
from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.metrics import Metrics
from nightcrew.web.access import COOKIE, SESSION_MAX_AGE_SECONDS, Access
from nightcrew.web.context import DashboardContext
from nightcrew.web.throttle import FAILED_LOGIN_DELAY_SECONDS
from tests.integration.web.test_dashboard_pages import TOKEN, client

SECURITY_HEADERS = {"x-content-type-options": "nosniff", "cache-control": "no-store"}


def _max_age(set_cookie: str) -> int:
    found = re.search(r"Max-Age=(\d+)", set_cookie, re.I)
    assert found, set_cookie
    return int(found[1])


async def _sign_in(c: httpx.AsyncClient, token: str = TOKEN) -> httpx.Response:
    return await c.post("/login", data={"token": token, "next": "/runs"})


@pytest.mark.parametrize("path", ["/ready", "/metrics", "/openapi.json", "/news/reports", "/"])
async def test_a_rebound_host_is_refused_on_every_route_but_liveness(
    db: Database, clock: FrozenClock, path: str
) -> None:
    access = Access.for_bind("127.0.0.1", None)
    async with client(db, clock, access, "attacker.example:8787") as c:
        refused = await c.get(path)
        assert refused.status_code == 421, path
        assert "unknown Host" in refused.text
        for name, value in SECURITY_HEADERS.items():
            assert refused.headers[name] == value
        # an orchestrator's liveness probe names the pod's address
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/_health")).status_code == 200
    async with client(db, clock, access) as c:
        assert (await c.get(path)).status_code == 200, path


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/news/reports", 200),
        ("GET", "/static/style.css", 200),
        ("GET", "/static/missing.css", 404),
        ("GET", "/no/such/page", 404),
        ("GET", "/metrics", 200),
        ("GET", "/runs", 200),
    ],
)
async def test_every_answer_says_nosniff_and_no_store(
    db: Database, clock: FrozenClock, method: str, path: str, status: int
) -> None:
    async with client(db, clock, Access.for_bind("127.0.0.1", None)) as c:
        response = await c.request(method, path)
    assert response.status_code == status, (path, response.text[:200])
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, (path, name)
    assert response.headers["x-frame-options"] == "DENY"


async def test_a_too_large_sign_in_is_a_413_with_the_headers(
    db: Database, clock: FrozenClock
) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        response = await c.post("/login", content=b"token=" + b"x" * 5000)
    assert response.status_code == 413
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value


@pytest.mark.parametrize("path", ["/static/%00", "/static/a%00b.css", "/static/%00/style.css"])
async def test_a_nul_in_a_static_path_is_a_404_not_a_traceback(
    db: Database, clock: FrozenClock, path: str
) -> None:
    with capture_logs() as logs:
        async with client(db, clock, Access.for_bind("127.0.0.1", None)) as c:
            response = await c.get(path)
    assert response.status_code == 404
    assert "Traceback" not in response.text
    assert not [e for e in logs if e["log_level"] in ("error", "critical")]


async def test_a_session_carries_its_issue_time_and_expires(
    db: Database, clock: FrozenClock
) -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    async with client(db, clock, access, "d.example", peer="192.0.2.7", scheme="https") as c:
        right = await _sign_in(c)
        assert right.status_code == 303
        assert _max_age(right.headers["set-cookie"]) == SESSION_MAX_AGE_SECONDS
        issued, _, _ = c.cookies[COOKIE].partition(".")
        assert int(issued) == int(clock.now().timestamp())
        assert (await c.get("/runs")).status_code == 200
        clock.advance(timedelta(seconds=SESSION_MAX_AGE_SECONDS - 60))
        assert (await c.get("/runs")).status_code == 200
        clock.advance(timedelta(seconds=61))
        # a browser would have dropped it; a copied cookie is refused by the server
        stale = await c.get("/runs")
        assert stale.status_code == 303 and stale.headers["location"].startswith("/login")
        assert (await c.get("/news/reports")).status_code == 401


async def test_a_new_token_ends_every_session(db: Database, clock: FrozenClock) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        await _sign_in(c)
        cookie = c.cookies[COOKIE]
    rotated = Access.for_bind("0.0.0.0", "another token, just as long: 0123456789abcdef")
    async with client(db, clock, rotated, "d.example") as c:
        c.cookies.set(COOKIE, cookie)
        assert (await c.get("/runs")).status_code == 303


@pytest.mark.parametrize(
    ("peer", "scheme", "secure"),
    [
        ("127.0.0.1", "http", False),  # the developer on loopback
        ("10.0.0.5", "http", True),  # a TLS front end on another machine
        ("127.0.0.1", "https", True),
        ("192.0.2.7", "https", True),
    ],
)
async def test_the_session_cookie_is_secure_unless_plain_http_from_this_machine(
    db: Database, clock: FrozenClock, peer: str, scheme: str, secure: bool
) -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    async with client(db, clock, access, "d.example", peer=peer, scheme=scheme) as c:
        cookie = (await _sign_in(c)).headers["set-cookie"]
        assert ("; secure" in cookie.lower()) is secure, cookie
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        gone = (await c.post("/logout")).headers["set-cookie"]
        assert ("; secure" in gone.lower()) is secure, gone


@pytest.mark.parametrize("path", ["/logout", "/login"])
async def test_a_cross_site_post_is_refused(db: Database, clock: FrozenClock, path: str) -> None:
    access = Access.for_bind("0.0.0.0", TOKEN)
    async with client(db, clock, access, "d.example:8787") as c:
        assert (await _sign_in(c)).status_code == 303
        for origin in ("https://attacker.example", "null", "http://d.example:9999"):
            refused = await c.post(path, data={"token": TOKEN}, headers={"Origin": origin})
            assert refused.status_code == 403, (path, origin)
            assert "set-cookie" not in refused.headers
        refused = await c.post(path, headers={"Referer": "https://attacker.example/page"})
        assert refused.status_code == 403
        assert (await c.get("/runs")).status_code == 200  # still signed in
        same = await c.post(
            path, data={"token": TOKEN}, headers={"Origin": "http://d.example:8787"}
        )
        assert same.status_code == 303


async def test_a_wrong_token_costs_half_a_second_and_the_right_one_does_not(
    db: Database, clock: FrozenClock
) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        started = time.monotonic()
        assert (await _sign_in(c, "wrong")).status_code == 401
        assert time.monotonic() - started >= FAILED_LOGIN_DELAY_SECONDS * 0.95
        # the address's backoff after one failure is the same half second: already over
        started = time.monotonic()
        assert (await _sign_in(c)).status_code == 303
        assert time.monotonic() - started < FAILED_LOGIN_DELAY_SECONDS


async def test_concurrent_guesses_from_one_address_are_not_checked(
    db: Database, clock: FrozenClock
) -> None:
    async with client(db, clock, Access.for_bind("0.0.0.0", TOKEN), "d.example") as c:
        answers = await asyncio.gather(*(_sign_in(c, f"guess {i}") for i in range(10)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [401] + [429] * 9
    busy = next(a for a in answers if a.status_code == 429)
    assert busy.headers["retry-after"] == "1" and "still being checked" in busy.text


async def test_bearer_guesses_share_the_sign_in_throttle(db: Database, clock: FrozenClock) -> None:
    """/news/reports compares the same token: it must not be the fast door around /login."""
    context = DashboardContext(db=db, clock=clock, access=Access.for_bind("0.0.0.0", TOKEN))
    app = create_app(Metrics(), ServiceParts(dashboard=context))

    async def guess(i: int) -> int:
        # ten networks: one network holds at most 8 places at a time
        transport = httpx.ASGITransport(app=app, client=(f"10.0.{i}.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://d.example") as c:
            bearer = {"Authorization": f"Bearer guess{i}"}
            return (await c.get("/news/reports", headers=bearer)).status_code

    started = time.monotonic()
    statuses = await asyncio.gather(*(guess(i) for i in range(1, 11)))
    took = time.monotonic() - started
    assert statuses == [401] * 10
    assert took >= 10 * FAILED_LOGIN_DELAY_SECONDS * 0.95  # one at a time, whatever the address
    transport = httpx.ASGITransport(app=app, client=("10.9.9.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://d.example") as c:
        # no token at all guesses nothing: refused at once
        started = time.monotonic()
        assert (await c.get("/news/reports")).status_code == 401
        assert time.monotonic() - started < FAILED_LOGIN_DELAY_SECONDS
        ok = await c.get("/news/reports", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


async def test_feed_url_passwords_are_not_shown(db: Database, clock: FrozenClock) -> None:
    await db.execute(
        "INSERT INTO news.sources (name, feed_url, parked_at, last_error) VALUES"
        " ('private feed', 'https://reader:feed-pw-991@feeds.example/rss', %(now)s,"
        "  'fetching https://reader:feed-pw-991@feeds.example/rss failed'),"
        " ('redis-ish', 'https://:other-pw-992@feeds.example/b', %(now)s, NULL)",
        {"now": clock.now()},
    )
    async with client(db, clock, Access.for_bind("127.0.0.1", None)) as c:
        page = (await c.get("/news")).text
    assert "feed-pw-991" not in page and "other-pw-992" not in page
    assert "https://reader:[redacted]@feeds.example/rss" in page
    assert "https://:[redacted]@feeds.example/b" in page
    assert "fetching https://reader:[redacted]@feeds.example/rss failed" in page
