"""How nightcrew connects to PostgreSQL: the connection policy (timeouts, keepalives, the
secrets kept out of stored text) and the first connection, which says in one line why it
failed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from nightcrew.errors import DatabaseUnavailableError

# a refused statement's error lives with the other errors (the command line catches it without
# importing the driver); importers of the database keep finding it here
from nightcrew.errors import QueryError as QueryError


def with_dbname(url: str, dbname: str) -> str:
    """The same server URL, another database."""
    return urlunsplit(urlsplit(url)._replace(path="/" + dbname))


def describe_target(conninfo: str) -> str:
    """``host:port/dbname`` for messages: never the user's password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparseable DATABASE_URL>"
    host = str(parts.get("host") or parts.get("hostaddr") or "localhost")
    port = str(parts.get("port") or "5432")
    dbname = str(parts.get("dbname") or parts.get("user") or "")
    where = host if host.startswith("/") else f"{host}:{port}"
    return f"{where}/{dbname}" if dbname else where


STORED_SECRET_MIN = 16


@dataclass(frozen=True, kw_only=True)
class ConnectionPolicy:
    """How long nightcrew waits on PostgreSQL before it calls it lost (the NIGHTCREW_DB_*
    settings). Keepalives find a dead peer on an idle connection; ``tcp_user_timeout`` finds
    one that swallows what we send (a partition); the statement and idle-in-transaction
    timeouts bound a server that answers but never finishes; ``pool_timeout`` bounds the wait
    for a connection. A connection is checked before it is handed out."""

    connect_timeout: float = 5.0
    pool_timeout: float = 10.0
    max_size: int = 10
    keepalives_idle: int = 10
    keepalives_interval: int = 5
    keepalives_count: int = 3
    tcp_user_timeout: float = 15.0
    statement_timeout: float = 120.0
    idle_in_transaction_timeout: float = 60.0
    # every configured secret's value: replaced in any text a statement is given to store (an
    # upstream that echoes a key into its error, then into effects.last_error or a report)
    secrets: tuple[str, ...] = ()

    def deadline(self, statement_timeout: float | None = None) -> float | None:
        """Our side's bound on one statement: the server's timeout, plus the time TCP takes
        to give up on a dead peer; None when the statement timeout is 0 (none)."""
        seconds = self.statement_timeout if statement_timeout is None else statement_timeout
        return seconds + max(self.tcp_user_timeout, 5.0) if seconds > 0 else None

    def connection_kwargs(self, url_options: str = "") -> dict[str, Any]:
        """libpq keywords; ``url_options`` (DATABASE_URL's own ``options``) are kept, ours
        after them. (PgBouncer refuses ``options`` unless ``ignore_startup_parameters`` lists
        it: set the timeouts on the role there instead.)"""
        options = (
            f"{url_options} -c statement_timeout={round(self.statement_timeout * 1000)}"
            f" -c idle_in_transaction_session_timeout="
            f"{round(self.idle_in_transaction_timeout * 1000)}"
        ).strip()
        return {
            "connect_timeout": max(1, round(self.connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle,
            "keepalives_interval": self.keepalives_interval,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": round(self.tcp_user_timeout * 1000),
            "options": options,
        }


# How libpq quotes the server's own refusal of a connection (FATAL:  role "x" does not exist).
_SERVER_REFUSAL = re.compile(r"\b(?:FATAL|PANIC|ERROR):\s+(?P<message>[^\n]+)")


async def preflight(conninfo: str, target: str, connect_timeout: float) -> None:
    """Connect once directly, so an unreachable server yields its real reason in one line."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        # libpq's own message would quote the offending part, which may be the password.
        raise DatabaseUnavailableError(
            "DATABASE_URL is not a valid PostgreSQL URL (is a special character in the "
            "password percent-encoded?)"
        ) from None
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, connect_timeout=max(1, round(connect_timeout))
        )
    except psycopg.Error as exc:
        password = parts.get("password")

        def scrub(text: str) -> str:
            return text.replace(str(password), "[redacted]") if password else text

        # A server that answered is reachable: "cannot reach" would send the operator to the
        # network when the fix is a role, a password or a database name. (With several
        # addresses to try, libpq lists each attempt; one that got an answer tells.)
        answered = _SERVER_REFUSAL.search(str(exc))
        if answered is not None:
            raise DatabaseUnavailableError(
                f"PostgreSQL at {target} refused the connection: {scrub(answered['message'])}"
            ) from exc
        reason = scrub(first_line(exc))
        raise DatabaseUnavailableError(f"cannot reach PostgreSQL at {target}: {reason}") from exc
    await conn.close()


def url_options(conninfo: str) -> str:
    try:
        return str(conninfo_to_dict(conninfo).get("options") or "")
    except psycopg.ProgrammingError:
        return ""


def first_line(exc: BaseException) -> str:
    """libpq puts the cause first and a hint ("Is the server running…") after it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
