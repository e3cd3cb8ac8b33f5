from __future__ import annotations

import httpx
import pytest

from nightcrew.http import create_app


@pytest.mark.parametrize("path", ["/health", "/_health"])
async def test_health(path: str) -> None:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        response = await client.get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "lifecycle-manager"}


async def test_unknown_path_and_wrong_method() -> None:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://nightcrew") as client:
        assert (await client.get("/nope")).status_code == 404
        assert (await client.post("/health")).status_code == 405
