"""The connection pool, behind a small API that speaks dicts and nightcrew's errors.

Jobs never import psycopg: they call ``fetch`` / ``execute`` on a ``Database`` or on the ``Tx``
that ``transaction()`` yields, and get ``QueryError`` (with its SQLSTATE) when PostgreSQL refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from typing import Any, LiteralString, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.rows import BaseRowFactory, DictRow, dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from nightcrew.db.connection import (
    STORED_SECRET_MIN,
    ConnectionPolicy,
    describe_target,
    first_line,
    preflight,
    url_options,
)
from nightcrew.db.deadlines import SEVER_GRACE, Severer, role_bound
from nightcrew.db.records import R, answers_rows, record_row
from nightcrew.errors import DatabaseUnavailableError

# a refused statement's error lives with the other errors (the command line catches it without
# importing the driver); importers of the database keep finding it here
from nightcrew.errors import QueryError as QueryError
from nightcrew.log import SecretValues

Row = dict[str, Any]
Params = Mapping[str, Any] | None
V = TypeVar("V")
T = TypeVar("T")  # a row, as a row factory makes it


def _of_kind(kind: type[V], value: object, query: LiteralString) -> V:
    # a bool is an int to isinstance: a count or an id that came back true is a mistake
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        first_line = query.strip().splitlines()[0] if query.strip() else query
        raise TypeError(
            f"expected {kind.__name__} in the first column, got {value!r} ({first_line})"
        )
    return value


def json_param(value: Any) -> Jsonb:
    """Wrap a value for a ``jsonb`` parameter."""
    return Jsonb(value)


# SQLSTATEs that mean the connection, not the statement, failed: class 08 (connection
# exception), and the server ending the session (pg_terminate_backend, shutdown, recovery; its
# idle-in-transaction, transaction and idle-session timeouts — a client whose statements a
# silent network held past them gets these, through no fault of the statement).
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03", "57P05", "25P03", "25P04")


def _translate(
    exc: psycopg.Error, target: str = "the database"
) -> QueryError | DatabaseUnavailableError:
    """A refused statement is a QueryError; a lost connection (reset, terminated, timed out by
    TCP) is DatabaseUnavailableError — which per-item error handling must not swallow."""
    sqlstate = exc.sqlstate
    lost = (
        sqlstate.startswith(_CONNECTION_LOST)
        if sqlstate is not None
        else isinstance(exc, psycopg.OperationalError)  # no SQLSTATE: libpq's own failure
    )
    if lost:
        return DatabaseUnavailableError(f"lost PostgreSQL at {target}: {first_line(exc)}")
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    return QueryError(primary or str(exc).strip() or type(exc).__name__, sqlstate=sqlstate)


def _without_secrets(value: Any, secrets: SecretValues) -> Any:
    """``value`` with every secret's value replaced in its strings, the containers' types kept
    (a list is an array to psycopg, a tuple is not)."""
    if isinstance(value, str):
        return secrets.redact(value)
    if isinstance(value, Jsonb):
        return Jsonb(_without_secrets(value.obj, secrets))
    if isinstance(value, dict):
        return {k: _without_secrets(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_secrets(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(_without_secrets(v, secrets) for v in value)
    return value


class _Executor:
    """fetch/execute over one psycopg connection, translating its errors.

    ``deadline`` (seconds) bounds each statement on our side too: a server that accepts bytes
    and never answers (frozen, or a stuck proxy in between) is seen by no TCP timeout and no
    server-side one. Past it the connection is ended (see ``Severer``) and the database counts
    as lost. A ``statement_deadline`` block around the work can only shorten it."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[DictRow],
        *,
        target: str = "the database",
        deadline: float | None = None,
        secrets: SecretValues | None = None,
    ) -> None:
        self._conn = conn
        self._target = target
        self._deadline = deadline
        self._secrets = secrets

    def _params(self, params: Params) -> Params:
        if not self._secrets or params is None:
            return params
        return _without_secrets(params, self._secrets)  # type: ignore[no-any-return]

    async def _rows(
        self, query: LiteralString, params: Params, row_factory: BaseRowFactory[T]
    ) -> list[T]:
        """Every row of the query's answer, each made by ``row_factory`` (none for a statement
        that answers no rows): the one read that ``Database`` and its views route to a
        connection of their own."""
        async with self._bounded():
            cur = self._conn.cursor(row_factory=row_factory)
            await cur.execute(query, self._params(params))
            return await cur.fetchall() if answers_rows(cur) else []

    async def fetch(self, query: LiteralString, params: Params = None) -> list[Row]:
        return await self._rows(query, params, dict_row)

    async def fetch_one(self, query: LiteralString, params: Params = None) -> Row | None:
        rows = await self.fetch(query, params)
        return rows[0] if rows else None

    async def fetch_as(
        self, record: type[R], query: LiteralString, params: Params = None
    ) -> list[R]:
        """Each row as ``record`` (``db/records.py``)."""
        return await self._rows(query, params, record_row(record))

    async def fetch_one_as(
        self, record: type[R], query: LiteralString, params: Params = None
    ) -> R | None:
        records = await self.fetch_as(record, query, params)
        return records[0] if records else None

    async def fetch_values(
        self, kind: type[V], query: LiteralString, params: Params = None
    ) -> list[V]:
        """The first column of each row, each a ``kind`` (``TypeError`` otherwise, NULL too):
        a query that answers one column needs no record."""
        return [_of_kind(kind, value, query) for value in await self._first_column(query, params)]

    async def fetch_value(
        self, kind: type[V], query: LiteralString, params: Params = None
    ) -> V | None:
        """The first column of the first row, a ``kind``; None when no row, or NULL."""
        values = await self._first_column(query, params)
        value = values[0] if values else None
        return None if value is None else _of_kind(kind, value, query)

    async def fetch_count(self, query: LiteralString, params: Params = None) -> int:
        """The answer of a ``SELECT count(*) …`` (0 when it answers no row)."""
        return await self.fetch_value(int, query, params) or 0

    async def _first_column(self, query: LiteralString, params: Params) -> list[Any]:
        # by position, not through a dict: two columns of one name would keep the last one
        return [row[0] for row in await self._rows(query, params, tuple_row)]

    async def execute(self, query: LiteralString, params: Params = None) -> int:
        """Run a statement; returns the number of rows it touched."""
        async with self._bounded():
            cur = await self._conn.execute(query, self._params(params))
            return cur.rowcount

    def _severer(self) -> Severer:
        return Severer(self._conn, role_bound(self._deadline))

    @asynccontextmanager
    async def _bounded(self) -> AsyncIterator[None]:
        severer = self._severer()
        severer.arm()
        try:
            backstop = None if severer.deadline is None else severer.deadline + SEVER_GRACE
            async with asyncio.timeout(backstop):
                yield
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self._conn.close()
            raise self._no_reply(severer) from None
        except psycopg.Error as exc:
            if severer.severed:
                raise self._no_reply(severer) from None
            raise _translate(exc, self._target) from exc
        finally:
            severer.disarm()

    def _no_reply(self, severer: Severer) -> DatabaseUnavailableError:
        return DatabaseUnavailableError(
            f"lost PostgreSQL at {self._target}: no reply within {severer.deadline:g} s",
            silent=True,
        )


class Tx(_Executor):
    """Statements on one connection: a transaction's, or a session's (temp tables, COPY)."""

    async def stream(
        self, query: LiteralString, params: Params = None, *, batch: int = 1000
    ) -> AsyncIterator[list[Row]]:
        """Rows in batches through a server-side cursor: memory holds one batch, not the result."""
        try:
            async with self._conn.transaction():
                async with self._conn.cursor(name="nightcrew_stream") as cur:
                    await cur.execute(query, self._params(params))
                    while rows := await cur.fetchmany(batch):
                        yield [dict(row) for row in rows]
        except psycopg.Error as exc:
            raise _translate(exc) from exc

    async def copy_in_batches(
        self, statement: LiteralString, batches: AsyncIterator[Iterable[Sequence[Any]]]
    ) -> int:
        """One COPY fed batch by batch as they arrive (a listing page at a time)."""
        count = 0
        try:
            async with self._conn.cursor() as cur, cur.copy(statement) as copy:
                async for rows in batches:
                    for row in rows:
                        await copy.write_row(row)
                        count += 1
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        return count


class Database(_Executor):
    """A psycopg async pool. Plain calls autocommit; ``transaction()`` groups statements."""

    def __init__(
        self,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[DictRow]],
        target: str,
        policy: ConnectionPolicy | None = None,
    ):
        self._pool = pool
        self.target = target
        self._returning: set[asyncio.Future[None]] = set()
        self._policy = policy or ConnectionPolicy()
        # not a short one: a DATABASE_URL password "postgres" would take that word out of every
        # article stored; a secret worth the name is longer (the guarded doors ask for 32)
        self._secrets = SecretValues(self._policy.secrets, shortest=STORED_SECRET_MIN)

    def _executor(self, conn: psycopg.AsyncConnection[DictRow]) -> Tx:
        return Tx(conn, target=self.target, deadline=self._policy.deadline(), secrets=self._secrets)

    @classmethod
    async def open(
        cls,
        conninfo: str,
        *,
        connect_timeout: float = 5.0,
        max_size: int = 10,
        policy: ConnectionPolicy | None = None,
    ) -> Database:
        policy = policy or ConnectionPolicy(connect_timeout=connect_timeout, max_size=max_size)
        target = describe_target(conninfo)
        await preflight(conninfo, target, policy.connect_timeout)
        pool: AsyncConnectionPool[psycopg.AsyncConnection[DictRow]] = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=policy.max_size,
            open=False,
            timeout=policy.pool_timeout,
            # a connection the server dropped while it sat in the pool is found here, not by
            # the statement that would have used it
            check=_checker(policy.connect_timeout, lambda: pool),
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "application_name": "nightcrew",
                **policy.connection_kwargs(url_options(conninfo)),
            },
            connection_class=psycopg.AsyncConnection[DictRow],
            name="nightcrew",
        )
        connect_timeout = policy.connect_timeout
        try:
            await pool.open(wait=True, timeout=connect_timeout)
        except Exception as exc:
            await pool.close()
            raise DatabaseUnavailableError(
                f"cannot reach PostgreSQL at {target}: {type(exc).__name__}"
            ) from exc
        return cls(pool, target, policy)

    async def close(self) -> None:
        await self._pool.close()
        # connections on their way back (a cancelled caller's): closed by the closed pool
        await asyncio.gather(*self._returning, return_exceptions=True)

    @asynccontextmanager
    async def _acquire(self) -> AsyncIterator[psycopg.AsyncConnection[DictRow]]:
        """A pooled connection; failing to get one is "database unavailable", one line."""
        timeout = role_bound(self._policy.pool_timeout)
        try:
            conn = await self._checkout(timeout)
            try:
                async with conn:  # commit or roll back, as the pool's own context does
                    yield conn
            finally:
                # shielded too: a caller cancelled while the pool takes it back would lose it
                await asyncio.shield(self._put_back(conn))
        except PoolTimeout as exc:
            raise DatabaseUnavailableError(
                f"lost PostgreSQL at {self.target}: no connection within {timeout:g} s",
                silent=True,
            ) from exc
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"lost PostgreSQL at {self.target}: {first_line(exc)}"
            ) from exc

    async def _checkout(self, wait_seconds: float | None) -> psycopg.AsyncConnection[DictRow]:
        """A connection from the pool, waited for in a task of its own that a cancelled caller
        does not cancel: psycopg_pool 3.3 can lose a connection to a waiter cancelled as it is
        handed one (psycopg#1345, #1401), and a flood of probes that time out cancelled
        thousands (the pool stayed empty until a restart). What a cancelled caller's checkout
        gets later goes straight back."""
        checkout = asyncio.ensure_future(self._pool.getconn(timeout=wait_seconds))
        try:
            return await asyncio.shield(checkout)
        except asyncio.CancelledError:
            checkout.add_done_callback(self._give_back)
            raise

    def _give_back(self, checkout: asyncio.Future[psycopg.AsyncConnection[DictRow]]) -> None:
        if checkout.cancelled() or checkout.exception() is not None:
            return
        self._put_back(checkout.result())

    def _put_back(self, conn: psycopg.AsyncConnection[DictRow]) -> asyncio.Future[None]:
        returning = asyncio.ensure_future(self._pool.putconn(conn))
        self._returning.add(returning)  # held until done: a task nobody holds may be collected
        returning.add_done_callback(self._returning.discard)
        return returning

    @asynccontextmanager
    async def _dedicated(self) -> AsyncIterator[psycopg.AsyncConnection[DictRow]]:
        """A connection of its own, made as the pool makes its, closed afterwards."""
        try:
            conn = await self._pool.connection_class.connect(
                str(self._pool.conninfo), **cast("dict[str, Any]", self._pool.kwargs)
            )
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"lost PostgreSQL at {self.target}: {first_line(exc)}"
            ) from exc
        try:
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    async def _rows(
        self, query: LiteralString, params: Params, row_factory: BaseRowFactory[T]
    ) -> list[T]:
        async with self._acquire() as conn:
            return await self._executor(conn)._rows(query, params, row_factory)

    async def execute(self, query: LiteralString, params: Params = None) -> int:
        async with self._acquire() as conn:
            return await self._executor(conn).execute(query, params)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._acquire() as conn:
            executor = self._executor(conn)
            # BEGIN and COMMIT wait on the server as much as a statement does: the same bound
            severer = executor._severer()
            severer.arm()
            try:
                async with conn.transaction():
                    severer.disarm()
                    try:
                        yield executor
                    finally:
                        severer.arm()
            except psycopg.Error as exc:
                if severer.severed:
                    raise executor._no_reply(severer) from None
                raise _translate(exc, self.target) from exc
            finally:
                severer.disarm()

    @asynccontextmanager
    async def session(
        self,
        *,
        statement_timeout: float | None = None,
        settings: Mapping[str, str] | None = None,
        discard: bool = False,
    ) -> AsyncIterator[Tx]:
        """One dedicated connection in autocommit mode (session-level locks, DDL batches, the
        reconciler's COPY and joins). ``statement_timeout`` (seconds, 0 = none) replaces the
        pool's for this session's long work; ``settings`` are server settings for this session
        only (``temp_buffers`` among them must come before any temp table); with ``discard``
        the session has a connection of its own, outside the pool, closed afterwards with
        whatever memory and settings it made its backend keep."""
        async with self._dedicated() if discard else self._acquire() as conn:
            executor = self._executor(conn)
            deadline = self._policy.deadline(statement_timeout)
            try:  # from the first setting on: one refused half way is reset like the rest
                if statement_timeout is not None:
                    # long work may also sit inside a transaction between batches (a stream's
                    # cursor while the store answers): the same bound for both
                    await executor.execute(
                        "SELECT set_config('statement_timeout', %(ms)s, false),"
                        " set_config('idle_in_transaction_session_timeout', %(ms)s, false)",
                        {"ms": str(round(statement_timeout * 1000))},
                    )
                for name, value in (settings or {}).items():
                    await executor.execute(
                        "SELECT set_config(%(name)s, %(value)s, false)",
                        {"name": name, "value": value},
                    )
                yield Tx(conn, target=self.target, deadline=deadline, secrets=self._secrets)
            finally:
                if not discard and not conn.closed:
                    names = [*(settings or {})]
                    if statement_timeout is not None:
                        names += ["statement_timeout", "idle_in_transaction_session_timeout"]
                    await _reset_settings(conn, names)

    def rollback_only(self) -> Database:
        """A view of this database in which every statement runs and is then rolled back.

        Dry runs execute the very same claims as a real run, so their report is exactly what
        a run would do, yet nothing they touch survives: each statement (or each
        ``transaction()`` block) ends in ROLLBACK. Transactional side effects such as NOTIFY
        are discarded with it.
        """
        return _RollbackDatabase(self._pool, self.target, self._policy)


class _RollbackDatabase(Database):
    async def _rows(
        self, query: LiteralString, params: Params, row_factory: BaseRowFactory[T]
    ) -> list[T]:
        async with self.transaction() as tx:
            return await tx._rows(query, params, row_factory)

    async def execute(self, query: LiteralString, params: Params = None) -> int:
        async with self.transaction() as tx:
            return await tx.execute(query, params)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._acquire() as conn, self.transaction_on(conn) as tx:
            yield tx

    @asynccontextmanager
    async def transaction_on(self, conn: psycopg.AsyncConnection[DictRow]) -> AsyncIterator[Tx]:
        """A transaction on ``conn`` that always ends in ROLLBACK."""
        try:
            await conn.execute("BEGIN")
            try:
                yield self._executor(conn)
            finally:
                await conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            raise _translate(exc, self.target) from exc

    @asynccontextmanager
    async def session(
        self,
        *,
        statement_timeout: float | None = None,
        settings: Mapping[str, str] | None = None,
        discard: bool = False,
    ) -> AsyncIterator[Tx]:
        # with ``discard`` a connection of its own, as a real session: no pooled backend keeps
        # the memory a big temp table made it allocate
        async with (
            self._dedicated() if discard else self._acquire() as conn,
            self.transaction_on(conn) as tx,
        ):
            if statement_timeout is not None:  # transaction-local: rolled back too
                await tx.execute(
                    "SELECT set_config('statement_timeout', %(ms)s, true)",
                    {"ms": str(round(statement_timeout * 1000))},
                )
            for name, value in (settings or {}).items():
                await tx.execute(
                    "SELECT set_config(%(name)s, %(value)s, true)", {"name": name, "value": value}
                )
            yield tx

    async def close(self) -> None:
        """The pool belongs to the Database this view was made from."""


async def _reset_settings(conn: psycopg.AsyncConnection[DictRow], names: list[str]) -> None:
    """Each of a session's settings back to the connection's own before the pool lends it
    again. A connection that cannot be reset — a RESET refused, or the caller cancelled
    meanwhile — is closed instead, and the pool replaces it: no borrower gets another
    session's settings."""
    try:
        for name in names:
            await conn.execute(sql.SQL("RESET {}").format(sql.Identifier(name)))
    except BaseException as exc:
        await conn.close()
        if not isinstance(exc, psycopg.Error):
            raise  # a cancellation goes on; a refusal is not the caller's error


def _checker(
    timeout: float, pool: Callable[[], AsyncConnectionPool[psycopg.AsyncConnection[DictRow]]]
) -> Callable[[psycopg.AsyncConnection[DictRow]], Awaitable[None]]:
    """The pool's check on checkout, bounded (a silent server must not hang the checkout).
    When it fails and the server does answer a fresh connection, the server has ended our
    sessions (a restart, a failover, pg_terminate_backend): every idle connection is dead, and
    the pool checks them all at once rather than discarding one per checkout, which outlasts
    the pool timeout. While the server is away nothing more is tried: the pool's own reconnect
    backoff is not to be stretched by purges that cannot succeed."""
    purging: set[asyncio.Task[None]] = set()

    async def purge_if_back() -> None:
        the_pool = pool()
        kwargs = the_pool.kwargs if isinstance(the_pool.kwargs, dict) else {}
        conninfo = the_pool.conninfo if isinstance(the_pool.conninfo, str) else ""
        try:
            probe = await psycopg.AsyncConnection.connect(
                conninfo, **{**kwargs, "connect_timeout": max(1, round(timeout))}
            )
        except Exception:  # away: the pool's own reconnects handle it
            return
        await probe.close()
        await the_pool.check()

    async def check(conn: psycopg.AsyncConnection[DictRow]) -> None:
        # severed, not cancelled, past its bound: a cancelled check would make psycopg wait
        # another 10 s on the silent server (see Severer)
        severer = Severer(conn, timeout)
        severer.arm()
        try:
            async with asyncio.timeout(timeout + SEVER_GRACE):
                await AsyncConnectionPool.check_connection(conn)
        except BaseException:
            if not purging:
                task = asyncio.create_task(purge_if_back())
                purging.add(task)
                task.add_done_callback(purging.discard)
            raise
        finally:
            severer.disarm()

    return check
