from __future__ import annotations

import httpx
import pytest

from nightcrew.http import create_app
from nightcrew.metrics import Metrics


@pytest.mark.parametrize("path", ["/health", "/_health"])
async def test_health(path: str) -> None:
    transport = httpx.ASGITransport(app=create_app(Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        response = await client.get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "lifecycle-manager"}


async def test_unknown_path_and_wrong_method() -> None:
    transport = httpx.ASGITransport(app=create_app(Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        assert (await client.get("/nope")).status_code == 404
        assert (await client.post("/health")).status_code == 405


async def test_metrics_in_prometheus_text_format() -> None:
    metrics = Metrics()
    metrics.inc("nightcrew_lane_runs_total", lane="minute", status="completed")
    metrics.inc("nightcrew_job_items_total", 3, lane="minute", count="items_requeued")
    metrics.set("nightcrew_lane_run_duration_seconds", 0.25, lane="minute")
    transport = httpx.ASGITransport(app=create_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    body = response.text
    assert "# TYPE nightcrew_lane_runs_total counter" in body
    assert 'nightcrew_lane_runs_total{lane="minute",status="completed"} 1' in body
    assert 'nightcrew_job_items_total{count="items_requeued",lane="minute"} 3' in body
    assert 'nightcrew_lane_run_duration_seconds{lane="minute"} 0.25' in body
