"""Hostile input against every door of `serve`, in-process on a real, migrated and seeded
database: Hypothesis writes the query strings (every page's filters and cursors), the paths,
the Host headers and the sign-in forms. Whatever it sends, no answer is a 500, nothing raises
out of the app, nothing logs an error, every answer carries the security headers, and the
rules the README promises hold (a foreign Host is a 421, a wrong token never signs in).

The database is shared by a test's examples (they read it, or are refused before anything is
written), so its fixture is set up once per test; the examples are few enough to keep each
test within a few seconds. Hypothesis keeps its examples outside the checkout
(tests/support/hygiene.py)."""

from __future__ import annotations

import base64
import ipaddress
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Mount, Route
from structlog.testing import capture_logs

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.lifecycle.reconcile.core import FLAG_NAMES
from nightcrew.metrics import Metrics
from nightcrew.web.access import COOKIE, Access
from nightcrew.web.context import DashboardContext
from nightcrew.web.host_and_headers import SECURITY_HEADERS
from nightcrew.web.pages.base import encode_cursor
from nightcrew.web.pages.runs import RUN_STATUSES
from nightcrew.web.throttle import SignInThrottle
from tests.integration.web import seed
from tests.integration.web.test_dashboard_pages import TOKEN

RECONCILER_SECRET = "fuzz-reconciler-secret-0123456789"
# Shared by every example of a test, so the database fixture is deliberately not per example.
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# What a real server (h11, httptools) lets through to the app in a header value: no CR, LF, NUL.
HEADER_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f")
TEXT = st.text(st.characters(codec="utf-8"), max_size=60)  # no lone surrogates


@dataclass(frozen=True)
class Doors:
    app: Any
    paths: list[str]  # every route's path, parameters filled in by the strategies
    run_ids: list[int]
    access: Access


def _doors(db: Database, clock: FrozenClock, access: Access, run_ids: list[int]) -> Doors:
    # No delay after a wrong token: the throttle's timing has its own tests; here it would
    # only make each sign-in example cost half a second.
    throttle = SignInThrottle(failure_delay=0.0, backoff_max=0.0)
    app = create_app(
        Metrics(),
        ServiceParts(
            reconciler_secret=RECONCILER_SECRET,
            dashboard=DashboardContext(db=db, clock=clock, access=access, throttle=throttle),
            reconcile_throttle=SignInThrottle(failure_delay=0.0, backoff_max=0.0),
        ),
    )
    paths = []
    for route in app.routes:
        if isinstance(route, Route | Mount):
            paths.append(route.path)
    return Doors(app=app, paths=paths, run_ids=run_ids, access=access)


@pytest.fixture
async def seeded(db: Database, clock: FrozenClock) -> list[int]:
    night = await seed.night(db, clock.now())
    return [night.minute_run, night.daily_run, night.failed_run, night.skipped_run]


@pytest.fixture
def open_doors(db: Database, clock: FrozenClock, seeded: list[int]) -> Doors:
    return _doors(db, clock, Access.for_bind("127.0.0.1", None), seeded)


@pytest.fixture
def guarded_doors(db: Database, clock: FrozenClock, seeded: list[int]) -> Doors:
    return _doors(db, clock, Access.for_bind("0.0.0.0", TOKEN), seeded)


# --- strategies ------------------------------------------------------------------------------
OFFSETS = st.sampled_from(
    [UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=14)), timezone(timedelta(0))]
)


def cursors() -> st.SearchStrategy[str]:
    """Cursors as the pages make them (any instant, any key, naive or not), base64 of any
    bytes, and any text."""
    when = st.datetimes(
        min_value=datetime(1, 1, 1),
        max_value=datetime(9999, 12, 31),
        timezones=st.one_of(st.none(), OFFSETS),
    )
    keys = st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.uuids().map(str),
        TEXT,
    )
    raw = st.binary(max_size=64).map(lambda b: base64.urlsafe_b64encode(b).decode().rstrip("="))
    return st.one_of(st.builds(encode_cursor, when, keys), raw, TEXT)


def filter_values(run_ids: list[int]) -> st.SearchStrategy[str]:
    days = st.dates().map(lambda d: d.isoformat())
    return st.one_of(
        st.sampled_from([*RUN_STATUSES, "skipped", "daily", "minute", "news:eu", ""]),
        st.sampled_from(["1969-12-31", "9999-01-01", "2026-02-30", "0001-01-01", "20261129"]),
        days,
        cursors(),
        st.sampled_from(run_ids).map(str),
        st.integers().map(str),
        st.sampled_from(["1e309", "NaN", "-0", "true", "null", "[]", "%00", "\x00", "a" * 5000]),
        TEXT,
    )


KNOWN_KEYS = [
    "lane",
    "status",
    "date",
    "before",
    "next",
    "kind",
    "dead",
    "shard",
    "page",
    "cursor",
    *sorted(FLAG_NAMES),
]


def query_pairs(run_ids: list[int]) -> st.SearchStrategy[list[tuple[str, str]]]:
    key = st.sampled_from(KNOWN_KEYS) | TEXT
    return st.lists(st.tuples(key, filter_values(run_ids)), max_size=6)


# A query string as bytes, not as a client would encode it: stray %, invalid UTF-8, ;&=+.
RAW_QUERIES = st.one_of(
    st.text(string.ascii_letters + string.digits + "%&=;+-_.~!$'()*,/:@?[]", max_size=80),
    st.binary(max_size=40).map(lambda b: "".join(f"%{x:02X}" for x in b)),
)


def path_params(run_ids: list[int]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(run_ids).map(str),
        st.integers().map(str),
        st.sampled_from(["9223372036854775807", "9223372036854775808", "0", "00", "1e3", ".."]),
        TEXT,
    ).map(lambda s: quote(s, safe=""))


def paths(doors: Doors) -> st.SearchStrategy[str]:
    def fill(template: str) -> st.SearchStrategy[str]:
        if template == "/static":  # a Mount: anything below it
            files = st.sampled_from(["style.css", "missing.css", "../pyproject.toml", "%00", ""])
            return st.one_of(files, TEXT.map(lambda s: quote(s, safe="/"))).map(
                lambda t: f"/static/{t}"
            )
        parts = re.split(r"\{[^}]*\}", template)  # the text around each {parameter}
        values = st.lists(
            path_params(doors.run_ids), min_size=len(parts) - 1, max_size=len(parts) - 1
        )
        return values.map(
            lambda filled: "".join(a + b for a, b in zip(parts, [*filled, ""], strict=True))
        )

    return st.sampled_from(doors.paths).flatmap(fill)


def hosts() -> st.SearchStrategy[str]:
    loopback = st.sampled_from(
        ["127.0.0.1:8787", "localhost", "LOCALHOST.", "[::1]:8787", "127.0.0.1", "[::1]"]
    )
    tricky = st.sampled_from(
        [
            "",
            "127.1",
            "0x7f.0.0.1",
            "127.0.0.1.nip.io",
            "attacker.example",
            "[::ffff:127.0.0.1]",
            "127.0.0.1:99999999",
            "127.0.0.1:8787:1",
            "user@127.0.0.1",
            "localhost:",
            "[::1",
            " 127.0.0.1",
            "127.0.0.1\t",
            "xn--lcalhost-8wa",
        ]
    )
    return st.one_of(loopback, tricky, st.text(HEADER_CHARS, max_size=40))


def _port(text: str) -> bool:
    """A port as a browser writes one (five digits at most; nothing else)."""
    return text.isascii() and text.isdigit() and len(text) <= 5


def names_loopback(host: str) -> bool:
    """An oracle written apart from access.py: the name before an optional port is localhost
    (any case, one trailing dot), 127.0.0.1 or ::1 (in brackets), in any spelling Python's
    ipaddress reads (which refuses 127.1, 0x7f.0.0.1 and leading zeros)."""
    name = host
    if name.startswith("["):
        name, bracket, port = name[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and _port(port[1:]))):
            return False
    elif ":" in name:
        name, _, port = name.partition(":")
        if not _port(port):
            return False
    if name.lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(name) in {
            ipaddress.ip_address("127.0.0.1"),
            ipaddress.ip_address("::1"),
        }
    except ValueError:
        return False


# --- checks ----------------------------------------------------------------------------------
def assert_kept(response: httpx.Response, logs: Sequence[Mapping[str, Any]], what: object) -> None:
    assert response.status_code < 500 or response.status_code == 503, (what, response.text[:300])
    assert response.status_code != 503 or "The database could not answer" not in response.text
    for name in SECURITY_HEADERS:
        assert name.lower() in response.headers, (what, name)
    assert response.headers["x-content-type-options"] == "nosniff", what
    assert response.headers["x-frame-options"] == "DENY", what
    assert "Traceback" not in response.text, what
    failed = [e for e in logs if e.get("log_level") in ("error", "critical")]
    assert not failed, (what, failed)


def _client(doors: Doors, host: str, *, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=doors.app, client=(peer, 40000))
    # as bytes: a server hands the app a header's latin-1 bytes; httpx would encode str as ASCII
    return httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1:8787",
        headers=[(b"host", host.encode("latin-1"))],
    )


# --- the tests -------------------------------------------------------------------------------
@given(data=st.data())
@FUZZ
async def test_any_query_string_on_any_page_is_an_answer_not_a_failure(
    open_doors: Doors, data: st.DataObject
) -> None:
    path = data.draw(paths(open_doors), label="path")
    method = data.draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "POST"]), label="method")
    with capture_logs() as logs:
        response = await _request(open_doors, path, method, data)
    assert_kept(response, logs, (method, path, response.request.url.query))
    # a loopback dashboard needs no session: never a detour to a sign-in (but after sign-out)
    if path != "/logout":
        assert response.status_code != 303 or not response.headers["location"].startswith("/login")


async def _request(doors: Doors, path: str, method: str, data: st.DataObject) -> httpx.Response:
    async with _client(doors, "127.0.0.1:8787") as c:
        if data.draw(st.booleans(), label="raw query"):
            raw = data.draw(RAW_QUERIES, label="query")
            url = httpx.URL(path).copy_with(query=raw.encode())
            response = await c.request(method, url)
        else:
            params = data.draw(query_pairs(doors.run_ids), label="query")
            response = await c.request(method, path, params=tuple(params))
    return response


@given(data=st.data())
@FUZZ
async def test_the_pages_filters_and_cursors_are_answered_or_refused_by_name(
    open_doors: Doors, data: st.DataObject
) -> None:
    """The pages that take filters, with their own parameters: a page (200) or a 400 that
    says which parameter it could not use."""
    path = data.draw(st.sampled_from(["/runs", "/deletions"]), label="path")
    names = ["lane", "status", "date", "before"] if path == "/runs" else ["before"]
    params = data.draw(
        st.dictionaries(st.sampled_from(names), filter_values(open_doors.run_ids), max_size=4),
        label="params",
    )
    with capture_logs() as logs:
        async with _client(open_doors, "127.0.0.1:8787") as c:
            response = await c.get(path, params=params)
    assert_kept(response, logs, (path, params))
    assert response.status_code in (200, 400), (path, params, response.text[:300])
    if response.status_code == 400:
        named = [n for n in names if f"{n}:" in response.text]
        assert named and set(named) <= {n for n, v in params.items() if v}, (params, named)


@given(host=hosts(), path=st.sampled_from(["/", "/runs", "/ready", "/metrics", "/login"]))
@FUZZ
async def test_any_host_header_is_refused_unless_it_names_loopback(
    open_doors: Doors, host: str, path: str
) -> None:
    with capture_logs() as logs:
        async with _client(open_doors, host) as c:
            response = await c.get(path)
            liveness = await c.get("/health")
    assert_kept(response, logs, (host, path))
    assert_kept(liveness, logs, (host, "/health"))
    assert liveness.status_code == 200
    if names_loopback(host):
        assert response.status_code == 200, (host, path, response.text[:200])
    else:
        assert response.status_code == 421, (host, path)


CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded; charset=latin-1",
            "multipart/form-data; boundary=x",
            "multipart/form-data",
            "application/json",
            "text/plain",
            "",
        ]
    ),
    st.text(HEADER_CHARS, max_size=60),
)


def bodies() -> st.SearchStrategy[bytes]:
    form = st.lists(
        st.tuples(st.sampled_from(["token", "next", "csrf"]) | TEXT, TEXT | st.just(TOKEN)),
        max_size=6,
    ).map(lambda pairs: "&".join(f"{quote(k)}={quote(v)}" for k, v in pairs).encode())
    return st.one_of(
        form,
        st.binary(max_size=512),
        st.binary(min_size=4000, max_size=6000),
        st.just(b"token=" + TOKEN.encode() + b"&" * 10),
        st.just(b"--x\r\nContent-Disposition: form-data; name=token\r\n\r\n" + TOKEN.encode()),
    )


@given(
    path=st.sampled_from(["/login", "/logout"]),
    body=bodies(),
    content_type=CONTENT_TYPES,
    origin=st.none() | st.sampled_from(["http://d.example", "https://evil.example", "null"]),
    peer=st.sampled_from(["192.0.2.7", "2001:db8::7", "127.0.0.1"]),
)
@FUZZ
async def test_any_sign_in_form_is_answered_and_only_the_token_signs_in(
    guarded_doors: Doors,
    path: str,
    body: bytes,
    content_type: str,
    origin: str | None,
    peer: str,
) -> None:
    headers = [(b"content-type", content_type.encode("latin-1"))]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    with capture_logs() as logs:
        async with _client(guarded_doors, "d.example", peer=peer) as c:
            response = await c.post(path, content=body, headers=headers)
    assert_kept(response, logs, (path, body[:80], content_type, origin))
    assert response.status_code in (303, 400, 401, 403, 413, 429), response.status_code
    if origin not in (None, "http://d.example"):
        assert response.status_code == 403
    signed_in = f"{COOKIE}=" in response.headers.get("set-cookie", "") and (
        "max-age=0" not in response.headers.get("set-cookie", "").lower()
    )
    if path == "/login" and signed_in:
        # the form sign-in reads the first `token` of a urlencoded body, nothing else
        assert b"token=" + quote(TOKEN).encode() in body or b"token=" + TOKEN.encode() in body
    if path == "/login" and response.status_code == 303:
        assert signed_in


@given(params=st.lists(st.tuples(st.sampled_from(sorted(FLAG_NAMES)) | TEXT, TEXT), max_size=5))
@settings(max_examples=60, deadline=None)
async def test_reconcile_flags_are_parsed_or_refused_by_name(
    params: list[tuple[str, str]],
) -> None:
    """With the right secret (without it nothing is parsed): any flags are a 400 naming the
    one it could not use, or the reconciler's answer (here: not available, 503)."""
    app = create_app(
        Metrics(),
        ServiceParts(
            reconciler_secret=RECONCILER_SECRET,
            reconcile_throttle=SignInThrottle(failure_delay=0.0, backoff_max=0.0),
        ),
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        authorized = await c.post(
            "/reconcile",
            params=tuple(params),
            headers={"authorization": f"Bearer {RECONCILER_SECRET}"},
        )
        unauthorized = await c.post("/reconcile", params=tuple(params))
    assert unauthorized.status_code == 401
    assert authorized.status_code in (400, 503), authorized.text
    if authorized.status_code == 400:
        assert authorized.json()["error"]
    else:
        assert authorized.json() == {"error": "the reconciler is not available here"}
