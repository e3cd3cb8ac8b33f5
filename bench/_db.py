"""What benchmarks share: their PostgreSQL (DATABASE_URL when it answers, else pgserver)
and the process-memory figures they report."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from nightcrew.db.connection import with_dbname


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


def proc_kib(field: str) -> int:
    """A /proc/self/status figure in KiB (VmRSS, VmHWM); 0 where there is no /proc."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS, so a peak measures one phase; False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def recreate(url: str, name: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return with_dbname(url, name)


def drop(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
