"""`nightcrew serve`'s dashboard rules at the command line: nothing starts that would expose
the page to the network without a token, nor a demo dashboard without a demo."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_cli import _env, run

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_serve_beyond_loopback_refuses_to_start_without_a_token(
    fresh_db_url: str, host: str
) -> None:
    # refused before anything binds or connects: the address is never listened on
    result = run("serve", "--host", host, "--port", "9", env=_env(DATABASE_URL=fresh_db_url))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NIGHTCREW_DASHBOARD_TOKEN" in lines[0] and host in lines[0]


def test_serve_demo_without_a_demo_says_to_run_it(tmp_path: Path) -> None:
    env = _env(NIGHTCREW_DATA_DIR=str(tmp_path / "data"))
    result = run("serve", "--demo", "--port", "9", env=env, timeout=180)
    assert result.returncode == 2, result.stderr
    assert "run `nightcrew demo` first" in result.stderr.strip().splitlines()[-1]


def test_a_database_never_migrated_says_to_migrate(empty_db_url: str) -> None:
    result = run("lifecycle", "run", "minute", env=_env(DATABASE_URL=empty_db_url))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run `nightcrew db migrate` first" in lines[0], result.stderr
