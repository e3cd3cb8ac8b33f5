"""The news tests' HTTP client: the worker's own (the address policy, pinned connections) with
the test servers' address allowed, over a network backend that opens loopback connections only
and records every connection it was asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nightcrew.adapters.addresses import AddressPolicy, PolicyHttp, new_client
from tests.support.network import LoopbackOnlyBackend

# The test servers' address is the one private address these tests may fetch.
LOOPBACK = AddressPolicy.parse("127.0.0.1")


@pytest.fixture
def network() -> LoopbackOnlyBackend:
    return LoopbackOnlyBackend()


@pytest.fixture
async def http(network: LoopbackOnlyBackend) -> AsyncIterator[PolicyHttp]:
    async with new_client(LOOPBACK, inner=network) as client:
        yield client
