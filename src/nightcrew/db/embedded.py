"""The embedded PostgreSQL (pgserver) used when DATABASE_URL is unset.

The cluster lives in ``$NIGHTCREW_DATA_DIR/pg`` and is reused on the next start; it is stopped
when the last nightcrew process using it exits.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from nightcrew.db.connection import with_dbname
from nightcrew.errors import DatabaseUnavailableError


class EmbeddedPostgres:
    def __init__(self, server: Any, pgdata: Path) -> None:
        self._server = server
        self.pgdata = pgdata

    @classmethod
    def start(cls, pgdata: Path) -> EmbeddedPostgres:
        # pgserver narrates every step at INFO through the root logger; our events are enough.
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        pgdata = pgdata.expanduser().resolve()
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its /tmp
                # fallback is fine for pgserver's lock file.
                warnings.simplefilter("ignore")
                from pgserver import get_server  # type: ignore[attr-defined]

                pgdata.parent.mkdir(parents=True, exist_ok=True)
                server = get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:
            raise DatabaseUnavailableError(
                f"cannot start the embedded PostgreSQL in {pgdata}: {exc}"
            ) from exc
        return cls(server, pgdata)

    @property
    def uri(self) -> str:
        return str(self._server.get_uri())

    def stop(self) -> None:
        self._server.cleanup()

    def database(self, name: str, *, fresh: bool) -> str | None:
        """The URL of the server's database ``name``: made anew (dropped first, its sessions
        ended) when ``fresh``, else the one there — None when there is none."""
        with psycopg.connect(self.uri, autocommit=True) as admin:
            if fresh:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            elif (
                admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
                is None
            ):
                return None
        return with_dbname(self.uri, name)
