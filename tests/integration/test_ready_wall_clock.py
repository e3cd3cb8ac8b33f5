"""/ready's and /metrics' bound on a database ping, on the wall clock: out of the unit tier."""

from __future__ import annotations

import asyncio
import time

import pytest

from nightcrew import http as nightcrew_http
from nightcrew.metrics import Metrics
from tests.unit.test_ready import _app, _gauge, _hangs


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


async def test_a_hanging_ping_bounds_metrics_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nightcrew_http, "DB_CHECK_TIMEOUT_SECONDS", 0.2)
    metrics = Metrics()
    metrics.set("nightcrew_db_up", 1.0)  # up at the last check
    async with _app(metrics, _hangs) as client:
        started = time.monotonic()
        scraped = await asyncio.wait_for(client.get("/metrics"), timeout=5)
        ready = await asyncio.wait_for(client.get("/ready"), timeout=5)
        took = time.monotonic() - started
    assert scraped.status_code == 200 and _gauge(scraped.text, "nightcrew_db_up") == "0"
    assert ready.status_code == 503
    assert ready.json()["problems"] == ["database: PostgreSQL did not answer within 0.2 s"]
    assert took < 2.0
