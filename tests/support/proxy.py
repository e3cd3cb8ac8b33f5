"""A TCP proxy on 127.0.0.1 that a test can cut, blackhole and restore: a broker or a database
going away for real (connections reset, new ones refused), or going silent (connections held
open, nothing answered), then coming back on the same address."""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.servers import free_port


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.accepted = 0  # client connections accepted so far
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Stop listening and reset every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in self._open:
            writer.close()
        self._open.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def blackhole(self) -> None:
        """Go silent: keep accepting and holding connections, forward no byte either way.

        Nothing is closed and nothing is answered. What a client sends is held here (the
        kernel still acknowledges it, as it would for a frozen server) and is forwarded
        only if ``restore()`` comes first.
        """
        self._flowing.clear()

    async def restore(self) -> None:
        """Forward again after ``blackhole()``; listen again (same port) after ``cut()``."""
        self._flowing.set()
        if self._server is None:
            await self.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_writer}
        for task in (
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                await self._flowing.wait()  # read while flowing, blackholed since: hold it
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        writer.close()
