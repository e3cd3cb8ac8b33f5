"""Where benchmarks get their PostgreSQL: DATABASE_URL when it answers, else pgserver."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg


@contextmanager
def admin_url() -> Iterator[str]:
    url = os.environ.get("NIGHTCREW_BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url:
        with psycopg.connect(url, connect_timeout=3):
            pass
        yield url
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver import get_server

        server = get_server(
            Path(tempfile.mkdtemp(prefix="nightcrew-bench-")) / "pg", cleanup_mode="delete"
        )
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + dbname))


def recreate(url: str, name: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return with_dbname(url, name)


def drop(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
