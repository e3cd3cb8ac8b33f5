"""A network backend for the news client in tests: real connections to loopback only.

Every connection the client is asked to open is recorded; one to an address outside
127.0.0.0/8 and ::1 is refused here, before any packet leaves — so a test of the address
policy stays on loopback even when the code under test is wrong.
"""

from __future__ import annotations

import ipaddress
import typing

import httpcore


class LoopbackOnlyBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        self._real = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False  # a name: the pinned backend should have resolved it already
        if not loopback:
            self.refused.append((host, port))
            raise httpcore.ConnectError(f"test network: {host} is not loopback")
        self.opened.append((host, port))
        return await self._real.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("test network: no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._real.sleep(seconds)
