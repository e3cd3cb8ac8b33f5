"""The test suite's own servers clean up after themselves."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.support.servers import embedded_postgres


def test_the_embedded_test_server_leaves_no_directory_behind(tmp_path: Path) -> None:
    with embedded_postgres(parent=tmp_path) as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        [home] = tmp_path.iterdir()
        assert home.name.startswith("nightcrew-test-pg-")
    assert list(tmp_path.iterdir()) == []
