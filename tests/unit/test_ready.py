"""GET /ready and the readiness gauges of GET /metrics, on create_app with stand-in checks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from structlog.testing import capture_logs

from nightcrew import http as nightcrew_http
from nightcrew.db.database import QueryError
from nightcrew.errors import DatabaseUnavailableError
from nightcrew.http import SCHEDULER_STALE_SECONDS, Readiness, ServiceParts, create_app
from nightcrew.metrics import Metrics

T0 = 1_795_924_800.0  # 2026-11-29T04:00:00Z


async def _ok() -> None:
    return None


async def _refused() -> None:
    raise DatabaseUnavailableError("lost PostgreSQL at 127.0.0.1:5432/app: connection refused")


async def _hangs() -> None:
    await asyncio.Event().wait()


def _app(
    metrics: Metrics,
    ping: Callable[[], Awaitable[None]] = _ok,
    *,
    started_at: float = T0,
    now: float = T0 + 5,
) -> httpx.AsyncClient:
    readiness = Readiness(ping_database=ping, started_at=started_at, now=lambda: now)
    transport = httpx.ASGITransport(app=create_app(metrics, ServiceParts(readiness=readiness)))
    return httpx.AsyncClient(transport=transport, base_url="http://nightcrew")


def _gauge(body: str, name: str) -> str | None:
    for line in body.splitlines():
        if line.startswith(f"{name} "):
            return line.split(" ", 1)[1]
    return None


async def test_all_fine_is_200_and_db_up_1() -> None:
    metrics = Metrics()
    metrics.set("nightcrew_scheduler_last_tick_timestamp_seconds", T0 + 300)
    async with _app(metrics, now=T0 + 310) as client:
        ready = await client.get("/ready")
        scraped = await client.get("/metrics")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert scraped.status_code == 200
    assert _gauge(scraped.text, "nightcrew_db_up") == "1"
    assert _gauge(scraped.text, "nightcrew_scheduler_last_tick_timestamp_seconds") == str(
        int(T0 + 300)
    )


async def test_without_readiness_checks_ready_is_200() -> None:
    transport = httpx.ASGITransport(app=create_app(Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        response = await client.get("/ready")
    assert response.status_code == 200 and response.json() == {"status": "ready"}


@pytest.mark.parametrize(
    ("ping_error", "message", "logged"),
    [
        (
            DatabaseUnavailableError("lost PostgreSQL at 127.0.0.1:5432/app: connection refused"),
            "PostgreSQL is unreachable",
            "DatabaseUnavailableError: lost PostgreSQL at 127.0.0.1:5432/app: connection refused",
        ),
        (
            QueryError("permission denied", sqlstate="42501"),
            "PostgreSQL refused the check (QueryError)",
            "QueryError: permission denied",
        ),
    ],
)
async def test_a_failing_database_ping_is_503_naming_the_database_and_db_up_0(
    ping_error: Exception, message: str, logged: str
) -> None:
    async def ping() -> None:
        raise ping_error

    metrics = Metrics()
    with capture_logs() as logs:
        async with _app(metrics, ping) as client:
            ready = await client.get("/ready")
            await client.get("/ready")  # the same cause again: logged once
            scraped = await client.get("/metrics")
    assert ready.status_code == 503
    # a probe's answer names the problem, never where the database is (its host and port)
    assert ready.json() == {"status": "not ready", "problems": [f"database: {message}"]}
    assert "127.0.0.1" not in ready.text and "5432" not in ready.text
    # the operator's log has the details
    assert [e["error"] for e in logs if e["event"] == "ready_database_down"] == [logged]
    assert scraped.status_code == 200  # /metrics still answers: db_up says what is wrong
    assert _gauge(scraped.text, "nightcrew_db_up") == "0"


async def test_db_up_follows_the_database_back_up() -> None:
    state = {"up": False}

    async def ping() -> None:
        if not state["up"]:
            await _refused()

    metrics = Metrics()
    async with _app(metrics, ping) as client:
        assert (await client.get("/ready")).status_code == 503
        assert metrics.value("nightcrew_db_up") == 0.0
        state["up"] = True
        assert (await client.get("/ready")).status_code == 200
        assert metrics.value("nightcrew_db_up") == 1.0
        state["up"] = False
        assert _gauge((await client.get("/metrics")).text, "nightcrew_db_up") == "0"


@pytest.mark.parametrize(
    ("tick_age", "ready"),
    [(SCHEDULER_STALE_SECONDS - 1, True), (SCHEDULER_STALE_SECONDS, True), (181.0, False)],
)
async def test_a_stale_scheduler_tick_is_503_naming_the_scheduler(
    tick_age: float, ready: bool
) -> None:
    now = T0 + 3600
    metrics = Metrics()
    metrics.set("nightcrew_scheduler_last_tick_timestamp_seconds", now - tick_age)
    async with _app(metrics, started_at=T0, now=now) as client:
        response = await client.get("/ready")
    if ready:
        assert response.status_code == 200 and response.json() == {"status": "ready"}
    else:
        assert response.status_code == 503
        assert response.json() == {
            "status": "not ready",
            "problems": ["scheduler: no slot fired for 181 s"],
        }
    assert metrics.value("nightcrew_db_up") == 1.0  # the database is fine either way


@pytest.mark.parametrize(("since_start", "ready"), [(10.0, True), (180.0, True), (240.0, False)])
async def test_before_a_first_tick_the_start_time_counts_as_one(
    since_start: float, ready: bool
) -> None:
    metrics = Metrics()  # no tick yet: the gauge reads 0
    async with _app(metrics, started_at=T0, now=T0 + since_start) as client:
        response = await client.get("/ready")
    assert response.status_code == (200 if ready else 503)
    if not ready:
        assert response.json()["problems"] == ["scheduler: no slot fired for 240 s"]


async def test_both_problems_are_listed_database_first() -> None:
    metrics = Metrics()
    metrics.set("nightcrew_scheduler_last_tick_timestamp_seconds", T0)
    async with _app(metrics, _refused, started_at=T0 - 60, now=T0 + 600) as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    problems = response.json()["problems"]
    assert [p.split(":", 1)[0] for p in problems] == ["database", "scheduler"]
    assert problems[0] == "database: PostgreSQL is unreachable"
    assert problems[1] == "scheduler: no slot fired for 600 s"


async def test_a_flood_of_probes_costs_one_ping_at_a_time_and_none_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 /ready at once against a ping that outlasts the bound: each answers 503, the
    database sees one ping, and that ping is not cancelled when every caller gives up (a
    cancelled pool wait can lose its connection: ``Database._checkout``)."""
    monkeypatch.setattr(nightcrew_http, "DB_CHECK_TIMEOUT_SECONDS", 0.2)
    pings: list[str] = []
    release, finished = asyncio.Event(), asyncio.Event()

    async def slow_ping() -> None:
        pings.append("started")
        await release.wait()  # until every probe has given up on it
        pings.append("finished")
        finished.set()

    metrics = Metrics()
    async with _app(metrics, slow_ping) as client:
        answers = await asyncio.wait_for(
            asyncio.gather(*(client.get("/ready") for _ in range(300))), timeout=30
        )
        assert {a.status_code for a in answers} == {503}
        assert pings == ["started"]
        release.set()
        await asyncio.wait_for(finished.wait(), timeout=5)  # the one ping ends on its own
        assert pings == ["started", "finished"]
        # the next probe pings again
        release.clear()
        assert (await client.get("/ready")).status_code == 503
        assert pings == ["started", "finished", "started"]
        release.set()
