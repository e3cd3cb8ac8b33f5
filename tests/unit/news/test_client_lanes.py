"""The untrusted-address client spreads its requests over several pools (lanes): httpcore's
pool bookkeeping grows with connections times waiting requests, so one pool under many fetches at
once spent most of each request on it (adapters/addresses.py, PolicyHttp)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from nightcrew.adapters.addresses import (
    CLIENT_LANES,
    DEFAULT_LIMITS,
    FetchLimits,
    PolicyHttp,
    _lane_limits,
)
from nightcrew.errors import FetchError

LIMITS = FetchLimits(max_bytes=1024, read_seconds=5, connect_seconds=5)


def _lane(served: list[int], lane: int, release: asyncio.Event) -> httpx.AsyncClient:
    async def answer(request: httpx.Request) -> httpx.Response:
        served.append(lane)
        await release.wait()
        if request.url.path == "/broken":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, stream=httpx.ByteStream(f"lane {lane}".encode()))

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_requests_in_flight_are_spread_evenly_over_the_lanes() -> None:
    served: list[int] = []
    release = asyncio.Event()
    async with PolicyHttp([_lane(served, n, release) for n in range(3)]) as http:
        gets = [
            asyncio.create_task(http.get(f"http://feeds.example/{n}", limits=LIMITS))
            for n in range(6)
        ]
        for _ in range(100):  # each get reaches its transport within a few loop turns
            if len(served) == 6:
                break
            await asyncio.sleep(0)
        assert sorted(served) == [0, 0, 1, 1, 2, 2]
        release.set()
        bodies = sorted([(await g).body for g in gets])
    assert bodies == [b"lane 0", b"lane 0", b"lane 1", b"lane 1", b"lane 2", b"lane 2"]


async def test_a_failed_request_gives_its_lane_back() -> None:
    served: list[int] = []
    release = asyncio.Event()
    release.set()
    async with PolicyHttp([_lane(served, n, release) for n in range(2)]) as http:
        for _ in range(3):  # each failure frees lane 0 again: a leak would move on to lane 1
            with pytest.raises(FetchError):
                await http.get("http://feeds.example/broken", limits=LIMITS)
        await http.get("http://feeds.example/ok", limits=LIMITS)
    assert served == [0, 0, 0, 0]


def test_a_client_needs_a_lane() -> None:
    with pytest.raises(ValueError, match="at least one client"):
        PolicyHttp([])


class _CloseFails(httpx.AsyncClient):
    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)  # type: ignore[arg-type]
        raise RuntimeError("close failed")


async def test_a_lane_that_fails_to_close_does_not_keep_the_others_open() -> None:
    failing, other = _CloseFails(), httpx.AsyncClient()
    with pytest.raises(RuntimeError, match="close failed"):
        async with PolicyHttp([failing, other]):
            pass
    assert failing.is_closed and other.is_closed


def test_the_lanes_share_the_connection_limits_exactly() -> None:
    shares = [_lane_limits(lane, CLIENT_LANES) for lane in range(CLIENT_LANES)]
    assert sum(s.max_connections or 0 for s in shares) == DEFAULT_LIMITS.max_connections
    assert (
        sum(s.max_keepalive_connections or 0 for s in shares)
        == DEFAULT_LIMITS.max_keepalive_connections
    )
