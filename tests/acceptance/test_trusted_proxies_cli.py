"""`nightcrew serve` and NIGHTCREW_TRUSTED_PROXIES, over real loopback connections: forwarded
headers decide the sign-in throttle's client address and the cookie's `Secure` only when they
come from a named proxy. Loopback source addresses (127.0.0.x) stand in for the proxy, for a
client that reaches serve directly, and for a developer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.acceptance.test_cli import _env, run
from tests.acceptance.test_dashboard_cli import TOKEN, serving
from tests.support.servers import free_port

pytestmark = pytest.mark.acceptance


async def _sign_in(base: str, source: str, token: str = "not it", **headers: str) -> httpx.Response:
    """One sign-in over a connection from ``source`` (a loopback address of this machine)."""
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=60) as c:
        return await c.post("/login", data={"token": token, "next": "/"}, headers=headers)


async def _two_at_once(base: str, source: str, forwarded: tuple[str, str]) -> list[int]:
    """Two wrong sign-ins sent together from ``source``, each claiming its own forwarded
    client. The throttle checks one attempt per address at a time: the same key → 401 and
    429 (the second not checked), two keys → 401 and 401."""
    answers = await asyncio.gather(
        *(_sign_in(base, source, **{"X-Forwarded-For": client}) for client in forwarded)
    )
    return sorted(a.status_code for a in answers)


def _secure(response: httpx.Response) -> bool:
    assert response.status_code == 303, response.text[:300]
    attributes = [a.strip().lower() for a in response.headers["set-cookie"].split(";")]
    return "secure" in attributes


async def test_without_the_setting_no_forwarded_header_is_believed(fresh_db_url: str) -> None:
    with serving(fresh_db_url, NIGHTCREW_DASHBOARD_TOKEN=TOKEN) as served:
        # uvicorn on its own would believe these from 127.0.0.1
        pair = ("198.51.100.1", "198.51.100.2")
        assert await _two_at_once(served.base, "127.0.0.1", pair) == [401, 429]
        developer = await _sign_in(served.base, "127.0.0.3", TOKEN)
        claimed = await _sign_in(
            served.base,
            "127.0.0.4",
            TOKEN,
            **{"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"},
        )
        assert not _secure(developer) and not _secure(claimed)
    assert served.refused_clients() == ["127.0.0.1"]


async def test_a_named_proxy_is_believed_and_no_one_else(fresh_db_url: str) -> None:
    with serving(
        fresh_db_url, NIGHTCREW_DASHBOARD_TOKEN=TOKEN, NIGHTCREW_TRUSTED_PROXIES="127.0.0.1"
    ) as served:
        base = served.base
        # two clients behind the proxy are throttled each on its own address
        assert await _two_at_once(base, "127.0.0.1", ("198.51.100.1", "198.51.100.2")) == [
            401,
            401,
        ]
        # the proxy appends what it saw; a client's own earlier entries change nothing
        spoofed = ("192.0.2.66, 198.51.100.3", "192.0.2.67, 198.51.100.3")
        assert await _two_at_once(base, "127.0.0.1", spoofed) == [401, 429]
        # a peer that is not the proxy is keyed on its own address, whatever it claims
        direct = ("198.51.100.4", "198.51.100.5")
        assert await _two_at_once(base, "127.0.0.2", direct) == [401, 429]

        plain = await _sign_in(base, "127.0.0.1", TOKEN)
        through_tls = await _sign_in(base, "127.0.0.1", TOKEN, **{"X-Forwarded-Proto": "https"})
        forwarded = await _sign_in(base, "127.0.0.1", TOKEN, **{"X-Forwarded-For": "192.0.2.9"})
        not_the_proxy = await _sign_in(
            base,
            "127.0.0.5",
            TOKEN,
            **{"X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.9"},
        )
        assert not _secure(plain)
        assert _secure(through_tls)
        assert _secure(forwarded)  # a client on another machine, behind the proxy
        assert not _secure(not_the_proxy)
    assert sorted(map(str, served.refused_clients())) == [
        "127.0.0.2",
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
    ]


def test_a_proxy_named_by_host_name_stops_serve_at_start(fresh_db_url: str) -> None:
    result = run(
        "serve",
        "--port",
        str(free_port()),
        env=_env(DATABASE_URL=fresh_db_url, NIGHTCREW_TRUSTED_PROXIES="127.0.0.1,proxy.lan"),
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NIGHTCREW_TRUSTED_PROXIES" in lines[0] and "'proxy.lan'" in lines[0]
