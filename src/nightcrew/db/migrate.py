"""Numbered ``.sql`` migrations, each applied once, under a lock so two migrators cannot race.

Each file starts with ``-- nightcrew:scope reference`` (the platform's reference schema, for
development and tests) or ``-- nightcrew:scope nightcrew`` (nightcrew's own tables, needed
everywhere). Against a production platform database, ``--skip-reference`` applies only the
latter and ``db check`` verifies the former.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

from nightcrew.db.database import Database, QueryError, Tx
from nightcrew.errors import MigrationError
from nightcrew.jsonable import Jsonable, named

Scope = Literal["reference", "nightcrew"]

# pg_advisory_lock key: any constant works as long as every migrator uses the same one.
MIGRATION_LOCK_KEY = 0x6E6967687463  # "nightc"

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
_SCOPE = re.compile(r"^--\s*nightcrew:scope\s+(?P<scope>reference|nightcrew)\s*$", re.M)

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS nightcrew;
CREATE TABLE IF NOT EXISTS nightcrew.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    scope      text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Migration:
    version: int
    name: str
    scope: Scope
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class MigrationResult(Jsonable):
    applied: list[str] = field(default_factory=list)
    already_applied: list[str] = named("already_applied", default_factory=list)
    skipped: list[str] = field(default_factory=list)


def discover_migrations() -> list[Migration]:
    found: list[Migration] = []
    for entry in resources.files("nightcrew.db.migrations").iterdir():
        match = _FILE.match(entry.name)
        if match is None:
            continue
        sql = entry.read_text(encoding="utf-8")
        scope = _SCOPE.search(sql)
        if scope is None:
            raise MigrationError(f"{entry.name}: missing '-- nightcrew:scope …' header")
        found.append(
            Migration(
                version=int(match["version"]),
                name=match["name"],
                scope=scope["scope"],  # type: ignore[arg-type]
                sql=sql,
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration numbers in {versions}")
    return found


async def applied_migrations(db: Database | Tx) -> dict[int, str]:
    """version → checksum of what the database has applied (empty if never migrated)."""
    table = await db.fetch_value(str, "SELECT to_regclass('nightcrew.schema_migrations')::text")
    if table is None:
        return {}
    applied = await db.fetch_as(
        _Applied, "SELECT version, checksum FROM nightcrew.schema_migrations"
    )
    return {m.version: m.checksum for m in applied}


@dataclass(frozen=True, kw_only=True, slots=True)
class _Applied:
    version: int
    checksum: str


async def migrate(db: Database, *, skip_reference: bool = False) -> MigrationResult:
    migrations = discover_migrations()
    result = MigrationResult()
    # no statement timeout: a migration's DDL may wait on locks and rewrite big tables
    async with db.session(statement_timeout=0) as conn:
        # A session lock, not a transaction lock: each migration commits on its own, and a
        # second migrator waits here, then finds everything applied.
        await conn.execute("SELECT pg_advisory_lock(%(key)s)", {"key": MIGRATION_LOCK_KEY})
        try:
            await conn.execute(_BOOTSTRAP)
            applied = await applied_migrations(conn)
            for migration in migrations:
                if migration.version in applied:
                    if applied[migration.version] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.label} was edited after it was applied; "
                            "add a new migration instead"
                        )
                    result.already_applied.append(migration.label)
                    continue
                if skip_reference and migration.scope == "reference":
                    result.skipped.append(migration.label)
                    continue
                await _apply(conn, migration)
                result.applied.append(migration.label)
        finally:
            # A broken connection has released the session lock already; never let the
            # unlock hide the error that got us here.
            with contextlib.suppress(QueryError):
                await conn.execute(
                    "SELECT pg_advisory_unlock(%(key)s)", {"key": MIGRATION_LOCK_KEY}
                )
    return result


async def _apply(conn: Tx, migration: Migration) -> None:
    try:
        await conn.execute("BEGIN")
        await conn.execute(migration.sql)
        await conn.execute(
            "INSERT INTO nightcrew.schema_migrations (version, name, scope, checksum)"
            " VALUES (%(version)s, %(name)s, %(scope)s, %(checksum)s)",
            {
                "version": migration.version,
                "name": migration.name,
                "scope": migration.scope,
                "checksum": migration.checksum,
            },
        )
        await conn.execute("COMMIT")
    except QueryError as exc:
        with contextlib.suppress(QueryError):
            await conn.execute("ROLLBACK")
        raise MigrationError(
            f"migration {migration.label} failed (SQLSTATE {exc.sqlstate}): {exc}"
        ) from exc
