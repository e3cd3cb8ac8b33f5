"""/ready's default bound on a database ping, on the wall clock (2 s): out of the unit tier."""

from __future__ import annotations

import asyncio
import time

from nightcrew import http as nightcrew_http
from nightcrew.metrics import Metrics
from tests.unit.test_ready import _app, _hangs


async def test_a_hanging_ping_is_503_after_the_default_2_s() -> None:
    assert nightcrew_http.DB_CHECK_TIMEOUT_SECONDS == 2.0
    metrics = Metrics()
    async with _app(metrics, _hangs) as client:
        started = time.monotonic()
        ready = await asyncio.wait_for(client.get("/ready"), timeout=10)
        took = time.monotonic() - started
    assert ready.status_code == 503
    assert ready.json() == {
        "status": "not ready",
        "problems": ["database: PostgreSQL did not answer within 2 s"],
    }
    assert 1.9 <= took < 4.0
    assert metrics.value("nightcrew_db_up") == 0.0
