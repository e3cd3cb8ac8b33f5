"""The HTTP server's connections: none may be held by a client that never finishes a request.

uvicorn bounds a connection only between requests (its keep-alive timer starts after a first
response) and has no read timeout: a client that opens a connection and sends half a request,
or a body that never ends, holds a descriptor for ever. 500 of them under a 256-descriptor
limit left ``/health`` unanswered for 40 s, and every failed ``accept()`` logged a traceback
(89 MB of stderr in a minute). So, in uvicorn's own h11 protocol:

- a **read deadline**: a request must arrive whole — headers and body — within
  ``read_timeout`` of its first byte (of the connection, for the first request); else the
  connection is closed. Between requests uvicorn's keep-alive timeout applies as before; a
  client that stops reading the answer (64 KiB left unsent) gets the same time to read on.
  A closed slow connection is aborted: closing would wait to flush, descriptor held.
- a **bound on connections**: at ``max_connections`` a new connection closes the oldest one
  still waiting for its request to arrive (the slowest client goes, not the next probe); only
  when every connection is busy with a request being answered is the new one refused. The
  bound (and the listen backlog, asyncio's accept burst) is kept under the process's
  descriptor limit, so ``accept()`` does not run out.
- **accept errors logged once a minute**, with how many there were, not a traceback apiece.

Each closed connection is counted and logged once per interval (``http_slow_clients_closed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from nightcrew.log import warning

# Descriptors kept for everything but client connections: the database pool, the store's
# and the HTTP clients' sockets, the parser processes' pipes, log files.
RESERVED_DESCRIPTORS = 64
# The listen queue, and how many connections asyncio accepts at once before any of them
# reaches the protocol (its accept loop takes up to ``backlog`` per wake-up): a burst opens
# that many descriptors before the bound is checked, and an evicted connection's descriptor
# is closed a loop turn later. uvicorn's default of 2048 let 500 connections in at once under
# a 256 limit; a queue of 32 made clients wait for SYN retries (500 connects took 11 s).
BACKLOG = 128
LOG_INTERVAL_SECONDS = 60.0
# serve's keep-alive timeout (uvicorn's default): an answered connection idles this long before
# its close
KEEP_ALIVE_GRACE = 5


def connection_bound(configured: int) -> int:
    """``configured``, or fewer when the descriptor limit would run out first: half of what
    the reserve leaves, the other half for the accept bursts above the bound."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(16, min(configured, (soft - RESERVED_DESCRIPTORS) // 2))


class _Tally:
    """Counts an occurrence and says so at most once per interval, with the count since."""

    def __init__(self, event: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._event = event
        self._clock = clock
        self._since = 0
        self._last = float("-inf")

    def add(self, **fields: Any) -> None:
        self._since += 1
        now = self._clock()
        if now - self._last >= LOG_INTERVAL_SECONDS:
            warning(self._event, count=self._since, interval_seconds=LOG_INTERVAL_SECONDS, **fields)
            self._since = 0
            self._last = now


class ServerGuards:
    """What every connection of one server shares: its bounds and its tallies."""

    def __init__(self, *, read_timeout: float, max_connections: int) -> None:
        self.read_timeout = read_timeout
        self.max_connections = connection_bound(max_connections)
        self.closed_slow = _Tally("http_slow_clients_closed")
        self.refused = _Tally("http_connections_refused")
        self.accept_failed = _Tally("http_accept_failed")

    def protocol(self) -> type[H11Protocol]:
        """uvicorn's ``http=`` argument: its h11 protocol, bound to these guards."""
        guards = self

        class Guarded(GuardedProtocol):
            _guards = guards

        return Guarded

    def loop_exception_handler(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
        """asyncio reports a failed ``accept()`` (EMFILE, ENFILE, ENOBUFS) through the loop's
        exception handler, with a traceback, each time it retries: counted here instead."""

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            message = str(context.get("message", ""))
            if message.startswith("socket.accept() out of system resource"):
                exc = context.get("exception")
                self.accept_failed.add(error=f"{type(exc).__name__}: {exc}" if exc else message)
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        return handle


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with a read deadline and the connection bound."""

    _guards: ServerGuards

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._flush_deadline: asyncio.TimerHandle | None = None
        self._lost = False
        self._waiting_since = time.monotonic()
        if len(self.connections) >= self._guards.max_connections and not self._evict_one():
            self._guards.refused.add(max_connections=self._guards.max_connections)
            transport.close()
            return
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None and self._waiting_for_request():
            self._arm()  # the first byte of a next request on a kept-alive connection
        super().data_received(data)
        if not self._waiting_for_request():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        for timer in (self._write_deadline, self._flush_deadline):
            if timer is not None:
                timer.cancel()
        self._write_deadline = self._flush_deadline = None
        if self.transport is None:  # refused in connection_made: uvicorn never saw it
            return
        super().connection_lost(exc)

    def _waiting_for_request(self) -> bool:
        """Whether the client owes us (the rest of) a request: nothing read yet, headers in
        part, or a body not yet whole."""
        if self.conn.their_state is h11.SEND_BODY:
            return True
        return self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete
        )

    def on_response_complete(self) -> None:
        self._waiting_since = time.monotonic()  # idle now, under uvicorn's keep-alive timer
        super().on_response_complete()
        # a pipelined next request is read here, not in data_received: its deadline too
        if self._read_deadline is None and self._request_begun() and self._waiting_for_request():
            self._arm()
        # an answer a client does not read may stay buffered under 64 KiB (no pause_writing),
        # and a close (keep-alive's, `Connection: close`'s) waits for it to flush: bounded too
        if self._flush_deadline is not None:  # a fresh look for this answer
            self._flush_deadline.cancel()
        self._flush_deadline = self.loop.call_later(KEEP_ALIVE_GRACE, self._unflushed)

    def pause_writing(self) -> None:
        """The client stopped reading what we send (64 KiB buffered): the same deadline, so a
        client that asks and never reads cannot hold the connection either."""
        super().pause_writing()
        if self._write_deadline is None and not self._lost:
            self._write_deadline = self.loop.call_later(
                self._guards.read_timeout,
                self._not_reading,
                self.transport.get_write_buffer_size(),
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _not_reading(self, before: int) -> None:
        """Still paused a read timeout later: abort unless some of it was read meanwhile (a
        slow download of a large page goes on, as long as it moves)."""
        self._write_deadline = None
        if self._lost:
            return
        left = self.transport.get_write_buffer_size()
        if left < before:
            self._write_deadline = self.loop.call_later(
                self._guards.read_timeout, self._not_reading, left
            )
            return
        # closing or not: a close would wait on the unread bytes for ever
        self._guards.closed_slow.add(reason="the client stopped reading")
        self.transport.abort()

    def _unflushed(self, before: int | None = None) -> None:
        """Abort when bytes are still buffered and none left since the last look: a client
        downloading slowly is given time as long as it reads."""
        self._flush_deadline = None
        if self._lost:
            return
        left = self.transport.get_write_buffer_size()
        if not left:
            return
        if before is None or left < before:
            self._flush_deadline = self.loop.call_later(
                self._guards.read_timeout, self._unflushed, left
            )
            return
        self._guards.closed_slow.add(reason="the client stopped reading")
        self.transport.abort()

    def _request_begun(self) -> bool:
        """Whether part of a next request is already here (pipelined behind the last one)."""
        return self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])

    def _arm(self) -> None:
        self._disarm()
        self._waiting_since = time.monotonic()
        self._read_deadline = self.loop.call_later(self._guards.read_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _too_slow(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or not self._waiting_for_request():
            return
        self._guards.closed_slow.add(read_timeout_seconds=self._guards.read_timeout)
        # abort, not close: close waits to flush what is buffered, and keeps the descriptor
        self.transport.abort()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for (the rest of) a request, or idled
        longest between requests; False if none is waiting (every one is being answered)."""
        waiting = [
            c
            for c in self.connections
            if isinstance(c, GuardedProtocol)
            and (
                c._waiting_for_request()
                or c._write_deadline is not None
                or c.transport.is_closing()  # closed, its last bytes unread
            )
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c._waiting_since)
        oldest._disarm()
        self._guards.closed_slow.add(reason="connection bound")
        with contextlib.suppress(Exception):
            oldest.transport.abort()
        # connection_lost removes it from the set on the next loop turn; the bound counts it
        # gone now
        self.connections.discard(oldest)
        return True


class QuietServer(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after shutdown (killing us with -15); ``serve`` owns
    the signals instead and exits normally."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
