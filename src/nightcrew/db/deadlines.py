"""A statement's deadline on our side: a server that accepts bytes and never answers (frozen,
or a stuck proxy in between) is seen by no TCP timeout and no server-side one, so each statement
is bounded here, and a connection that outlives its bound has its socket ended."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from contextvars import ContextVar

import psycopg
from psycopg.rows import DictRow

# The statement deadline of the work running in this task and the tasks it starts (seconds,
# None: the pool's). A role whose statements are all short (the minute lane) gives up on a
# silent server sooner than the pool's default. A ContextVar rather than a second pool: the
# pool, and every adapter that holds it (the queue producer), is shared with the daily lane.
_ROLE_DEADLINE: ContextVar[float | None] = ContextVar("nightcrew_db_deadline", default=None)


@contextlib.contextmanager
def statement_deadline(seconds: float | None) -> Iterator[None]:
    """Inside this block (and in the tasks it starts) no statement, commit or pool checkout
    waits on PostgreSQL longer than ``seconds`` (None or 0: no change); past it the database
    counts as lost. Nested blocks keep the shorter bound."""
    outer = _ROLE_DEADLINE.get()
    bound = seconds if seconds else None
    if outer is not None and bound is not None:
        bound = min(outer, bound)
    token = _ROLE_DEADLINE.set(bound if bound is not None else outer)
    try:
        yield
    finally:
        _ROLE_DEADLINE.reset(token)


def role_bound(deadline: float | None) -> float | None:
    role = _ROLE_DEADLINE.get()
    if role is None:
        return deadline
    return role if deadline is None else min(deadline, role)


class Severer:
    """Ends a connection whose statement outlives its deadline by shutting down its socket.

    Cancelling the awaiting task instead would make psycopg send a cancel request and wait for
    the query to end (5 + 5 s) on the very server that stopped answering; with the socket shut
    down, the pending read sees end-of-file at once and psycopg fails the statement as a lost
    connection. The file descriptor stays open (psycopg still watches it); only the TCP (or
    Unix) stream is ended."""

    def __init__(self, conn: psycopg.AsyncConnection[DictRow], deadline: float | None) -> None:
        self._conn = conn
        self.deadline = deadline
        self.severed = False
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self.deadline is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.deadline, self._sever)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sever(self) -> None:
        self._timer = None
        self.severed = True
        with contextlib.suppress(Exception):  # closed already, or no socket: nothing to end
            fd = self._conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)


# After the severed socket, how long the statement may take to notice before the task itself
# is cancelled (it normally notices at once).
SEVER_GRACE = 5.0
