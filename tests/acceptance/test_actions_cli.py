"""The CLI's half of the dashboard's actions: the same functions, so the same
record — `nightcrew.actions` with source `cli` — and the same rule for an operator's manual
run: refused while a run of its lane is running."""

from __future__ import annotations

import psycopg

from tests.acceptance.test_cli import _env, run


def test_cli_actions_are_recorded_and_a_busy_lane_is_refused(fresh_db_url: str) -> None:
    env = _env(DATABASE_URL=fresh_db_url, NIGHTCREW_LOG_LEVEL="warning")
    with psycopg.connect(fresh_db_url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO news.sources (name, feed_url, shard, parked_at, consecutive_failures)"
            " VALUES ('p', 'https://p.example/f', 'eu', now(), 5) RETURNING id"
        ).fetchone()
        assert row is not None
        enabled = run("news", "sources", "enable", str(row[0]), env=env)
        assert enabled.returncode == 0, enabled.stderr
        assert conn.execute(
            "SELECT source, action, target, ids FROM nightcrew.actions"
        ).fetchall() == [("cli", "news.source_enable", "eu", [str(row[0])])]

        # a run of the minute lane is running (its heartbeat is fresh): `lifecycle run` waits
        # for nothing and doubles nothing — it says which run holds the lane
        conn.execute(
            "INSERT INTO nightcrew.runs (lane, trigger, slot, started_at, heartbeat_at, status)"
            " VALUES ('minute', 'scheduled', date_trunc('minute', now()), now(), now(),"
            " 'running')"
        )
        busy = run("lifecycle", "run", "minute", "--json", env=env)
        assert busy.returncode != 0
        assert "lane minute is running already: run 1 (scheduled" in busy.stderr
        assert conn.execute("SELECT count(*) FROM nightcrew.runs").fetchone() == (1,)
        conn.execute("UPDATE nightcrew.runs SET status = 'completed', finished_at = now()")
        ran = run("lifecycle", "run", "minute", "--json", env=env)
        assert ran.returncode == 0, ran.stderr
        assert conn.execute(
            "SELECT trigger, requested_by, status FROM nightcrew.runs WHERE id = 2"
        ).fetchone() == ("manual", "cli", "completed")
