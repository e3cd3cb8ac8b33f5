"""The feed-cache client against a real loopback server."""

from __future__ import annotations

import httpx
import pytest

from nightcrew.adapters.feedcache import HttpFeedCache
from tests.support.servers import RecordingServer, free_port


async def test_wait_lane_posts_the_id_with_the_secret(feed_server: RecordingServer) -> None:
    async with httpx.AsyncClient() as http:
        result = await HttpFeedCache(http, feed_server.url + "/", "sekret").invalidate(
            "p-1", wait=True
        )
    assert result.ok and result.status == 200
    [call] = feed_server.requests
    assert (call.method, call.path, call.query) == ("POST", "/_internal/invalidate", {"wait": "1"})
    assert call.headers["Authorization"] == "Bearer sekret" and call.json() == {"id": "p-1"}


@pytest.mark.parametrize("status", [301, 401, 404, 500, 503])
async def test_only_a_2xx_confirms(feed_server: RecordingServer, status: int) -> None:
    feed_server.status = status
    async with httpx.AsyncClient() as http:
        result = await HttpFeedCache(http, feed_server.url, "s").invalidate("p")
    assert not result.ok and result.status == status and str(status) in (result.error or "")


async def test_unreachable_and_unconfigured_are_failures_not_exceptions() -> None:
    async with httpx.AsyncClient() as http:
        down = await HttpFeedCache(http, f"http://127.0.0.1:{free_port()}", "s").invalidate("p")
        unset = await HttpFeedCache(http, None, None).invalidate("p")
    assert not down.ok and down.status is None and "ConnectError" in (down.error or "")
    assert not unset.ok and "not configured" in (unset.error or "")
