"""The dashboard with its database gone for real (a TCP proxy cut or gone silent): a page
says so within the connection policy's bound — a 503 naming the loss, not a hang or a
traceback — and pages are served again within that bound once the database is back."""

from __future__ import annotations

import asyncio
import time

import httpx

from nightcrew.clock import FrozenClock
from nightcrew.db.database import Database
from nightcrew.http import ServiceParts, create_app
from nightcrew.metrics import Metrics
from nightcrew.web.access import Access
from nightcrew.web.context import DashboardContext
from tests.faults.test_database_faults import pdb, proxy  # noqa: F401 - fixtures
from tests.integration.web import seed
from tests.support.proxy import TcpProxy


def _client(db: Database, clock: FrozenClock) -> httpx.AsyncClient:
    context = DashboardContext(db=db, clock=clock, access=Access.for_bind("127.0.0.1", None))
    app = create_app(Metrics(), ServiceParts(dashboard=context))
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8787"
    )


async def test_pages_say_the_database_is_gone_then_recover(
    pdb: Database,  # noqa: F811
    proxy: TcpProxy,  # noqa: F811
    clock: FrozenClock,
) -> None:
    night = await seed.night(pdb, clock.now())
    async with _client(pdb, clock) as client:
        assert (await client.get("/runs")).status_code == 200

        await proxy.cut()
        for path in ("/", "/runs", f"/runs/{night.daily_run}", "/effects"):
            started = time.monotonic()
            response = await client.get(path)
            assert response.status_code == 503, path
            assert "PostgreSQL" in response.text, path
            assert time.monotonic() - started < 15, path

        await proxy.restore()
        proxy.blackhole()  # connections accepted, nothing answered
        started = time.monotonic()
        response = await client.get("/runs")
        assert response.status_code == 503
        assert time.monotonic() - started < 30

        await proxy.restore()
        # The pool drops what the outage killed (a connection held by the silent proxy is found
        # dead by the policy's TCP bounds, ~2 s here) and reconnects: pages come back within the
        # bound, without a restart.
        back_by = time.monotonic() + 20
        while (response := await client.get("/runs")).status_code != 200:
            assert time.monotonic() < back_by, response.text[-300:]
            await asyncio.sleep(0.5)
        assert response.status_code == 200
        assert f'href="/runs/{night.daily_run}"' in response.text
