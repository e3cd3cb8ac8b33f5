"""The platform twin: a database shaped the way spec 000 shapes the podcast platform.

``platform_twin.sql`` is written from spec 000 and nightcrew's contract, not from nightcrew's
reference migrations, so it is an independent oracle for "nightcrew pointed at the platform's
existing PostgreSQL": ``db migrate --skip-reference``, ``db check``, the lanes, ``serve``.

    create_twin(admin_url, "twin")                # CREATE DATABASE twin; load the platform
    create_twin(admin_url, "twin", migrate=True)  # … then `nightcrew db migrate --skip-reference`

The commands run as the installed console script, in an environment that carries none of the
developer's nightcrew settings (only what the caller passes, plus NIGHTCREW_DATA_DIR).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from nightcrew.db.connection import with_dbname
from tests.acceptance.test_cli import _env, _nightcrew

TWIN_SQL = Path(__file__).with_name("platform_twin.sql")

# The platform's schemas: nightcrew must create nothing in them.
PLATFORM_SCHEMAS = ("public", "auth")

# A command inherits none of the caller's nightcrew settings but the session's data directory:
# the acceptance tests' rule and helpers, one copy of them.
nightcrew_command = _nightcrew
command_env = _env


def run_nightcrew(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nightcrew_command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def admin(admin_url: str, sql: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql)


def load_twin(url: str) -> None:
    """Load the platform's schema into an existing, empty database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TWIN_SQL.read_text(encoding="utf-8"))


def migrate_skip_reference(url: str) -> dict[str, Any]:
    """`nightcrew db migrate --skip-reference --json` on ``url``; its JSON result."""
    result = run_nightcrew(
        "db", "migrate", "--skip-reference", "--json", env=command_env(DATABASE_URL=url)
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"`nightcrew db migrate --skip-reference` exited {result.returncode} on the "
            f"platform twin:\n{result.stderr.strip()}"
        )
    return dict(json.loads(result.stdout))


def create_twin(admin_url: str, name: str, *, migrate: bool = False) -> str:
    """CREATE DATABASE ``name`` (replacing one of that name) and load the platform into it;
    with ``migrate``, then install nightcrew's own schema the production way. Its URL."""
    admin(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin(admin_url, f"CREATE DATABASE {name}")
    url = with_dbname(admin_url, name)
    load_twin(url)
    if migrate:
        migrate_skip_reference(url)
    return url


def clone_database(admin_url: str, template: str, name: str) -> str:
    admin(admin_url, f"CREATE DATABASE {name} TEMPLATE {template}")
    return with_dbname(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    admin(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# Every object of the platform's schemas, with what defines it (a changed function body or
# trigger definition shows, not only an added or dropped name).
_CATALOG: dict[str, str] = {
    "relations": """
        SELECT n.nspname || '.' || c.relname, c.relkind::text, c.relrowsecurity::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
    "columns": """
        SELECT a.attrelid::regclass::text, a.attnum::text, a.attname,
               format_type(a.atttypid, a.atttypmod), a.attnotnull::text,
               coalesce(pg_get_expr(d.adbin, d.adrelid), '')
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = ANY(%(schemas)s) AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """
        SELECT schemaname || '.' || indexname, indexdef
          FROM pg_indexes WHERE schemaname = ANY(%(schemas)s)""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
    "functions": """
        SELECT n.nspname || '.' || p.proname, pg_get_function_identity_arguments(p.oid),
               coalesce(pg_get_function_result(p.oid), ''), md5(p.prosrc),
               p.provolatile::text, p.prosecdef::text, coalesce(p.proconfig::text, '')
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, t.tgenabled::text, pg_get_triggerdef(t.oid)
          FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s) AND NOT t.tgisinternal""",
    "policies": """
        SELECT schemaname || '.' || tablename, policyname, coalesce(qual, ''),
               coalesce(with_check, '')
          FROM pg_policies WHERE schemaname = ANY(%(schemas)s)""",
    "types": """
        SELECT n.nspname || '.' || t.typname, t.typtype::text
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = ANY(%(schemas)s) AND t.typrelid = 0 AND t.typelem = 0""",
}


def platform_catalog(url: str) -> dict[str, list[tuple[str, ...]]]:
    """Every table, column, index, constraint, function, trigger, policy and type in the
    platform's schemas, sorted: two snapshots are equal iff nothing there changed."""
    out: dict[str, list[tuple[str, ...]]] = {}
    with psycopg.connect(url) as conn:
        for kind, sql in _CATALOG.items():
            rows = conn.execute(sql, {"schemas": list(PLATFORM_SCHEMAS)}).fetchall()
            out[kind] = sorted(tuple(str(v) for v in row) for row in rows)
    return out
