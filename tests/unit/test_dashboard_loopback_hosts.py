"""The exact set of Host names a loopback-bound dashboard answers, for each loopback bind.

Open on loopback, the dashboard's only guard against DNS rebinding is its Host list: a page
elsewhere that points its own name at 127.0.0.1 sends that name, and is refused. Any entry too
many — ``0.0.0.0`` most of all, which browsers reach as this machine — opens that door, so the
set is pinned whole (letting ``0.0.0.0`` into it went unseen), by ``Access.for_bind``
and by a request through ``serve``'s app (``create_app``, its ``Doors``), with no server and no
database: a refused Host is answered 421 before anything reads one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import httpx
import pytest

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.metrics import Metrics
from nightcrew.web.access import LOOPBACK_HOSTS, Access
from nightcrew.web.context import DashboardContext

TOKEN = "t" * 32
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}

# serve --host BIND → every Host name (normalised) it answers to, and nothing else
ACCEPTED = {
    "127.0.0.1": LOOPBACK_NAMES,
    "::1": LOOPBACK_NAMES,
    "[::1]": LOOPBACK_NAMES,
    "0:0:0:0:0:0:0:1": LOOPBACK_NAMES,
    "localhost": LOOPBACK_NAMES,
    "LocalHost.": LOOPBACK_NAMES,
    "127.0.0.2": {*LOOPBACK_NAMES, "127.0.0.2"},  # its own address, besides the names
    "127.1.2.3": {*LOOPBACK_NAMES, "127.1.2.3"},
}

# Host headers no loopback bind answers (ports as a browser sends them)
REFUSED = [
    "0.0.0.0",
    "0.0.0.0:8787",
    "0.0.0.0.:8787",
    "[::]:8787",
    "[::]",
    "[0:0:0:0:0:0:0:0]:8787",
    "0:8787",  # what some resolvers read as 0.0.0.0
    "evil.example:8787",
    "localhost.evil.example:8787",
    "127.0.0.1.nip.io:8787",
    "2130706433:8787",  # 127.0.0.1 as a number
    "0x7f000001:8787",
    "127.0.0.3:8787",  # loopback, but neither a loopback name nor the bound address
    "",
]


def test_the_loopback_names_are_these_three() -> None:
    assert LOOPBACK_HOSTS == frozenset(LOOPBACK_NAMES)


@pytest.mark.parametrize("bind", ACCEPTED)
@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_loopback_bind_accepts_exactly_its_host_names(bind: str, token: str | None) -> None:
    access = Access.for_bind(bind, token)
    assert access.hosts == frozenset(ACCEPTED[bind])
    assert access.token == token
    for name in ACCEPTED[bind]:
        spelled = f"[{name}]" if ":" in name else name
        assert access.host_allowed(spelled) and access.host_allowed(f"{spelled}:8787"), name


@pytest.mark.parametrize("bind", ACCEPTED)
@pytest.mark.parametrize("host", REFUSED)
def test_a_loopback_bind_refuses_every_other_host(bind: str, host: str) -> None:
    assert not Access.for_bind(bind, None).host_allowed(host)


def _app(access: Access) -> httpx.AsyncClient:
    # nothing on the way to a 421 (or to /openapi.json) reads the database
    clock = FrozenClock(datetime(2026, 11, 29, 4, 0, tzinfo=UTC))
    context = DashboardContext(db=cast(Database, None), clock=clock, access=access)
    app = create_app(Metrics(), ServiceParts(dashboard=context))
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8787")


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1", "localhost"])
async def test_serves_app_answers_the_accepted_hosts_and_421s_the_rest(bind: str) -> None:
    async with _app(Access.for_bind(bind, None)) as c:
        for name in ACCEPTED[bind]:
            host = f"[{name}]:8787" if ":" in name else f"{name}:8787"
            answer = await c.get("/openapi.json", headers={"Host": host})
            assert answer.status_code == 200, host
        for host in REFUSED:
            for path in ("/openapi.json", "/runs", "/login"):
                answer = await c.get(path, headers={"Host": host})
                assert answer.status_code == 421, (host, path)
